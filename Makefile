# Every target sets itself up: a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-slow lint demo study study-retrieval study-upcycle bench clean

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

# DIFF and its matched Transformer on the built-in corpus with MQAR and induction rows mixed in (the retrieval
# preset, one seed: the first seed of make study-retrieval); every evaluation task that fits its 64-token blocks.
demo: $(STAMP)
	$(PY) -m difftransformer compare --preset retrieval --output-dir runs/demo

# The small-scale study of docs/results/study: DIFF as the paper specifies it, without its per-head norm, DIFF V2 and
# the Transformer, 2 seeds each (about an hour on 2 CPU cores).
study: $(STAMP)
	$(PY) -m difftransformer compare --preset study --variants "diff,diff(subln=none),diff_v2,softmax" --seeds 0,1 --output-dir runs/study

# The retrieval study of docs/results/retrieval: 2-layer models trained on text with MQAR and induction rows mixed in,
# DIFF as the paper specifies it, without its per-head norm, DIFF V2 and the Transformer, 3 seeds each (about an
# hour on 2 CPU cores); the report is copied to RETRIEVAL_REPORT.
RETRIEVAL_RUNS ?= runs/study-retrieval
RETRIEVAL_REPORT ?= docs/results/retrieval
RETRIEVAL_ARGS ?=
study-retrieval: $(STAMP)
	$(PY) -m difftransformer compare --preset retrieval --variants "diff,diff(subln=none),diff_v2,softmax" \
		--seeds 0,1,2 --tasks mqar,quant,outliers,longctx,icl --output-dir $(RETRIEVAL_RUNS) $(RETRIEVAL_ARGS)
	mkdir -p $(RETRIEVAL_REPORT)
	cp $(RETRIEVAL_RUNS)/report.md $(RETRIEVAL_RUNS)/report.html $(RETRIEVAL_RUNS)/results.json \
		$(RETRIEVAL_RUNS)/*.png $(RETRIEVAL_REPORT)/

# Upcycling (docs/results/upcycle): the study's softmax Transformer pretrained (or reused from runs/upcycle-base),
# then continued as it is and upcycled to DIFF V2 and DIFF V1, trained alike, 2 seeds each (about an hour on 2 CPU
# cores). The UPCYCLE_* variables shorten it, e.g. a smoke run: UPCYCLE_PRESET=micro UPCYCLE_BASE_ARGS="--max-steps 3"
# UPCYCLE_ARGS="--max-steps 2 --tasks mqar" UPCYCLE_RUNS=/tmp/up UPCYCLE_REPORT=/tmp/up/report.
UPCYCLE_PRESET ?= study
UPCYCLE_BASE_ARGS ?=
UPCYCLE_ARGS ?= --max-steps 400 --warmup-steps 20 --learning-rate 5e-4 --save-steps 200
UPCYCLE_RUNS ?= runs/upcycle
UPCYCLE_REPORT ?= docs/results/upcycle
study-upcycle: $(STAMP)
	$(PY) -m difftransformer train --preset $(UPCYCLE_PRESET) --attention softmax --resume \
		--output-dir $(UPCYCLE_RUNS)/base $(UPCYCLE_BASE_ARGS)
	$(PY) -m difftransformer compare --preset $(UPCYCLE_PRESET) --init-from $(UPCYCLE_RUNS)/base \
		--variants softmax,diff_v2,diff --seeds 0,1 --output-dir $(UPCYCLE_RUNS)/compare $(UPCYCLE_ARGS)
	mkdir -p $(UPCYCLE_REPORT)
	cp $(UPCYCLE_RUNS)/compare/report.md $(UPCYCLE_RUNS)/compare/report.html $(UPCYCLE_RUNS)/compare/results.json \
		$(UPCYCLE_RUNS)/compare/*.png $(UPCYCLE_REPORT)/

bench: $(STAMP)
	$(PY) -m difftransformer bench

clean:
	rm -rf $(VENV) runs .pytest_cache
