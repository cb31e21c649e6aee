"""Strict loading: a saved folder loads only when its weights are exactly what its config.json describes.

transformers' ``from_pretrained`` gives a tensor the weights lack fresh random values, drops a tensor the config has
no place for, and leaves a declared tie undone when the folder holds both tensors, each time logging a table and
carrying on (a tensor of another shape is refused, after the table, with a RuntimeError). A folder whose config.json
was edited after saving (one layer more or less, another vocabulary size, the norm switched off) would then load as
another model. :func:`strict_from_pretrained` reads transformers' own loading report (``output_loading_info``) and
refuses every such folder with one :class:`FolderMismatchError` line; the model classes' ``from_pretrained`` goes
through it, in the package and in the code a saved folder carries, so ``trust_remote_code`` loads refuse too.

Names and shapes are not all: a strict load also refuses weights holding NaN or infinities
(:func:`nonfinite_tensors`), and a folder whose ``provenance.json`` records a fingerprint of what was saved
(:func:`folder_fingerprint`: config.json's model-defining fields and the weights' bytes, written by ``train``) that
the folder no longer matches: a config edit that keeps every shape (``rope_theta``, ``lambda_init``, ``causal``) or
weights changed after the save. A caller who asks for transformers' loading report (``output_loading_info=True``)
gets transformers' load and its report, to inspect as transformers intends; every other load is strict. The vLLM
plugin carries a copy of this file and applies the same checks to a folder's files before vLLM reads them
(:func:`folder_problems`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

# transformers logs its loading report (and the undone tie) here; held during a load, shown only if the load stands
_LOADING_LOGGER = "transformers.modeling_utils"
_SHOWN_NAMES = 4  # tensor names a message lists before "and N more"
# What train records beside a run's settings; its "saved" entry is the fingerprint of the folder's model.
PROVENANCE_JSON = "provenance.json"
FINGERPRINT_KEY = "saved"
# config.json fields that say where a model came from or how it is run, not what it computes from its weights:
# transformers' bookkeeping, the dtype to load in, the cache switch, the operators' choice of kernel, and the
# initialisation of weights that are loaded anyway. An edit of any other field changes the fingerprint.
NOT_MODEL_FIELDS = frozenset(
    {"_name_or_path", "architectures", "auto_map", "transformers_version", "dtype", "torch_dtype", "use_cache",
     "attention_backend", "initializer_range", "lambda_std"}
)  # fmt: skip
_CHUNK = 1 << 20  # bytes hashed at a time: the weights are streamed, never read whole


# What each refusal asks the user to do.
_RESTORE_WEIGHTS = "Restore the weights from a copy or checkpoint saved before they went bad, or train again"
_RESTORE_SAVED = (
    "Restore config.json and the weights as they were saved; to change the model, save it to a new folder"
)


class FolderMismatchError(ValueError):
    """A saved folder a strict load refuses: its weights and config.json disagree, its weights are not finite, or it
    no longer matches its recorded fingerprint (the message says how, in one line)."""


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


def _values(tensor: torch.Tensor) -> torch.Tensor:
    """The values ``tensor`` stands for: a quantized weight's (torchao's tensor subclasses, which implement few
    operators, define their own ``dequantize``), any other tensor itself. Subclasses that keep torch's
    ``Tensor.dequantize``, DTensor's shards among them, are judged as they are: that method has no sharding rule."""
    if type(tensor).dequantize is not torch.Tensor.dequantize:
        return tensor.dequantize()
    return tensor


def nonfinite_tensors(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating-point tensors among ``tensors`` (name, tensor) that hold a NaN or an infinity;
    a quantized weight is judged by its dequantized values."""
    return [
        name
        for name, tensor in tensors
        if tensor.device.type != "meta"
        and (values := _values(tensor)).is_floating_point()
        and not bool(torch.isfinite(values).all())
    ]


def nonfinite_problem(names: list[str]) -> str | None:
    """The refusal's words for :func:`nonfinite_tensors`' ``names``; None when there are none."""
    if not names:
        return None
    verb = "holds" if len(names) == 1 else "hold"
    return f"{_tensors(len(names))} of the weights {verb} NaN or infinite values ({_named_keys(set(names))})"


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def folder_fingerprint(folder: str | os.PathLike) -> dict[str, str]:
    """SHA-256 digests of what defines the model saved in ``folder``: ``config``, of config.json's fields less
    :data:`NOT_MODEL_FIELDS` (as canonical JSON, so key order and spacing do not count), and ``weights``, of the
    bytes of its ``*.safetensors`` files in name order, read a megabyte at a time."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    defining = {key: value for key, value in config.items() if key not in NOT_MODEL_FIELDS}
    config_digest = hashlib.sha256(json.dumps(defining, sort_keys=True).encode("utf-8")).hexdigest()
    weights = hashlib.sha256()
    for path in _weight_files(folder):
        weights.update(path.name.encode("utf-8") + b"\0")
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                weights.update(chunk)
    return {"config": config_digest, "weights": weights.hexdigest()}


def recorded_fingerprint(folder: str | os.PathLike) -> dict[str, str] | None:
    """The fingerprint ``folder``'s provenance.json records (:data:`FINGERPRINT_KEY`); None for a folder that
    records none (written before fingerprints, or not by ``train``)."""
    path = Path(folder) / PROVENANCE_JSON
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8")).get(FINGERPRINT_KEY)


def fingerprint_problem(folder: str | os.PathLike) -> str | None:
    """How ``folder`` differs from the fingerprint its provenance.json recorded when its model was saved (a
    config.json field edited, the weights changed); None when it matches or none is recorded."""
    recorded = recorded_fingerprint(folder)
    if recorded is None:
        return None
    found = folder_fingerprint(folder)
    changed = [what for what in ("config", "weights") if recorded.get(what) != found[what]]
    if not changed:
        return None
    what = {
        "config": "config.json's model-defining fields",
        "weights": "the weights (*.safetensors)",
    }
    return (
        f"{' and '.join(what[name] for name in changed)} changed since the model was saved ({PROVENANCE_JSON} "
        f"records sha256 {', '.join(str(recorded.get(name))[:12] for name in changed)}, the folder has "
        f"{', '.join(found[name][:12] for name in changed)})"
    )


def folder_problems(folder: str | os.PathLike) -> list[str]:
    """What a strict load of ``folder`` refuses that its files show without building the model: weights that
    differ from the recorded fingerprint (:func:`fingerprint_problem`) or that hold NaN or infinite values
    (:func:`nonfinite_tensors`, read tensor by tensor from the ``*.safetensors`` files); empty when there is none.
    The vLLM plugin's check before vLLM reads a weight."""
    problems = [problem] if (problem := fingerprint_problem(folder)) else []
    nonfinite = []
    for path in _weight_files(Path(folder)):
        with safe_open(str(path), framework="pt") as weights:
            nonfinite += nonfinite_tensors((name, weights.get_tensor(name)) for name in weights.keys())
    if problem := nonfinite_problem(nonfinite):
        problems.append(problem)
    return problems


def strict_from_pretrained(load: Callable[..., Any], folder: Any, *args: Any, **kwargs: Any) -> Any:
    """``load(folder, *args, **kwargs)`` (a ``from_pretrained`` of a model or Auto class), refusing with a one-line
    :class:`FolderMismatchError` a folder whose weights and config disagree (:func:`weight_disagreements`), whose
    weights hold NaN or infinite values (:func:`nonfinite_tensors`) or which no longer matches the fingerprint its
    provenance.json recorded (:func:`fingerprint_problem`, a local folder); the loading report transformers logs is
    shown only when the load stands. ``ignore_mismatched_sizes`` keeps its meaning (tensors of another shape are
    drawn anew, as the caller asked). ``output_loading_info=True`` is transformers' load and its ``(model, info)``,
    nothing refused: the caller asked to inspect the report (and a strict caller, such as this function or
    :func:`~difftransformer.models.folders.load_model_folder`, judges it). Without a folder
    (``from_pretrained(None, config=..., state_dict=...)``) the caller's own state dict is loaded as transformers
    loads it."""
    if folder is None or kwargs.get("output_loading_info"):
        return load(folder, *args, **kwargs)
    # an edit the fingerprint sees is refused from the files alone, before any weight is read
    if os.path.isdir(folder) and (edited := fingerprint_problem(folder)):
        raise FolderMismatchError(f"{edited}: it would load as another model. {_RESTORE_SAVED}")
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
    if nonfinite := nonfinite_problem(nonfinite_tensors(model.state_dict().items())):
        raise FolderMismatchError(f"{nonfinite}: the model would compute NaN. {_RESTORE_WEIGHTS}")
    logger = logging.getLogger(_LOADING_LOGGER)
    for record in messages:
        logger.handle(record)
    return model
