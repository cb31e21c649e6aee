"""Opening a saved model folder, the one way every command does it (convert, generate, eval, train ``--init-from``
and its resume, compare's reuse of a finished run, upcycling): transformers reads it, our models' strict loading
(:mod:`difftransformer.models.loading`, also applied to any other model class loaded here) refuses weights that
disagree with config.json, that are not finite or that no longer match the folder's recorded fingerprint, and
whatever a damaged or edited folder makes transformers, safetensors or our classes raise becomes one
:class:`~difftransformer.errors.UsageError` line naming the option the folder came in. A checkpoint that Trainer
reads itself (``train --resume``) is checked on its files once Trainer has read its names (:func:`check_model_files`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, PreTrainedModel

from difftransformer.errors import MissingInputError, UsageError
from difftransformer.models.loading import folder_problems, strict_from_pretrained


def open_folder(
    load: Callable[..., Any],
    folder: str | os.PathLike,
    *,
    what: str = "model",
    thing: str = "model",
    **options: Any,
) -> Any:
    """``load(folder, **options)`` (a ``from_pretrained`` of a config, tokenizer or model class), its refusal of a
    damaged or foreign folder (a config it cannot read or that our config refuses, weights missing, truncated or
    disagreeing with the config) turned into a one-line UsageError naming ``what`` (the option that named the
    folder) and ``thing`` (what was being read)."""
    try:
        return load(folder, **options)
    except UsageError:
        raise
    except (OSError, SafetensorError, ValueError, KeyError, TypeError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"`{what}` {str(folder)!r}: cannot load the {thing}: {first_line}") from err


def load_model_folder(
    folder: str | os.PathLike,
    model_class: Any = AutoModelForCausalLM,
    *,
    what: str = "model",
    **options: Any,
) -> PreTrainedModel:
    """The model saved in ``folder``, loaded by ``model_class`` (a model class or an Auto class; any causal LM by
    default) with ``from_pretrained`` ``options``, strictly: a folder without config.json is a
    :class:`~difftransformer.errors.MissingInputError`, and one whose weights and config.json disagree (a tensor
    missing, unexpected or of another shape, a declared tie undone) or whose config our classes refuse (a value out
    of its bounds) a one-line UsageError naming ``what``, before anything else is done with it."""
    if not (Path(folder) / "config.json").is_file():
        raise MissingInputError(
            f"`{what}` must be a saved model folder with a config.json; got {str(folder)!r}"
        )
    load = partial(strict_from_pretrained, model_class.from_pretrained)
    return open_folder(load, folder, what=what, **options)


def check_model_files(folder: str | os.PathLike, *, what: str = "model") -> None:
    """Refuse in one UsageError line naming ``what`` a model folder whose files a strict load would refuse without
    building the model (:func:`~difftransformer.models.loading.folder_problems`: weights not finite, or not what
    its provenance.json recorded when they were saved): for a folder that another reader than ``from_pretrained``
    loads, such as the checkpoint Trainer resumes."""
    problems = folder_problems(folder)
    if problems:
        raise UsageError(f"`{what}` {str(folder)!r}: cannot load the model: {'; '.join(problems)}")
