"""Named model sizes and training recipes: the CPU demo, a small GPU run, and the paper's configurations.

A preset is a model shape (the DIFF V1 model, ``h`` differential heads; the matched Transformer is
``config.matched_baseline()``, 2h heads of the same width d, and every other kind follows that baseline by its own
matching rule, layers/kinds.py: DIFF V2 and gated attention take the baseline's head count, GDA its query heads
split by gda_ratio), the data recipe (block size, vocabulary, retrieval blocks), and ``training``: overrides of
:class:`difftransformer.train.settings.TrainingSettings` (``TrainingArguments`` names). Every preset starts from
:data:`RECIPE`; every option no preset sets keeps transformers' default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from difftransformer.data.needles import NeedleSpec
from difftransformer.errors import UsageError
from difftransformer.models import ATTENTION_KINDS, PART_FIELDS, DiffTransformerConfig, matched_config
from difftransformer.models.compositions import composition_label
from difftransformer.train.mixture import RecallMix
from difftransformer.train.settings import TrainingSettings


@dataclass(frozen=True)
class Recipe(Mapping):
    """The :class:`TrainingSettings` fields a preset sets, typed: its optimizer, schedule and batch. A read-only
    mapping of field names to values as well (``TrainingSettings(**recipe, output_dir=...)``), so that a name no
    preset may set is refused when the recipe is made (``dataclasses.replace`` raises a TypeError)."""

    max_steps: int = 1000
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 3.2e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    max_grad_norm: float = 1.0
    lr_scheduler_type: str = "cosine"
    logging_steps: int = 10
    eval_steps: int = 100
    save_steps: int = 500

    def __getitem__(self, name: str) -> Any:
        if name not in self.__dataclass_fields__:
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.__dataclass_fields__)

    def __len__(self) -> int:
        return len(self.__dataclass_fields__)


# The optimizer and schedule every preset starts from (AdamW, the paper's betas for the small runs, cosine decay).
RECIPE = Recipe()


@dataclass(frozen=True, kw_only=True)
class Preset:
    """One model size and its recipe.

    Model: ``hidden_size`` (d_model), ``num_hidden_layers``, ``diff_heads`` (h, so the baseline has 2h heads of
    width hidden_size / 2h), ``intermediate_size`` (None: 8/3 d_model rounded up to 64), ``max_position_embeddings``
    (None: the block size). Data: ``block_size`` (training sequence length), ``vocab_size`` (of the tokenizer
    trained on the data), ``eval_blocks`` (validation blocks of the periodic evaluation, None: all),
    ``needle_fraction`` (share of training blocks replaced by multi-needle retrieval examples; 0 disables them)
    whose magic numbers have ``needle_digits`` digits (:attr:`needle`, also in the retrieval evaluation),
    ``mqar_fraction`` and ``induction_fraction`` (shares of training rows replaced by MQAR rows of
    ``mqar_pairs`` (lowest, highest)
    key-value pairs and by induction rows, :class:`~difftransformer.train.mixture.RecallMix`). ``training``: the
    :class:`TrainingSettings` fields this preset sets (all of :data:`RECIPE`, some changed). ``evaluation``: what
    ``compare`` changes in its evaluation suite's light settings for this preset's models (task -> option ->
    value, e.g. mqar's grid of lengths; empty: the tasks' defaults). ``length_schedule``: the training rows'
    length by step, ``((first step, tokens), ...)`` (:class:`~difftransformer.train.mixture.RecallMix`; empty: the
    block size throughout).
    """

    name: str
    hidden_size: int
    num_hidden_layers: int
    diff_heads: int
    intermediate_size: int | None
    block_size: int
    vocab_size: int = 4096
    eval_blocks: int | None = None
    needle_fraction: float = 0.0
    needle_digits: int = 6
    mqar_fraction: float = 0.0
    induction_fraction: float = 0.0
    mqar_pairs: tuple[int, int] = (2, 8)
    max_position_embeddings: int | None = None
    description: str = ""
    training: Recipe = RECIPE
    evaluation: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    length_schedule: tuple[tuple[int, int], ...] = ()

    @property
    def needle(self) -> NeedleSpec:
        """The needles of this preset's retrieval rows and of their evaluation."""
        return NeedleSpec(needle_digits=self.needle_digits)

    @property
    def recall(self) -> RecallMix:
        """The recall rows drawn into this preset's training."""
        return RecallMix(
            self.needle_fraction,
            self.mqar_fraction,
            self.induction_fraction,
            self.mqar_pairs,
            self.length_schedule,
        )

    def model_config(self, attention: str = "diff", **fields) -> DiffTransformerConfig:
        """The model for ``attention`` (a kind of :data:`~difftransformer.models.KINDS`: "diff", "softmax" = the
        matched baseline, and the others by the parts' matching rule against it, models/matching.py); ``fields``
        (e.g. vocab_size, bos/eos/pad ids, and part fields such as gda_ratio or output_gate) override the
        preset's."""
        if attention not in ATTENTION_KINDS:
            raise UsageError(f"`attention` must be one of {ATTENTION_KINDS}; got {attention!r}")
        if self.max_position_embeddings is not None and self.max_position_embeddings < self.block_size:
            raise UsageError(
                f"`max_position_embeddings` must be at least `block_size` ({self.block_size}), the length the "
                f"model trains on; got {self.max_position_embeddings}"
            )
        parts = {name: fields.pop(name) for name in PART_FIELDS if name in fields}
        kwargs = dict(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.diff_heads,
            attention="diff",
            # A saved model admits what it was trained on: a harness then never scores longer windows unasked.
            max_position_embeddings=self.max_position_embeddings or self.block_size,
        )
        kwargs.update(fields)
        diff = DiffTransformerConfig(**kwargs)
        if attention == "diff" and not parts:
            return diff
        try:
            return matched_config(diff.matched_baseline(), attention, **parts)
        except UsageError:
            raise
        except ValueError as err:  # the kind's matching rule cannot meet this preset's shape
            label = composition_label(attention, parts)
            raise UsageError(f"preset {self.name} cannot build {label} (`attention`): {err}") from None

    def model_for(self, attention: str, tokenizer: Any, **fields: Any) -> DiffTransformerConfig:
        """:meth:`model_config` for text from ``tokenizer``: its vocabulary size and special-token ids."""
        return self.model_config(
            attention,
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **fields,
        )

    def at_width(self, width: int) -> Preset:
        """This preset at d_model ``width`` with its depth and head width d (h = width / 2d DIFF heads) and the
        FFN at its default 8/3 width: the models of ``compare --sizes`` and ``--hidden-size``."""
        head_width = self.hidden_size // (2 * self.diff_heads)
        if width < 2 * head_width or width % (2 * head_width):
            raise UsageError(
                f"`hidden_size`: a width of preset {self.name} must be a multiple of 2 x its head width {head_width}; "
                f"got {width}"
            )
        return dataclasses.replace(
            self, hidden_size=width, diff_heads=width // (2 * head_width), intermediate_size=None
        )

    def with_training(self, **overrides: Any) -> Preset:
        """This preset with ``overrides`` of its training settings (fields of :class:`Recipe`)."""
        return dataclasses.replace(self, training=dataclasses.replace(self.training, **overrides))

    def training_settings(self, **fields: Any) -> TrainingSettings:
        """The :class:`TrainingSettings` of a run of this preset: its training overrides, then ``fields`` (at
        least ``output_dir``)."""
        return TrainingSettings(**{**self.training, **fields})


def _recipe(**changes: Any) -> Recipe:
    return dataclasses.replace(RECIPE, **changes)


def _paper(
    name: str, hidden: int, layers: int, heads: int, training: Mapping[str, Any] = (), **fields
) -> Preset:
    """The scaling runs of the paper's §3.2 (appendix hyperparameters): length 2048, 0.25M-token batches
    (128 x 2048), 40K steps, AdamW betas (0.9, 0.98), warmup 375, weight decay 0.05. The paper gives no learning
    rate for these runs; 3.2e-4 is its 3B recipe's. ``training`` and ``fields`` override these."""
    recipe = dict(
        intermediate_size=None,
        block_size=2048,
        eval_blocks=256,
        description=f"paper {name}: d_model {hidden}, {layers} layers, {heads} DIFF / {2 * heads} Transformer heads",
    )
    recipe.update(fields)
    schedule = dict(
        max_steps=40_000,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=16,
        learning_rate=3.2e-4,
        warmup_steps=375,
        weight_decay=0.05,
        adam_beta2=0.98,
        logging_steps=50,
        eval_steps=1000,
        save_steps=1000,
    )
    schedule.update(training)
    return Preset(
        name=name,
        hidden_size=hidden,
        num_hidden_layers=layers,
        diff_heads=heads,
        training=_recipe(**schedule),
        **recipe,
    )


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            name="micro",
            description="seconds-long smoke test (used by the tests)",
            hidden_size=32,
            num_hidden_layers=2,
            diff_heads=2,
            intermediate_size=64,
            block_size=256,
            vocab_size=320,
            eval_blocks=8,
            needle_fraction=0.25,
            training=_recipe(
                max_steps=6,
                per_device_train_batch_size=4,
                learning_rate=3e-3,
                warmup_steps=2,
                logging_steps=1,
                eval_steps=3,
                save_steps=3,
            ),
        ),
        Preset(
            name="tiny",
            description="4-layer models on 256-token blocks with multi-needle retrieval blocks mixed in, minutes on "
            "2 cores (the demo before the retrieval preset)",
            hidden_size=128,
            num_hidden_layers=4,
            diff_heads=2,
            intermediate_size=384,
            block_size=256,
            vocab_size=4096,
            eval_blocks=32,
            needle_fraction=0.5,
            needle_digits=3,
            training=_recipe(
                max_steps=500,
                per_device_train_batch_size=8,
                learning_rate=2e-3,
                warmup_steps=30,
                logging_steps=10,
                eval_steps=100,
                save_steps=250,
            ),
        ),
        Preset(
            name="study",
            description="the small-scale study (make study): the demo's shape on plain text, 3x its tokens; run "
            "with 4 variants and 2 seeds in under an hour on 2 cores (docs/results/study)",
            hidden_size=128,
            num_hidden_layers=4,
            diff_heads=2,
            intermediate_size=384,
            block_size=256,
            vocab_size=4096,
            eval_blocks=32,
            training=_recipe(
                max_steps=800,
                per_device_train_batch_size=8,
                learning_rate=2e-3,
                warmup_steps=30,
                logging_steps=10,
                eval_steps=100,
                save_steps=400,
            ),
        ),
        Preset(
            name="scaling",
            description="the loss-against-size study (make study-scaling): 2-layer models on plain text, head width "
            "12, a 1024-token vocabulary, trained with compare --sizes 48,96,144 --tokens-per-parameter 10 "
            "(docs/results/scaling)",
            hidden_size=96,
            num_hidden_layers=2,
            diff_heads=4,
            intermediate_size=None,
            block_size=256,
            vocab_size=1024,
            eval_blocks=32,
            training=_recipe(
                max_steps=1100,
                per_device_train_batch_size=8,
                learning_rate=3e-3,
                warmup_steps=30,
                logging_steps=10,
                eval_steps=100,
                save_steps=400,
            ),
        ),
        Preset(
            name="retrieval",
            description="the demo and the retrieval study (make demo, make study-retrieval): 2-layer models "
            "learning in-context recall from MQAR and induction rows beside text, minutes a run on 2 cores "
            "(docs/results/retrieval)",
            hidden_size=64,
            num_hidden_layers=2,
            diff_heads=2,
            intermediate_size=None,
            block_size=64,
            vocab_size=320,
            eval_blocks=16,
            mqar_fraction=0.4,
            induction_fraction=0.4,
            mqar_pairs=(2, 8),
            max_position_embeddings=128,
            training=_recipe(
                max_steps=4000,
                per_device_train_batch_size=64,
                learning_rate=3e-3,
                warmup_steps=100,
                logging_steps=20,
                eval_steps=100,
                save_steps=500,
            ),
        ),
        Preset(
            name="retrieval-long",
            description="the long-context retrieval study (make study-retrieval-long): the retrieval preset's "
            "models and mixture, grown from 64-token to 256-token rows (at step 4500 of 5100) with 2-16 then 8-64 "
            "key-value pairs, admitting 1024 tokens so that recall is measured beyond the trained length "
            "(docs/results/retrieval-long)",
            hidden_size=64,
            num_hidden_layers=2,
            diff_heads=2,
            intermediate_size=None,
            block_size=256,
            vocab_size=320,  # the retrieval preset's: MQAR keys from ids 80-199, values from 200-319
            eval_blocks=16,
            mqar_fraction=0.4,
            induction_fraction=0.4,
            mqar_pairs=(8, 64),  # at 256 tokens; scaled with the row (2-16 pairs at 64 tokens)
            max_position_embeddings=1024,
            # Trained on 256-token rows alone, the models did not learn recall within this budget; on 64-token rows
            # they learn it as the retrieval preset does, and then carry it to 256. Rows that grew at step 3000 came
            # before the recall circuit had formed in half the runs; at step 4500 most of those runs learned it
            # (docs/results/retrieval-long.md).
            length_schedule=((0, 64), (4500, 256)),
            # Zoology's accuracy against sequence length, inside (up to 256 tokens) and beyond the trained range,
            # attention allocation at every length; 64 pairs at most (320 ids hold 120 distinct keys).
            evaluation={"mqar": {"lengths": [64, 128, 256, 512, 1024], "num_pairs": [4, 8, 16, 32, 64]}},
            training=_recipe(
                max_steps=5100,
                per_device_train_batch_size=64,
                learning_rate=3e-3,
                warmup_steps=100,
                logging_steps=20,
                eval_steps=100,
                save_steps=600,
            ),
        ),
        Preset(
            name="small",
            description="one GPU for under an hour, or a long CPU run",
            hidden_size=384,
            num_hidden_layers=6,
            diff_heads=3,
            intermediate_size=None,
            block_size=512,
            vocab_size=8192,
            eval_blocks=128,
            needle_fraction=0.15,
            training=_recipe(
                max_steps=3000,
                per_device_train_batch_size=16,
                learning_rate=1e-3,
                warmup_steps=200,
                logging_steps=20,
                eval_steps=250,
                save_steps=500,
            ),
        ),
        _paper("830m", hidden=1536, layers=24, heads=8),
        _paper("1.4b", hidden=2048, layers=24, heads=8),
        _paper("2.8b", hidden=2560, layers=32, heads=10),
        _paper("6.8b", hidden=4096, layers=32, heads=16),
        _paper("13.1b", hidden=5120, layers=40, heads=20),
        _paper(
            "3b",
            hidden=3072,
            layers=28,
            heads=12,
            intermediate_size=8192,
            block_size=4096,
            description="paper 3B: d_model 3072, 28 layers, 12 DIFF / 24 Transformer heads (dim 128), FFN 8192",
            training=dict(
                per_device_train_batch_size=4,
                gradient_accumulation_steps=16,
                learning_rate=3.2e-4,
                warmup_steps=1000,
                weight_decay=0.1,
                adam_beta2=0.95,
            ),
        ),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; a UsageError listing the known ones otherwise."""
    if name not in PRESETS:
        raise UsageError(f"`preset` must be one of {sorted(PRESETS)}; got {name!r}")
    return PRESETS[name]
