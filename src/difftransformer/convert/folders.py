"""Model folders as conversions read and write them: a config read before any weights (loading itself is
:mod:`difftransformer.models.folders`', strict and failing in one line), an output folder that can never be the
input, and a result moved into place only once it is whole."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from transformers import PreTrainedModel

from difftransformer.errors import MissingInputError, UsageError

# Files besides the weights and config that travel with a converted model: the tokenizer's and the generation
# settings (copied after saving, so the source's generation_config.json wins over the default one written).
CARRIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "generation_config.json",
)


class ConversionError(UsageError):
    """A model or folder that a conversion cannot take (the message says which field or file, and why)."""


def model_type(folder: str | Path) -> str:
    """The ``model_type`` of the saved model folder ``folder``, read from its config.json alone."""
    path = Path(folder)
    config = path / "config.json"
    if not config.is_file():
        raise MissingInputError(f"{path} is not a saved model folder (no config.json)")
    try:
        fields = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConversionError(f"{config} is not a model config: not valid JSON ({err})") from None
    if not isinstance(fields, dict) or not isinstance(fields.get("model_type"), str):
        raise ConversionError(f"{config} is not a model config: it names no model_type")
    return fields["model_type"]


def check_output(source: Path, output: Path) -> None:
    """Refuse an ``output`` folder that is ``source``, lies inside it or holds it, or already holds files: a
    conversion never writes into its input nor over anything."""
    source, output = source.resolve(), output.resolve()
    if output == source or source in output.parents:
        raise ConversionError(f"`output_dir` must lie outside the source folder {source}; got {output}")
    if output in source.parents:
        raise ConversionError(f"`output_dir` must not contain the source folder {source}; got {output}")
    if output.exists() and not output.is_dir():
        raise ConversionError(f"`output_dir` must be a new or empty folder; {output} is a file")
    if output.exists() and any(output.iterdir()):
        raise ConversionError(f"`output_dir` must be a new or empty folder; {output} already holds files")


def save_converted(
    model: PreTrainedModel, source: Path, output: Path, finish: Callable[[Path], None] | None = None
) -> None:
    """Save ``model`` with the source's :data:`CARRIED_FILES` into a temporary folder beside ``output``, then move
    it into place: a conversion that fails leaves no half-written ``output`` (and never touches ``source``).
    ``finish(folder)`` writes what ``save_pretrained`` does not, before the move."""
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        model.save_pretrained(staging)
        for name in CARRIED_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, staging / name)
        if finish is not None:
            finish(staging)
        if output.exists():
            output.rmdir()  # empty (check_output): os.replace then puts the new folder in its place
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
