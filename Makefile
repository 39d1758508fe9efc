# `make demo`: install and run the main job on the built-in digits data.
# `make test`: install and run the test suite.
PYTHON ?= python3
PIP = $(PYTHON) -m pip

.PHONY: install data demo test lint

install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"

# Fashion-MNIST from Debian (optional; needs root). Tests that need it use it when present.
data:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
	  || echo "warning: could not install dataset-fashion-mnist"; \
	else echo "not root: skipping apt-get install dataset-fashion-mnist"; fi

demo: install
	ciosl run --dataset digits --ordering class_iid --method ciosl --runs 3 --out results
	ciosl run --dataset digits --ordering class_iid --method slda --runs 3 --out results --quiet
	ciosl run --dataset digits --ordering class_iid --method ncm --runs 3 --out results --quiet
	ciosl run --dataset digits --ordering class_iid --method finetune --runs 3 --out results --quiet

test: install data
	$(PYTHON) -m pytest

lint:
	ruff check src tests
