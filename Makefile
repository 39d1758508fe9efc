# `make demo`: install what the demo needs (torch==2.13.0, then the package without extras) and run
#   the main job on the built-in digits data: a sweep of CIOSL against the baselines
#   (configs/demo-digits.toml), then the report (results/demo-digits/report.md and report.html).
# `make test`: install with the dev extras and run the test suite; `make lint`: ruff on the whole
# repository; `make test-busy`: the suite with two busy-loop processes beside it (a shared machine).
# In a virtual environment: `make demo PYTHON=venv/bin/python` (pip and ciosl run as PYTHON -m).
PYTHON ?= python3
PIP = $(PYTHON) -m pip
CIOSL = $(PYTHON) -m ciosl
TORCH = torch==2.13.0

.PHONY: torch install-demo install data demo test test-busy lint

# PyTorch first, pinned (CPU build): the package then finds its `torch>=2.2` installed.
torch:
	$(PIP) install -q $(TORCH)

# The demo's needs: PyTorch, then the package and its dependencies, no extras (onnx and
# onnxruntime are the [onnx] extra). PyTorch without byte-compiling its ~2,300 modules at
# install (about 20 s of a fresh install): the demo imports a fraction of them, which Python
# compiles when it first imports them.
install-demo:
	$(PIP) install -q --no-compile $(TORCH)
	$(PIP) install -q -e .

# The tests' needs: the dev extras (pytest, hypothesis, ruff, Ray, Selenium, river).
install: torch
	$(PIP) install -q -e ".[dev]"

# From Debian (optional; needs root): Fashion-MNIST, and headless Chromium with its WebDriver for
# the test that renders the HTML report in a browser and the console's tests (tests/serve/
# test_console.py, which fail naming what is missing). Tests that need them use them when present
# (under CI they never skip).
data:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq || echo "warning: apt-get update failed"; \
	  apt-get install -y -qq dataset-fashion-mnist >/dev/null \
	  || echo "warning: could not install dataset-fashion-mnist"; \
	  apt-get install -y -qq chromium chromium-driver >/dev/null \
	  || echo "warning: could not install chromium chromium-driver"; \
	else echo "not root: skipping apt-get install dataset-fashion-mnist chromium chromium-driver"; fi

demo: install-demo
	$(CIOSL) sweep configs/demo-digits.toml
	$(CIOSL) report results/demo-digits
	$(CIOSL) report results/demo-digits --format html

test: install data
	$(PYTHON) -m pytest

# The suite must pass on a busy machine (CONTRIBUTING.md: tests count work, never time it):
# two processes spinning on the CPU while it runs, stopped whatever the suite's outcome.
test-busy: install data
	@$(PYTHON) -c 'while True: pass' & b1=$$!; $(PYTHON) -c 'while True: pass' & b2=$$!; \
	$(PYTHON) -m pytest; status=$$?; kill $$b1 $$b2; exit $$status

lint:
	$(PYTHON) -m ruff check .
