"""Strict loading: a saved folder loads only when its weights are exactly what its config.json describes.

transformers' ``from_pretrained`` gives a tensor the weights lack fresh random values, drops a tensor the config has
no place for, and leaves a declared tie undone when the folder holds both tensors, each time logging a table and
carrying on (a tensor of another shape is refused, after the table, with a RuntimeError). A folder whose config.json
was edited after saving (one layer more or less, another vocabulary size, the norm switched off) would then load as
another model. :func:`strict_from_pretrained` reads transformers' own loading report (``output_loading_info``) and
refuses every such folder with one :class:`FolderMismatchError` line; the model classes' ``from_pretrained`` goes
through it, in the package and in the code a saved folder carries, so ``trust_remote_code`` loads refuse too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

# transformers logs its loading report (and the undone tie) here; held during a load, shown only if the load stands
_LOADING_LOGGER = "transformers.modeling_utils"
_SHOWN_NAMES = 4  # tensor names a message lists before "and N more"


class FolderMismatchError(ValueError):
    """A saved folder whose weights and config.json disagree (the message says how, in one line)."""


class _HeldRecords(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


@contextmanager
def _held_loading_messages() -> Iterator[list[logging.LogRecord]]:
    logger = logging.getLogger(_LOADING_LOGGER)
    held = _HeldRecords()
    logger.addFilter(held)
    try:
        yield held.records
    finally:
        logger.removeFilter(held)


def _named_keys(keys: set[str]) -> str:
    """Tensor names, layer by layer (``model.layers.2.*``) or name by name across layers
    (``model.layers.{0, 1}.self_attn.subln.weight``), whichever is shorter, at most :data:`_SHOWN_NAMES` of them."""
    by_layer: dict[str, list[str]] = {}
    by_name: dict[str, list[str]] = {}
    for key in sorted(keys):
        found = re.match(r"^(.*?\.)(\d+)(\..*)$", key)
        if found is None:
            by_layer[key] = by_name[key] = [key]
            continue
        head, index, tail = found.groups()
        by_layer.setdefault(f"{head}{index}.*", []).append(key)
        by_name.setdefault(f"{head}{{}}{tail}", []).append(index)
    layer_names = [name if len(found) > 1 else found[0] for name, found in by_layer.items()]
    tensor_names = [
        name.replace("{}", "{" + ", ".join(found) + "}" if len(found) > 1 else found[0])
        for name, found in by_name.items()
    ]
    shown = min(layer_names, tensor_names, key=len)
    more = f" and {len(shown) - _SHOWN_NAMES} more" if len(shown) > _SHOWN_NAMES else ""
    return ", ".join(shown[:_SHOWN_NAMES]) + more


def _tensors(count: int) -> str:
    return f"{count} tensor" + ("s" if count != 1 else "")


def weight_disagreements(
    model: nn.Module, info: dict[str, Any], *, mismatched_allowed: bool = False
) -> list[str]:
    """How the weights ``model`` was loaded from disagree with its config, from transformers' loading report
    ``info`` (``from_pretrained(..., output_loading_info=True)``): tensors missing, unexpected or of another shape
    (unless ``mismatched_allowed``), and declared ties left undone; empty when they agree. A folder saved by another
    class (its config's ``architectures``: a base model loaded with a head, or the other way) is held to the base
    model the two share: the head's tensors are new or unread, as transformers intends."""
    children = {name.partition(".")[0] for name in model.state_dict()}
    prefix = getattr(model, "base_model_prefix", "")
    saved_by = getattr(model.config, "architectures", None) or []
    if saved_by and type(model).__name__ not in saved_by:
        in_base = (
            (lambda key: key.startswith(f"{prefix}."))
            if prefix in children
            else (lambda key: key.partition(".")[0] in children)
        )
    else:
        in_base = lambda key: True  # noqa: E731  (the folder holds this very class: every tensor counts)
    problems = []
    missing = {key for key in info["missing_keys"] if in_base(key)}
    if missing:
        problems.append(
            f"the weights lack {_tensors(len(missing))} the config asks for ({_named_keys(missing)}), which would "
            "be random"
        )
    unexpected = {key for key in info["unexpected_keys"] if in_base(key)}
    if unexpected:
        problems.append(
            f"the weights hold {_tensors(len(unexpected))} the config has no place for ({_named_keys(unexpected)}), "
            "which would be dropped"
        )
    if info["mismatched_keys"] and not mismatched_allowed:
        shapes = [
            f"{key}: {tuple(saved)} saved, {tuple(built)} from the config"
            for key, saved, built in sorted(info["mismatched_keys"])
        ]
        problems.append(f"{_tensors(len(shapes))} of another shape ({'; '.join(shapes[:_SHOWN_NAMES])})")
    declared = model.get_expanded_tied_weights_keys(all_submodels=True)
    for target, source in sorted(declared.items()):
        if target not in model.all_tied_weights_keys:
            problems.append(
                f"the config ties {target} to {source} (tie_word_embeddings), but the weights hold two different "
                "tensors"
            )
    return problems


def strict_from_pretrained(load: Callable[..., Any], folder: Any, *args: Any, **kwargs: Any) -> Any:
    """``load(folder, *args, **kwargs)`` (a ``from_pretrained`` of a model or Auto class), refusing with a one-line
    :class:`FolderMismatchError` a folder whose weights and config disagree (:func:`weight_disagreements`); the
    loading report transformers logs is shown only when the load stands. ``output_loading_info`` and
    ``ignore_mismatched_sizes`` keep their meaning (the latter lets tensors of another shape be drawn anew, as the
    caller asked). Without a folder (``from_pretrained(None, config=..., state_dict=...)``) the caller's own state
    dict is loaded as transformers loads it."""
    if folder is None:
        return load(folder, *args, **kwargs)
    wants_info = kwargs.pop("output_loading_info", False)
    mismatched_allowed = bool(kwargs.get("ignore_mismatched_sizes", False))
    # Shapes that differ come back in the report rather than as transformers' RuntimeError after its table.
    kwargs["ignore_mismatched_sizes"] = True
    with _held_loading_messages() as messages:
        model, info = load(folder, *args, output_loading_info=True, **kwargs)
    problems = weight_disagreements(model, info, mismatched_allowed=mismatched_allowed)
    if problems:
        raise FolderMismatchError(
            f"config.json and the weights disagree: {'; '.join(problems)}. Restore config.json to the values the "
            "weights were saved with"
        )
    logger = logging.getLogger(_LOADING_LOGGER)
    for record in messages:
        logger.handle(record)
    return (model, info) if wants_info else model
