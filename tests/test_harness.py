"""lm-evaluation-harness on our folders, offline: local tasks of each request type (multiple choice,
loglikelihood_rolling, generate_until) on a tiny model of each attention kind, through lm-eval's Python HFLM
route (default suite) and through its command line, plain and as `difftransformer lm-eval` (slow)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

from difftransformer.cli import main as cli_main  # noqa: E402
from difftransformer.data.tokenizer import train_tokenizer  # noqa: E402
from difftransformer.eval.harness import harness_results, lm_eval_argv, run_harness, task_metrics  # noqa: E402
from helpers import NO_PACKAGE, random_model  # noqa: E402
from kind_table import KIND_FIELDS  # noqa: E402

KINDS = KIND_FIELDS  # every kind the package declares (tests/kind_table.py)
TASKS = ["dt_choice", "dt_rolling", "dt_generate"]
BLOCK = 32  # the tiny models' max_position_embeddings: rolling documents span several windows
TEXT = (
    "When forty winters shall besiege thy brow, and dig deep trenches in thy beauty's field, thy youth's proud "
    "livery so gazed on now will be a tattered weed of small worth held. "
)
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def write_tasks(folder: Path) -> Path:
    """Three local lm-eval tasks over JSON-lines files (``dataset_path: json``): no network, no hub."""
    folder.mkdir()
    words = TEXT.replace(",", "").replace(".", "").split()
    rows = {
        "choice": [
            {
                "question": " ".join(words[i : i + 4]),
                "choices": [words[i + 4], words[i + 9], "thy"],
                "answer": 0,
            }
            for i in range(10)
        ],
        "rolling": [{"text": TEXT[i * 13 :] + TEXT[: i * 13]} for i in range(5)],
        "generate": [
            {"question": " ".join(words[i : i + 5]) + ":", "answer": words[i + 5]} for i in range(4)
        ],
    }
    for name, items in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    common = (
        "dataset_path: json\ntest_split: test\ndataset_kwargs:\n  cache_dir: {cache}\n"
        "  data_files:\n    test: {path}\n"
    )
    specs = {
        "choice": 'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n',
        "rolling": 'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n",
        "generate": 'output_type: generate_until\ndoc_to_text: "{{question}}"\ndoc_to_target: " {{answer}}"\n'
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 6\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n",
    }
    for name, spec in specs.items():
        path = folder / f"{name}.jsonl"
        header = f"task: dt_{name}\n" + common.format(path=path, cache=folder / "datasets")
        (folder / f"dt_{name}.yaml").write_text(header + spec)
    return folder


def refuse_network(*args, **kwargs):
    raise OSError("the harness tests run offline: no network connection may be opened")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Tiny saved models (with their tokenizer) of each kind and the local tasks; offline: the environment says
    so (for subprocesses) and no socket may connect in this process."""
    root = tmp_path_factory.mktemp("harness")
    tokenizer = train_tokenizer([TEXT * 4], vocab_size=320)
    for seed, (kind, fields) in enumerate(KINDS.items()):
        model = random_model(
            seed=seed, dtype=torch.float32, vocab_size=len(tokenizer), max_position_embeddings=BLOCK, **fields
        )
        model.save_pretrained(root / kind)
        tokenizer.save_pretrained(root / kind)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {**OFFLINE, "HF_HOME": str(root / "hf")}.items():
            patch.setenv(key, value)
        patch.setattr(socket.socket, "connect", refuse_network)
        patch.setattr(socket, "create_connection", refuse_network)
        yield root, write_tasks(root / "tasks")


def numbers(response) -> list[float]:
    """The log-likelihoods inside one sample's responses (nested lists / tuples of floats and flags)."""
    if isinstance(response, (list, tuple)):
        return [value for item in response for value in numbers(item)]
    return [float(response)] if isinstance(response, float) else []


def rolling_loglikelihood(folder: Path, text: str) -> tuple[float, int]:
    """A document's log-likelihood computed here as lm-eval defines it for loglikelihood_rolling: disjoint
    windows of max_position_embeddings tokens, each predicted from the token before it; and the window count."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    windows = get_rolling_token_windows(
        token_list=ids, prefix_token=tokenizer.eos_token_id, max_seq_len=model.config.max_position_embeddings,
        context_len=1,
    )  # fmt: skip
    total, count = 0.0, 0
    for context, continuation in map(make_disjoint_window, windows):
        tokens = torch.tensor([context + continuation])
        with torch.no_grad():
            logp = model(tokens[:, :-1]).logits.log_softmax(-1)[0, len(context) - 1 :]
        total += float(logp.gather(-1, tokens[0, len(context) :, None]).sum())
        count += 1
    return total, count


@pytest.mark.parametrize(
    "kind",
    [
        "diff",
        pytest.param("diff_v2", marks=pytest.mark.slow),
        pytest.param("softmax", marks=pytest.mark.slow),
    ],
)
def test_python_route_runs_every_request_type_and_batching_changes_nothing(workspace, kind):
    root, tasks = workspace
    options = dict(include_path=tasks, include_defaults=False, bootstrap_iters=100, log_samples=True)
    runs = {batch: harness_results(root / kind, TASKS, batch_size=batch, **options) for batch in (1, 8)}
    metrics = task_metrics(runs[8])
    assert set(metrics) == set(TASKS)
    assert 0.0 <= metrics["dt_choice"]["acc"] <= 1.0 and metrics["dt_choice"]["acc_stderr"] is not None
    assert metrics["dt_rolling"]["word_perplexity"] > 1.0 and metrics["dt_rolling"]["bits_per_byte"] > 0.0
    assert metrics["dt_generate"]["exact_match"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    for task in ("dt_choice", "dt_rolling"):
        one = [numbers(sample["resps"]) for sample in runs[1]["samples"][task]]
        eight = [numbers(sample["resps"]) for sample in runs[8]["samples"][task]]
        assert len(one) == len(eight) and all(len(a) == len(b) > 0 for a, b in zip(one, eight))
        gap = max(abs(a - b) for row_a, row_b in zip(one, eight) for a, b in zip(row_a, row_b))
        assert gap <= 2e-5, (task, gap)
    # The harness's windows are the model's max_position_embeddings (BLOCK) tokens long.
    sample = runs[1]["samples"]["dt_rolling"][0]
    expected, windows = rolling_loglikelihood(root / kind, sample["doc"]["text"])
    assert windows > 1
    assert numbers(sample["resps"]) == pytest.approx([expected], abs=1e-4)


def test_bad_input_is_refused_before_loading(workspace, tmp_path):
    root, tasks = workspace
    with pytest.raises(FileNotFoundError, match="model_dir"):
        harness_results(tmp_path, TASKS, include_path=tasks, include_defaults=False)
    with pytest.raises(ValueError, match="tasks"):
        harness_results(root / "diff", "dt_choice", include_path=tasks, include_defaults=False)
    with pytest.raises(ValueError, match="no task"):
        harness_results(root / "diff", ["dt_missing"], include_path=tasks, include_defaults=False)
    with pytest.raises(ValueError, match="batch_size"):
        harness_results(root / "diff", TASKS, include_path=tasks, include_defaults=False, batch_size=0)


def test_cli_arguments_forwarded_to_lm_eval():
    given = ["--model_args", "pretrained=x", "--tasks", "t"]
    assert lm_eval_argv(given) == ["run", *given, "--model_args", "trust_remote_code=True"]
    flagged = ["run", "--tasks", "t", "--trust_remote_code"]
    assert lm_eval_argv(flagged) == flagged
    refused = ["--model_args", "pretrained=x,trust_remote_code=False"]
    assert lm_eval_argv(refused) == ["run", *refused]
    for unchanged in (["ls", "tasks"], ["validate", "--tasks", "t"], ["--help"], [], ["run"]):
        assert lm_eval_argv(unchanged) == unchanged


# Plain `lm_eval` in a process where difftransformer cannot be imported (as a user without our package runs it).
PLAIN_LM_EVAL = (
    NO_PACKAGE
    + r"""
sys.argv = ["lm_eval", *sys.argv[2:]]
from lm_eval.__main__ import cli_evaluate

cli_evaluate()
"""
)


def cli_metrics(folder: Path) -> dict:
    """The metrics of the results file lm-eval's CLI wrote under ``folder``, without standard errors (the CLI
    bootstraps them with its own number of resamples)."""
    (path,) = folder.rglob("results_*.json")
    return without_stderr(task_metrics(json.loads(path.read_text())))


def assert_same_metrics(got: dict, want: dict) -> None:
    """Equal up to the kernels' float32 rounding (without the package, the PyTorch attention paths run)."""
    assert got.keys() == want.keys()
    for task, values in want.items():
        assert got[task] == pytest.approx(values, rel=1e-5), task


def without_stderr(metrics: dict) -> dict:
    return {task: {k: v for k, v in values.items() if "_stderr" not in k} for task, values in metrics.items()}


@pytest.mark.slow
def test_plain_lm_eval_cli_and_difftransformer_lm_eval_on_our_folders(workspace, tmp_path):
    import difftransformer

    root, tasks = workspace
    package_root = str(Path(difftransformer.__file__).resolve().parents[1])
    common = [
        "--tasks",
        ",".join(TASKS),
        "--include_path",
        str(tasks),
        "--batch_size",
        "8",
        "--device",
        "cpu",
    ]
    env = {**os.environ, "PYTHONPATH": ""}
    for kind in KINDS:
        expected = without_stderr(
            run_harness(root / kind, TASKS, include_path=tasks, include_defaults=False, batch_size=8)
        )
        plain = [
            "--model", "hf", "--model_args", f"pretrained={root / kind},trust_remote_code=True",
            "--output_path", str(tmp_path / kind / "plain"), *common,
        ]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", PLAIN_LM_EVAL, package_root, *plain],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        assert_same_metrics(cli_metrics(tmp_path / kind / "plain"), expected)
        if kind != "diff":
            continue  # the forwarding below does not depend on the kind; each run indexes lm-eval's tasks (~20 s)
        ours = [
            "--model_args",
            f"pretrained={root / kind}",
            "--output_path",
            str(tmp_path / kind / "ours"),
            *common,
        ]
        assert cli_main(["lm-eval", *ours]) == 0
        assert_same_metrics(cli_metrics(tmp_path / kind / "ours"), expected)
