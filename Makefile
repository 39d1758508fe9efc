# `make demo`: install and run the main job on the built-in digits data: a sweep of CIOSL against
#   the baselines (configs/demo-digits.toml), then the report (results/demo-digits/report.md).
# `make test`: install and run the test suite; `make lint`: ruff on the whole repository;
# `make test-busy`: the suite with two busy-loop processes beside it (a shared machine).
PYTHON ?= python3
PIP = $(PYTHON) -m pip

.PHONY: install data demo test test-busy lint

install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"

# From Debian (optional; needs root): Fashion-MNIST, and headless Chromium with its WebDriver for
# the test that renders the HTML report in a browser. Tests that need them use them when present
# (under CI they never skip).
data:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq || echo "warning: apt-get update failed"; \
	  apt-get install -y -qq dataset-fashion-mnist >/dev/null \
	  || echo "warning: could not install dataset-fashion-mnist"; \
	  apt-get install -y -qq chromium chromium-driver >/dev/null \
	  || echo "warning: could not install chromium chromium-driver"; \
	else echo "not root: skipping apt-get install dataset-fashion-mnist chromium chromium-driver"; fi

demo: install
	ciosl sweep configs/demo-digits.toml
	ciosl report results/demo-digits
	ciosl report results/demo-digits --format html

test: install data
	$(PYTHON) -m pytest

# The suite must pass on a busy machine (CONTRIBUTING.md: tests count work, never time it):
# two processes spinning on the CPU while it runs, stopped whatever the suite's outcome.
test-busy: install data
	@$(PYTHON) -c 'while True: pass' & b1=$$!; $(PYTHON) -c 'while True: pass' & b2=$$!; \
	$(PYTHON) -m pytest; status=$$?; kill $$b1 $$b2; exit $$status

lint:
	$(PYTHON) -m ruff check .
