"""A length curriculum while training: the rows a :class:`~difftransformer.train.mixture.MixedBlocks` serves grow
along its mix's ``length_schedule`` with the global step.

Why: a 2-layer model learns in-context recall through an induction circuit that forms abruptly, and the first
signal for it is spread over every key before the query; on 256-token rows alone the retrieval-long models did not
form it within their budget, on 64-token rows they do (docs/results/retrieval-long.md). Starting short and growing
is the sequence-length warm-up long-context training commonly uses.

The dataset counts the rows it serves (the data loader fetches a batch ahead, so the global step when a row is
drawn is not the step it trains in); :class:`LengthCurriculum` re-bases the count on the global step when training
begins (a resumed run starts at its step's length) and at every epoch (whose last batch may be short). A row's length
thus depends on its step alone, and a resumed run sees the rows an uninterrupted one would. The rows must be drawn
in the training process: DataLoader worker processes would count their own copies, so that is refused.
"""

from __future__ import annotations

from transformers import TrainerCallback

from difftransformer.errors import UsageError
from difftransformer.train.mixture import MixedBlocks


class LengthCurriculum(TrainerCallback):
    """Keeps ``dataset`` on its mix's ``length_schedule`` (see the module docstring) in a run that reads its data
    with ``dataloader_num_workers`` worker processes (refused unless 0)."""

    def __init__(self, dataset: MixedBlocks, dataloader_num_workers: int = 0) -> None:
        if not dataset.mix.length_schedule:
            raise ValueError("LengthCurriculum needs a MixedBlocks whose mix has a length_schedule")
        if dataloader_num_workers:
            raise UsageError(
                "`dataloader_num_workers` must be 0 with a `length_schedule` (worker processes would count the "
                f"rows they serve on their own copies); got {dataloader_num_workers}"
            )
        self.dataset = dataset

    def _follow(self, args, state) -> None:
        rows = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self.dataset.follow_schedule(state.global_step, rows)

    def on_train_begin(self, args, state, control, **kwargs):
        self._follow(args, state)
        return control

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._follow(args, state)
        return control
