"""`difftransformer quantize RUN --scheme SCHEME --output-dir Q`: a quantized copy of a saved model folder
(:mod:`difftransformer.convert.quantize`, docs/quantization.md), with the source's tokenizer and generation config,
moved into place only once it is whole."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from difftransformer.convert.folders import check_output, model_type, save_converted
from difftransformer.convert.quantize import QUANTIZATION_JSON, quantize_folder
from difftransformer.errors import UsageError
from difftransformer.flags import add_flags, given
from difftransformer.models.quantization import SCHEMES
from difftransformer.storage import check_input_dir, check_output_dir


@dataclass(frozen=True)
class QuantizeOptions:
    """The scheme and the output folder."""

    _argument_group_name = "quantization"

    scheme: Literal[tuple(SCHEMES)] = field(
        default=None,
        metadata={"help": "int8 (weights, torchao), int4 (weights in groups of 32, torchao) or w8a8 (int8 weights "
                  "and inputs, compressed-tensors, which vLLM serves); required"},
    )  # fmt: skip
    output_dir: str | None = field(
        default=None, metadata={"help": "a new (or empty) folder for the quantized model; required"}
    )

    def __post_init__(self) -> None:
        if self.scheme is None:
            raise UsageError(f"`scheme` is required: one of {', '.join(SCHEMES)}")
        if self.output_dir is None:
            raise UsageError("`output_dir` is required: a new (or empty) folder for the quantized model")


def configure(parser: argparse.ArgumentParser) -> None:
    """The source folder, then :class:`QuantizeOptions`' fields."""
    parser.description = __doc__.split("\n\n")[0]
    parser.add_argument(
        "run", metavar="RUN", help="a saved model folder of ours (a run, a checkpoint, a conversion)"
    )
    add_flags(parser, QuantizeOptions, only_given=True)


def run(args: argparse.Namespace) -> int:
    """Quantize the folder ``args.run`` and save the result to --output-dir."""
    options = QuantizeOptions(**given(vars(args), QuantizeOptions))
    source, output = Path(args.run), Path(options.output_dir)
    check_input_dir(source, "run", "a saved model")
    check_output(source, output)
    check_output_dir(output, "output_dir")
    model_type(source)  # a folder without a readable config.json is refused before any weights are read
    quantized = quantize_folder(source, SCHEMES[options.scheme])
    save_converted(quantized.model, source, output, finish=quantized.finish)
    kept = ", ".join(quantized.record["full_precision"])
    print(f"wrote {options.scheme} to {output} (left in full precision: {kept}; {QUANTIZATION_JSON})")
    return 0
