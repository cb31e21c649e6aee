"""Training examples: packed text blocks, with a share of them replaced by synthetic recall rows drawn on the fly.

:class:`Blocks` serves (n, T) token ids as causal-LM examples (labels = inputs). :class:`MixedBlocks` serves the
same blocks, except that the rows a seeded draw picks become a multi-needle retrieval block
(:class:`~difftransformer.train.retrieval.NeedleRows`, labels = inputs like text), an MQAR row
(:mod:`difftransformer.data.mqar`) or an induction row (:mod:`difftransformer.data.induction`), the last two with
labels on their answers only (-100 elsewhere), each generated when asked for. Nothing is copied or held in memory: the draw for row ``i`` depends on ``(seed, i)`` alone, so
every variant trained with one seed sees identical data, a resumed run sees what it would have seen, and the
text blocks may stay a memory-mapped file of any size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from difftransformer.data.induction import SHORTEST_SEGMENT, make_induction_batch
from difftransformer.data.mqar import MqarSettings, MqarVocabulary, make_mqar_batch, mqar_vocabulary
from difftransformer.errors import UsageError
from difftransformer.train.retrieval import NeedleRows


class Blocks(Dataset):
    """Packed (n, T) token ids as causal-LM examples; labels are the inputs (the model shifts them). ``blocks`` may
    view a memory-mapped file: only the rows asked for are read. With ``vocab_size``, every row served is checked
    to hold ids in ``[0, vocab_size)``."""

    def __init__(self, blocks: torch.Tensor, vocab_size: int | None = None) -> None:
        self.blocks = blocks
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.blocks[index]
        if self.vocab_size is not None and (int(row.max()) >= self.vocab_size or int(row.min()) < 0):
            raise UsageError(f"block {index} holds ids outside [0, vocab_size={self.vocab_size})")
        return {"input_ids": row, "labels": row}


@dataclass(frozen=True)
class RecallMix:
    """Shares of training rows replaced by synthetic recall: ``needle_fraction`` multi-needle retrieval blocks,
    ``mqar_fraction`` MQAR rows with a number of key-value pairs drawn uniformly from ``mqar_pairs`` (lowest,
    highest), ``induction_fraction`` induction rows (repeated random segments, which teach the circuit recall
    needs). All 0: plain text.

    ``length_schedule``: a curriculum of row lengths, ``((first step, tokens), ...)`` from step 0 on, ascending,
    the last at most the block size (empty: every row a full block; not with needle rows). A row served while the
    schedule says L tokens is L long: a text block's first L tokens, MQAR and induction rows drawn at L, MQAR's
    pair counts scaled by L / block size (:meth:`pairs_at`). :class:`~difftransformer.train.curriculum.LengthCurriculum` moves a
    :class:`MixedBlocks` along it while training.
    """

    needle_fraction: float = 0.0
    mqar_fraction: float = 0.0
    induction_fraction: float = 0.0
    mqar_pairs: tuple[int, int] = (2, 8)
    length_schedule: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        for name in ("needle_fraction", "mqar_fraction", "induction_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise UsageError(f"`{name}` must lie in [0, 1]; got {value}")
        if self.needle_fraction + self.mqar_fraction + self.induction_fraction >= 1.0:
            raise UsageError(
                f"`needle_fraction` + `mqar_fraction` + `induction_fraction` must be < 1 (some text must remain); got "
                f"{self.needle_fraction} + {self.mqar_fraction} + {self.induction_fraction}"
            )
        low, high = self.mqar_pairs
        if not 1 <= low <= high:
            raise UsageError(
                f"`mqar_pairs` must be (lowest, highest) with 1 <= lowest <= highest; got {self.mqar_pairs}"
            )
        schedule = self.length_schedule
        steps, lengths = [step for step, _ in schedule], [length for _, length in schedule]
        shown = ",".join(f"{step}:{tokens}" for step, tokens in schedule)
        if schedule and (steps[0] != 0 or steps != sorted(set(steps)) or lengths != sorted(set(lengths))):
            raise UsageError(
                "`length_schedule` must be STEP:TOKENS pairs starting at step 0, steps and lengths both ascending "
                f"(e.g. 0:64,3000:128); got {shown}"
            )
        if schedule and self.needle_fraction:
            raise UsageError(
                "`length_schedule` cannot shorten needle blocks (their question sits at the end); got "
                f"`needle_fraction` {self.needle_fraction} with it"
            )

    def pairs_at(self, length: int, block_size: int) -> tuple[int, int]:
        """The (lowest, highest) MQAR pair counts of a row of ``length`` tokens: :attr:`mqar_pairs` scaled by
        ``length / block_size`` (at least 1 pair)."""
        low, high = (max(1, pairs * length // block_size) for pairs in self.mqar_pairs)
        return low, high

    def check_schedule(self, block_size: int) -> None:
        """UsageError naming the field when the length schedule grows rows beyond ``block_size`` tokens, or gives
        rows too short for the MQAR or induction rows the mix draws (checked with the options, before any data is
        read; the message says what would work). Without a schedule every row has ``block_size`` tokens."""
        if not self.length_schedule:
            needs = self._row_needs(block_size, block_size)
            short = [what for needed, what in needs if block_size < needed]
            if short:
                raise UsageError(
                    f"`block_size` {block_size}: rows of {block_size} tokens cannot hold {' nor '.join(short)}; "
                    f"give a block size of at least {max(needed for needed, _ in needs)}"
                )
            return
        shown = ",".join(f"{step}:{tokens}" for step, tokens in self.length_schedule)
        if self.length_schedule[-1][1] > block_size:
            raise UsageError(
                f"`length_schedule` {shown} reaches {self.length_schedule[-1][1]} tokens, beyond the block size "
                f"{block_size} (`block_size`): end the schedule at {block_size} tokens or raise the block size"
            )
        for _, length in self.length_schedule:
            short = [what for needed, what in self._row_needs(length, block_size) if length < needed]
            if short:
                fitting = [
                    n
                    for n in range(2, block_size + 1)
                    if all(n >= k for k, _ in self._row_needs(n, block_size))
                ]
                if not fitting:
                    fix = "no length up to the block size holds them: raise `block_size`"
                elif fitting == list(range(fitting[0], block_size + 1)):
                    fix = f"give every length at least {fitting[0]} tokens"
                else:
                    starts = [n for n in fitting if n - 1 not in fitting]
                    ends = [n for n in fitting if n + 1 not in fitting]
                    spans = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in zip(starts, ends))
                    fix = f"only lengths of {spans} tokens hold them"
                raise UsageError(
                    f"`length_schedule` {shown}: rows of {length} tokens cannot hold {' nor '.join(short)}; {fix}"
                )

    def _row_needs(self, length: int, block_size: int) -> list[tuple[int, str]]:
        """(tokens needed, what) for each kind of synthetic row the mix draws at ``length`` tokens."""
        needs = []
        if self.mqar_fraction:
            pairs = self.pairs_at(length, block_size)[1]
            counted = (
                "1 key-value pair and its query"
                if pairs == 1
                else f"{pairs} key-value pairs and their queries"
            )
            needs.append((4 * pairs, f"MQAR rows of {counted} ({4 * pairs} tokens)"))
        if self.induction_fraction:
            needs.append((3 * SHORTEST_SEGMENT, f"induction rows ({3 * SHORTEST_SEGMENT} tokens)"))
        return needs

    def check(self, block_size: int, vocabulary: MqarVocabulary) -> None:
        """UsageError naming the field when blocks of ``block_size`` tokens cannot hold the mix's rows, MQAR rows
        drawn from ``vocabulary``, at every length of the schedule."""
        self.check_schedule(block_size)
        for length in [length for _, length in self.length_schedule] or [block_size]:
            if self.mqar_fraction:
                MqarSettings(self.pairs_at(length, block_size)[1], None, length).check(vocabulary)
            if self.induction_fraction:
                make_induction_batch(np.random.default_rng(0), 1, length, np.arange(2))

    def length_at(self, step: int, block_size: int) -> int:
        """The length of the rows of global step ``step`` (0 for the first optimizer step): the schedule's, or the
        block size without one."""
        return next((length for start, length in reversed(self.length_schedule) if start <= step), block_size)

    def stretches(self, first: int, last: int, block_size: int) -> tuple[tuple[int, int], ...]:
        """``(steps, row length)`` of each stretch of global steps ``first`` to ``last`` whose rows have one length:
        the schedule's stretches cut to that range, or one stretch at the block size without a schedule."""
        schedule = self.length_schedule or ((0, block_size),)
        ends = [start for start, _ in schedule[1:]] + [last]
        spans = [(max(start, first), min(end, last), length) for (start, length), end in zip(schedule, ends)]
        return tuple((end - start, length) for start, end, length in spans if end > start)

    def tokens_between(self, first: int, last: int, block_size: int, step_tokens: int) -> int:
        """Tokens trained on from global step ``first`` to ``last``, where a step of full blocks holds
        ``step_tokens``: with a schedule, each step counts its rows' length."""
        return sum(
            steps * (step_tokens * length // block_size)
            for steps, length in self.stretches(first, last, block_size)
        )


# Mixed into the seed of every row's draw, so the rows it picks differ from other draws of the same seed.
_STREAM = 0x726F77


class MixedBlocks(Blocks):
    """``blocks`` with the rows of ``mix`` replaced, drawn from ``seed`` (see the module docstring). MQAR keys and
    values are raw ids of a ``vocab_size`` vocabulary without ``special_ids``
    (:func:`~difftransformer.data.mqar.mqar_vocabulary`, as the ``mqar`` evaluation draws them); ``needles`` draws
    the needle blocks (needed when ``mix.needle_fraction`` is set)."""

    def __init__(
        self,
        blocks: torch.Tensor,
        mix: RecallMix,
        vocab_size: int,
        *,
        special_ids: frozenset[int] = frozenset(),
        seed: int = 0,
        needles: NeedleRows | None = None,
    ) -> None:
        super().__init__(blocks, vocab_size)
        self.vocabulary = mqar_vocabulary(vocab_size, special_ids=special_ids)
        mix.check(blocks.shape[1], self.vocabulary)
        if mix.needle_fraction and needles is None:
            raise ValueError("needles: a NeedleRows is needed for needle_fraction > 0")
        self.needles = needles
        self.mix = mix
        self.seed = seed
        self.recall_ids = np.concatenate([self.vocabulary.keys, self.vocabulary.values])
        # With a length schedule, while training: the rows of a step (per process) and the rows served so far, from
        # which a row's step, and so its length, follows (follow_schedule).
        self._rows_per_step: int | None = None
        self._served = 0

    def kind(self, index: int) -> str:
        """What row ``index`` serves: "needle", "mqar", "induction" or "text"."""
        return self._draw(index)[0]

    def _draw(self, index: int) -> tuple[str, np.random.Generator]:
        rng = np.random.default_rng([self.seed, _STREAM, index])
        u = rng.random()
        for kind, share in (("needle", self.mix.needle_fraction), ("mqar", self.mix.mqar_fraction),
                            ("induction", self.mix.induction_fraction)):  # fmt: skip
            if u < share:
                return kind, rng
            u -= share
        return "text", rng

    def follow_schedule(self, step: int, rows_per_step: int) -> None:
        """Serve rows along the mix's length schedule from global step ``step`` on, ``rows_per_step`` rows (per
        process, every accumulated micro-batch) a step: the rows served from here are counted, so a row's length is
        its step's whatever the data loader fetches ahead. Training calls it at its start and at every epoch
        (:class:`~difftransformer.train.curriculum.LengthCurriculum`); without it rows have the schedule's first
        length."""
        if rows_per_step < 1:
            raise ValueError(f"rows_per_step must be >= 1; got {rows_per_step}")
        self._rows_per_step, self._served = rows_per_step, step * rows_per_step

    def row_length(self) -> int:
        """The length of the next row served (the block size without a schedule)."""
        step = 0 if self._rows_per_step is None else self._served // self._rows_per_step
        return self.mix.length_at(step, self.blocks.shape[1])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        kind, rng = self._draw(index)
        length = self.row_length()
        self._served += 1
        if kind == "text":
            row = super().__getitem__(index)["input_ids"][:length]
            return {"input_ids": row, "labels": row}
        if kind == "needle":
            row = torch.tensor(self.needles.row(rng), dtype=torch.long)
            return {"input_ids": row, "labels": row}
        if kind == "mqar":
            low, high = self.mix.pairs_at(length, self.blocks.shape[1])
            settings = MqarSettings(int(rng.integers(low, high + 1)), None, length)
            batch = make_mqar_batch(rng, 1, settings, self.vocabulary)
        else:
            batch = make_induction_batch(rng, 1, length, self.recall_ids)
        return {
            "input_ids": torch.from_numpy(batch.input_ids[0]),
            "labels": torch.from_numpy(batch.labels[0]),
        }
