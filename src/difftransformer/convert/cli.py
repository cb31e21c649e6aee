"""`difftransformer convert`: our models to and from their native transformers counterparts (DIFF V1 <->
DiffLlama, the softmax baseline <-> Llama), and pretrained softmax models upcycled to DIFF V2 or DIFF V1
(``--from-llama DIR --attention KIND``). The tokenizer files and generation config travel along; the result is
written to a temporary folder moved into place at the end, so a failed conversion leaves nothing behind and never
touches its input."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from difftransformer.convert.diffllama import from_diffllama, to_diffllama
from difftransformer.convert.folders import ConversionError, check_output, model_type, save_converted
from difftransformer.convert.llama import to_llama
from difftransformer.convert.upcycle import load_softmax, upcycle
from difftransformer.errors import UsageError, check_seed
from difftransformer.flags import add_flags, given
from difftransformer.models import ATTENTION_KINDS, DiffTransformerConfig, DiffTransformerForCausalLM
from difftransformer.models.folders import load_model_folder
from difftransformer.storage import check_input_dir, check_output_dir

DIRECTIONS = ("from_diffllama", "to_diffllama", "from_llama", "to_llama")


@dataclass(frozen=True)
class ConvertOptions:
    """One conversion: exactly one direction (a source folder), the output folder, and for imports the rotary
    style and the attention to upcycle to."""

    _argument_group_name = (
        "conversion (exactly one of --from-diffllama, --to-diffllama, --from-llama, --to-llama)"
    )

    from_diffllama: str | None = field(
        default=None,
        metadata={"help": "a saved DiffLlamaForCausalLM to convert to our DIFF V1", "metavar": "DIR"},
    )
    to_diffllama: str | None = field(
        default=None,
        metadata={"help": "a saved DIFF V1 model of ours to convert to DiffLlama", "metavar": "DIR"},
    )
    from_llama: str | None = field(
        default=None,
        metadata={"help": "a saved LlamaForCausalLM (any Llama-family folder transformers loads as one) to convert "
                  "to our softmax model, or with --attention diff_v2 / diff / gda / gated to upcycle (our own "
                  "softmax models too)",
                  "metavar": "DIR"},
    )  # fmt: skip
    to_llama: str | None = field(
        default=None,
        metadata={"help": "a saved softmax model of ours (a comparison's baseline) to convert to LlamaForCausalLM; "
                  "DIFF V2 has no native counterpart (its folder loads with trust_remote_code=True)",
                  "metavar": "DIR"},
    )  # fmt: skip
    output_dir: str | None = field(
        default=None,
        metadata={"help": "a new (or empty) folder for the converted model (safetensors); required"},
    )
    attention: Literal[ATTENTION_KINDS] = field(
        default="softmax",
        metadata={"help": "with --from-llama: softmax (the exact import), or another kind: upcycled, computing the "
                  "same logits at step 0 with every new parameter trainable, where an exact construction exists "
                  "(docs/training.md)"},
    )  # fmt: skip
    gda_ratio: int | None = field(
        default=None,
        metadata={"help": "with --attention of a kind with noise maps: signal heads per noise map; it must divide "
                  "the source's query heads per KV head (exact only then) (default: the kind's)"},
    )  # fmt: skip
    rope_style: Literal["half", "interleaved"] = field(
        default="half",
        metadata={"help": "rotary pairing of the converted model (with --from-diffllama / --from-llama; both are "
                  "exact)"},
    )  # fmt: skip
    seed: int = field(default=0, metadata={"help": "seed of the upcycled scalar lambda's vectors"})

    def __post_init__(self) -> None:
        given_directions = [name for name in DIRECTIONS if getattr(self, name) is not None]
        if len(given_directions) != 1:
            got = ", ".join(f"`{name}`" for name in given_directions) or "none"
            raise UsageError(
                f"give exactly one of {', '.join(f'`{name}`' for name in DIRECTIONS)}; got {got}"
            )
        if self.output_dir is None:
            raise UsageError("`output_dir` is required: a new (or empty) folder for the converted model")
        if self.attention != "softmax" and self.from_llama is None:
            raise ConversionError(
                f"`attention` {self.attention} upcycles a `from_llama` source; got no `from_llama`"
            )
        if self.gda_ratio is not None and self.attention == "softmax":
            raise UsageError("`gda_ratio` moves an upcycled kind with noise maps; got `attention` softmax")
        check_seed(self.seed)

    @property
    def direction(self) -> str:
        """The direction given (``from_llama``, ...)."""
        return next(name for name in DIRECTIONS if getattr(self, name) is not None)

    @property
    def source(self) -> Path:
        """The folder converted."""
        return Path(getattr(self, self.direction))


def configure(parser: argparse.ArgumentParser) -> None:
    """One conversion direction (DiffLlama or Llama, to or from), the output folder, the rotary style and, from a
    Llama, the attention to upcycle to: :class:`ConvertOptions`' fields."""
    add_flags(parser, ConvertOptions, only_given=True)


def _ours(source: Path, field: str) -> DiffTransformerForCausalLM:
    """Our model saved in ``source`` (the option ``field``), refusing a folder of another model type."""
    found = model_type(source)
    if found != DiffTransformerConfig.model_type:
        raise ConversionError(
            f"`{field}` converts our own models (model_type 'difftransformer'); {source} holds model_type {found!r}"
            + (
                " (use `from_llama` or `from_diffllama` to import it)"
                if found in ("llama", "diffllama")
                else ""
            )
        )
    return load_model_folder(source, DiffTransformerForCausalLM, what=field, dtype="auto")


def run(args: argparse.Namespace) -> int:
    """Convert the given folder and save the result, with the source's tokenizer and generation config, to
    --output-dir."""
    options = ConvertOptions(**given(vars(args), ConvertOptions))
    source, output = options.source, Path(options.output_dir)
    check_input_dir(source, options.direction, "a saved model")
    check_output(source, output)
    check_output_dir(output, "output_dir")
    model_type(source)  # a folder without a readable config.json is refused before any weights are read
    if options.from_diffllama:
        converted = from_diffllama(source, rope_style=options.rope_style)
    elif options.from_llama:
        converted = upcycle(
            load_softmax(source, rope_style=options.rope_style),
            options.attention,
            seed=options.seed,
            **({} if options.gda_ratio is None else {"gda_ratio": options.gda_ratio}),
        )
    elif options.to_diffllama:
        converted = to_diffllama(_ours(source, "to_diffllama"))
    else:
        converted = to_llama(_ours(source, "to_llama"))
    save_converted(converted, source, output)
    print(f"wrote {type(converted).__name__} to {output}")
    return 0
