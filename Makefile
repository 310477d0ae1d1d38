# One command sets everything up and runs the main job (make demo); one sets up and runs the tests (make test).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.fastflip-installed

.PHONY: setup demo test test-fast test-floors docs bench chainer-venv report-deps clean

# The package's extras, less `tensorflow`: this set-up takes the CPU-only build (tensorflow-cpu) instead.
EXTRAS := yaml,numba,torch,dask,parquet,plot,demo,safetensors,progress,transformers,torchao,docs,test,fasthash

$(STAMP): pyproject.toml setup.py ext/_kernels.pyx ext/_lzf.pyx ext/_h5chunks.pyx constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# constraints.txt pins torch to the CPU build this machine has; anything looser can pull a multi-GB CUDA build
	$(PIP) install -q -c constraints.txt torch tensorflow-cpu
	$(PIP) install -q "setuptools>=77" wheel "Cython>=3.0" numpy
	FASTFLIP_REQUIRE_NATIVE=1 $(PIP) install -q -c constraints.txt --no-build-isolation -e ".[$(EXTRAS)]"
	touch $(STAMP)

setup: $(STAMP)

# Chainer 7.8.1 needs numpy<2 and, to build, setuptools<70 without build isolation: its own venv.
.chainer-venv/.stamp:
	$(PYTHON) -m venv .chainer-venv
	.chainer-venv/bin/python -m pip install -q "setuptools<70" wheel "numpy<2" h5py
	.chainer-venv/bin/python -m pip install -q --no-build-isolation chainer==7.8.1
	touch .chainer-venv/.stamp

chainer-venv: .chainer-venv/.stamp

demo: setup
	$(PY) -m fastflip.demo

# The report tests render the page in headless Chromium (Debian's package).
report-deps:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)

test: setup chainer-venv report-deps
	FASTFLIP_CHAINER_PYTHON=$(CURDIR)/.chainer-venv/bin/python FASTFLIP_REQUIRE_EXTRAS=1 $(PY) -m pytest

# The declared floors (pyproject: numpy>=2.0, h5py>=3.11) with no extras at all: the core suite must pass
# there. Only a test that declares its extra (pytest.mark.extra("torch") or require("torch"), tests/conftest.py)
# skips, and says which; any other failure fails (FASTFLIP_REQUIRE_EXTRAS is not set: the extras are absent).
FLOORS := .floors-venv
$(FLOORS)/.stamp: pyproject.toml setup.py ext/_kernels.pyx ext/_lzf.pyx ext/_h5chunks.pyx
	rm -rf $(FLOORS) && $(PYTHON) -m venv $(FLOORS)
	$(FLOORS)/bin/python -m pip install -q "setuptools==77.*" wheel "Cython>=3.0" "numpy==2.0.*" "h5py==3.11.*"
	FASTFLIP_REQUIRE_NATIVE=1 $(FLOORS)/bin/python -m pip install -q --no-build-isolation ".[test]"
	touch $@

# The package is installed again first (not editable): the tests run against this checkout's code.
test-floors: $(FLOORS)/.stamp
	FASTFLIP_REQUIRE_NATIVE=1 $(FLOORS)/bin/python -m pip install -q --no-build-isolation --no-deps .
	$(FLOORS)/bin/python -m pytest -p no:cacheprovider -q -m "not slow" tests

# The reference (numpydoc docstrings) and the guides of docs/, rendered to docs/_build/html; warnings fail.
docs: setup
	rm -rf docs/_build docs/api/generated
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

test-fast: setup
	$(PY) -m pytest -m "not framework and not slow"

# PyTorchFI (side-by-side live-injection benchmark) declares torchvision, which would pull another torch: no deps.
bench: setup
	$(PIP) install -q --no-deps pytorchfi==0.6.0
	$(PY) -m pytest bench --benchmark-only --benchmark-columns=min,median,max,rounds

clean:
	rm -rf build ext/*.c && find src -name "*.so" -delete && rm -rf $(FLOORS) docs/_build docs/api/generated
