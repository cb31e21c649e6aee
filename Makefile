# Every target sets itself up: a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-slow lint demo study bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch is pinned in the same command as the rest so pip never pulls a CUDA build
	$(PY) -m pip install --quiet "torch==2.13.0" -e ".[test,lmeval]"
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest -q -p no:cacheprovider

test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow

demo: $(STAMP)
	$(PY) -m difftransformer compare --preset tiny --output-dir runs/demo

# The small-scale study of docs/results/study: DIFF as the paper specifies it, without its per-head norm, DIFF V2 and
# the Transformer, 2 seeds each (about an hour on 2 CPU cores).
study: $(STAMP)
	$(PY) -m difftransformer compare --preset study --variants "diff,diff(subln=none),diff_v2,softmax" --seeds 0,1 --output-dir runs/study

bench: $(STAMP)
	$(PY) -m difftransformer bench

clean:
	rm -rf $(VENV) runs .pytest_cache
