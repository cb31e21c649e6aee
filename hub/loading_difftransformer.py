# Written by difftransformer 0.1.0 from its sources (src/difftransformer: ops, layers, models), model code 0e26c40f72130f94; change the package, not this file.
"""Strict loading: a saved folder loads only when its weights are exactly what its config.json describes,
generated from the package's source named below."""

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
from torch import nn

# ---- difftransformer/models/loading.py -------------------------------------------------------------------
_LOADING_LOGGER = "transformers.modeling_utils"


_SHOWN_NAMES = 4  # tensor names a message lists before "and N more"


PROVENANCE_JSON = "provenance.json"


FINGERPRINT_KEY = "saved"


NOT_MODEL_FIELDS = frozenset(
    {"_name_or_path", "architectures", "auto_map", "transformers_version", "dtype", "torch_dtype", "use_cache",
     "attention_backend", "initializer_range", "lambda_std"}
)  # fmt: skip


_CHUNK = 1 << 20  # bytes hashed at a time: the weights are streamed, never read whole


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
    if type(tensor).dequantize is not torch.Tensor.dequantize:
        return tensor.dequantize()
    return tensor


def nonfinite_tensors(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    return [
        name
        for name, tensor in tensors
        if tensor.device.type != "meta"
        and (values := _values(tensor)).is_floating_point()
        and not bool(torch.isfinite(values).all())
    ]


def nonfinite_problem(names: list[str]) -> str | None:
    if not names:
        return None
    verb = "holds" if len(names) == 1 else "hold"
    return f"{_tensors(len(names))} of the weights {verb} NaN or infinite values ({_named_keys(set(names))})"


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def folder_fingerprint(folder: str | os.PathLike) -> dict[str, str]:
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
    path = Path(folder) / PROVENANCE_JSON
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8")).get(FINGERPRINT_KEY)


def fingerprint_problem(folder: str | os.PathLike) -> str | None:
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


def strict_from_pretrained(load: Callable[..., Any], folder: Any, *args: Any, **kwargs: Any) -> Any:
    if folder is None or kwargs.get("output_loading_info"):
        return load(folder, *args, **kwargs)
    if os.path.isdir(folder) and (edited := fingerprint_problem(folder)):
        raise FolderMismatchError(f"{edited}: it would load as another model. {_RESTORE_SAVED}")
    mismatched_allowed = bool(kwargs.get("ignore_mismatched_sizes", False))
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
