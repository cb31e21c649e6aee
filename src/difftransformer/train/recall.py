"""MQAR accuracy measured during training, on one fixed batch at every evaluation, so a run records how many steps
its model took to learn recall (``eval_mqar_accuracy`` in metrics.csv)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from difftransformer.data.mqar import MqarSettings, MqarVocabulary, make_mqar_batch

PROBE_PAIRS = 4  # the easiest setting the evaluation reports
PROBE_SEQUENCES = 128
RECALL_THRESHOLD = 0.9  # "learned": the accuracy a run's steps to recall are counted to


class RecallProbe:
    """``PROBE_SEQUENCES`` MQAR sequences of ``length`` tokens with ``pairs`` key-value pairs from ``vocabulary``,
    drawn once from ``seed``; :meth:`accuracy` scores a model on them."""

    def __init__(
        self, vocabulary: MqarVocabulary, length: int, pairs: int = PROBE_PAIRS, seed: int = 0
    ) -> None:
        batch = make_mqar_batch(
            np.random.default_rng([seed, 0x7072]),
            PROBE_SEQUENCES,
            MqarSettings(pairs, None, length),
            vocabulary,
        )
        self.input_ids = torch.from_numpy(batch.input_ids)
        self.positions = torch.from_numpy(batch.query_positions)
        self.targets = torch.from_numpy(batch.targets)

    @torch.no_grad()
    def accuracy(self, model: nn.Module, batch_size: int = 32) -> float:
        """Share of queried keys whose value is the model's argmax at the key's position."""
        device = next(model.parameters()).device
        correct = 0
        for start in range(0, len(self.input_ids), batch_size):
            ids = self.input_ids[start : start + batch_size].to(device)
            logits = model(input_ids=ids, use_cache=False).logits
            positions = self.positions[start : start + batch_size].to(device)
            predicted = logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])).argmax(-1)
            correct += int((predicted.cpu() == self.targets[start : start + batch_size]).sum())
        return correct / self.targets.numel()


def steps_to_recall(
    steps: list[int], accuracies: list[float], threshold: float = RECALL_THRESHOLD
) -> int | None:
    """The first evaluation step whose accuracy reached ``threshold``; None if none did."""
    for step, accuracy in zip(steps, accuracies):
        if accuracy >= threshold:
            return step
    return None
