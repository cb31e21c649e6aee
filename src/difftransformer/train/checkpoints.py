"""Which of a run's ``checkpoint-N`` folders can be resumed from.

Trainer writes a checkpoint file by file, so a kill during a save leaves a folder that looks like a checkpoint but
is not one. :class:`CompletionMarker` writes a marker after Trainer has finished a save (``on_save`` fires after
the model, optimizer, scheduler, RNG and trainer state are on disk); resuming takes the newest checkpoint that has
the marker and whose files open, and sets aside the others as ``incomplete-checkpoint-N``: a name outside the
``checkpoint-*`` glob of Trainer's checkpoint rotation, which would otherwise take them for checkpoints and delete
them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from safetensors import safe_open
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from difftransformer.storage import write_json
from difftransformer.train.provenance import record_fingerprint

COMPLETE_MARKER = "checkpoint_complete.json"
REQUIRED_FILES = ("model.safetensors", "trainer_state.json", "scheduler.pt")
# The optimizer state as Trainer saves it: optimizer.pt (one process, DDP), optimizer.bin (FSDP's full state dict).
OPTIMIZER_FILES = ("optimizer.pt", "optimizer.bin")
SET_ASIDE_PREFIX = "incomplete-"
_STEP = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


class CompletionMarker(TrainerCallback):
    """Marks each finished checkpoint folder (main process only) by atomically writing its marker file, after
    recording the folder's fingerprint (:func:`~difftransformer.train.provenance.record_fingerprint`), which strict
    loads and a resume check."""

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            record_fingerprint(folder)
            write_json(folder / COMPLETE_MARKER, {"global_step": state.global_step})
        return control


def checkpoint_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot be resumed from, or None if it can."""
    if not (folder / COMPLETE_MARKER).is_file():
        return f"no {COMPLETE_MARKER} (the save did not finish)"
    for name in REQUIRED_FILES:
        if not (folder / name).is_file() or (folder / name).stat().st_size == 0:
            return f"{name} is missing or empty"
    if not any((folder / name).is_file() and (folder / name).stat().st_size > 0 for name in OPTIMIZER_FILES):
        return f"the optimizer state ({' or '.join(OPTIMIZER_FILES)}) is missing or empty"
    try:
        state = json.loads((folder / "trainer_state.json").read_text())
        step = int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"trainer_state.json is unreadable ({error})"
    match = _STEP.match(folder.name)
    if match is None or int(match.group(1)) != step:
        return f"trainer_state.json says step {step}, the folder name says otherwise"
    try:
        with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
            if not list(weights.keys()):
                return "model.safetensors holds no tensors"
    except Exception as error:  # safetensors raises its own error types for a truncated header
        return f"model.safetensors is unreadable ({error})"
    return None


def checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """All ``checkpoint-N`` folders in ``output_dir``, oldest step first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP.match(p.name))]
    return [path for _, path in sorted(found)]


def last_good_checkpoint(output_dir: str | os.PathLike, *, quarantine: bool = True) -> Path | None:
    """The newest checkpoint that passes :func:`checkpoint_problem`. Newer, broken ones are renamed to
    ``incomplete-<name>`` (when ``quarantine``) so Trainer never picks them up, saves on top of them or rotates
    them away."""
    for folder in reversed(checkpoints(output_dir)):
        problem = checkpoint_problem(folder)
        if problem is None:
            return folder
        if quarantine:
            target = folder.with_name(SET_ASIDE_PREFIX + folder.name)
            if target.exists():
                shutil.rmtree(target)
            folder.rename(target)
            print(f"ignoring {folder}: {problem}; moved to {target}")
    return None
