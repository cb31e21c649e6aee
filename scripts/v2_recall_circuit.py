"""Where a DIFF V2 retrieval run stands on the recall circuit, checkpoint by checkpoint (docs/results/retrieval.md,
"DIFF V2's failed seeds").

For each run folder (trained with ``difftransformer train --preset retrieval --attention diff_v2``) and each of its
checkpoints, on 128 MQAR sequences of 4 pairs in 64 tokens (the recall probe's setting):

- ``accuracy``, and ``other_value``: the share of queries answered with another value of the sequence (the plateau
  at "one of the context's values" answers 1/pairs of the queries right);
- per layer, ``previous``: the largest share over heads of the combined map A_{2i} - sigmoid(lambda_i) A_{2i+1}
  from each value of the key-value block on its key, the position just before (the copy step of a two-layer recall
  circuit, which must form in layer 0); ``gate``: sigmoid(lambda) at the queries, mean over heads; ``separation``:
  the total variation between the pair's two maps at the queries, mean over heads (0: the two maps are one).

Prints one JSON line per checkpoint; ``--plot PATH`` draws accuracy and layer 0's ``previous`` against the step, a
line per run.

    python scripts/v2_recall_circuit.py runs/v2/seed0 runs/v2/seed2 --plot v2_seeds.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from difftransformer.data.mqar import MqarSettings, make_mqar_batch, mqar_vocabulary
from difftransformer.layers import attention_logits_hook
from difftransformer.models import DiffTransformerForCausalLM
from difftransformer.plotting import pyplot, save_figure

PAIRS, LENGTH, SEQUENCES = 4, 64, 128


@torch.no_grad()
def measure(folder: Path) -> dict:
    """The measures of the module docstring for the model saved in ``folder``."""
    model = DiffTransformerForCausalLM.from_pretrained(folder).eval()
    if model.config.attention != "diff_v2":
        raise SystemExit(f"{folder} holds a {model.config.attention} model, not DIFF V2")
    vocabulary = mqar_vocabulary(model.config.vocab_size)
    batch = make_mqar_batch(
        np.random.default_rng(123), SEQUENCES, MqarSettings(PAIRS, None, LENGTH), vocabulary
    )
    ids = torch.from_numpy(batch.input_ids)
    logits_by_layer, gates = [], []

    def keep_logits(module, logits):
        logits_by_layer.append(logits.detach().double())
        return logits

    hooks = [
        layer.self_attn.lambda_proj.register_forward_hook(
            lambda module, args, output: gates.append(torch.sigmoid(output.double()))
        )
        for layer in model.model.layers
    ]
    with attention_logits_hook(model, keep_logits):
        out = model(input_ids=ids, output_attentions=True, use_cache=False)
    for hook in hooks:
        hook.remove()
    queries = torch.from_numpy(batch.query_positions)
    rows = torch.arange(SEQUENCES).unsqueeze(-1)
    logits = out.logits
    predicted = logits.gather(1, queries.unsqueeze(-1).expand(-1, -1, logits.shape[-1])).argmax(-1)
    correct = predicted == torch.from_numpy(batch.targets)
    values_in_row = ids[:, 1 : 2 * PAIRS : 2]
    other = (predicted.unsqueeze(-1) == values_in_row.unsqueeze(1)).any(-1) & ~correct
    causal = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()
    value_positions = torch.arange(1, 2 * PAIRS, 2)
    layers = []
    for combined, raw, gate in zip(out.attentions, logits_by_layer, gates):
        maps = raw.masked_fill(~causal, float("-inf")).softmax(-1)  # (B, 2h, T, S)
        first, second = maps[:, 0::2], maps[:, 1::2]
        at_queries = lambda m: m.permute(0, 2, 1, 3)[rows, queries]  # (B, R, h, S)  # noqa: E731
        separation = 0.5 * (at_queries(first) - at_queries(second)).abs().sum(-1)
        previous = combined.double()[:, :, value_positions, value_positions - 1].mean(dim=(0, 2))  # per head
        layers.append(
            dict(
                previous=float(previous.max()),
                gate=float(gate[rows, queries].mean()),
                separation=float(separation.mean()),
            )
        )
    return dict(
        accuracy=float(correct.double().mean()), other_value=float(other.double().mean()), layers=layers
    )


def checkpoints(run: Path) -> list[tuple[int, Path]]:
    """(step, folder) of the run's checkpoints, in step order."""
    found = [(int(p.name.rsplit("-", 1)[1]), p) for p in run.glob("checkpoint-*") if p.is_dir()]
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="DIFF V2 run folders with checkpoint-N subfolders")
    parser.add_argument("--plot", type=Path, help="write the plot of accuracy and layer 0's copy step here")
    args = parser.parse_args()
    curves = {}
    for run in args.runs:
        for step, folder in checkpoints(run):
            row = dict(run=str(run), step=step, **measure(folder))
            print(json.dumps(row))
            curves.setdefault(run.name, []).append(row)
    if args.plot:
        plt = pyplot()
        figure, axes = plt.subplots(1, 2, figsize=(11, 4))
        for name, rows in curves.items():
            steps = [r["step"] for r in rows]
            axes[0].plot(steps, [r["accuracy"] for r in rows], marker="o", label=name)
            axes[1].plot(steps, [r["layers"][0]["previous"] for r in rows], marker="o", label=name)
        axes[0].axhline(1 / PAIRS, color="gray", ls=":", lw=1)
        axes[0].set(title=f"MQAR accuracy ({PAIRS} pairs, {LENGTH} tokens)", xlabel="training step",
                    ylabel="accuracy", ylim=(0, 1.02))  # fmt: skip
        axes[1].set(title="layer 0: from each value to its key (copy step)", xlabel="training step",
                    ylabel="attention share, best head", ylim=(0, 1.02))  # fmt: skip
        for axis in axes:
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8)
        save_figure(figure, args.plot)


if __name__ == "__main__":
    main()
