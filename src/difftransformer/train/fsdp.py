"""Trainer's ``--fsdp`` in our runs: on CPU processes too, and with the checkpoints our runs are made of.

On CPU processes (torchrun over gloo): accelerate turns FSDP on for accelerator devices only: with ``use_cpu`` under torchrun it builds a MULTI_CPU state
(DDP over gloo) and drops the FSDP plugin that Trainer made from ``--fsdp``/``--fsdp-config`` without a word, so
the run would silently be plain DDP. PyTorch's FSDP2 (``fully_shard``) itself shards CPU tensors over gloo, so once
Trainer has built its Accelerator, :func:`enable_fsdp_on_cpu` switches that state to FSDP with the plugin built
from the same arguments. From there accelerate shards the model (one unit per decoder layer and the root), and
Trainer saves and resumes checkpoints, exactly as on GPUs; no sharding is written here.

Checkpoints: a run folder's final model is one ordinary safetensors file and ``--resume`` checks a checkpoint's
``model.safetensors``, which Trainer writes under FSDP only with the full state dict (FSDP's default here);
:func:`check_fsdp_state_dict` refuses the sharded one up front.
"""

from __future__ import annotations

from accelerate.state import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from transformers import Trainer, TrainingArguments

from difftransformer.errors import UsageError


def enable_fsdp_on_cpu(trainer: Trainer) -> bool:
    """Give ``trainer`` (just after ``create_accelerator_and_postprocess``) the FSDP it was asked for when it runs
    on several CPU processes; returns whether it switched. Anywhere else (GPUs, one process, no ``--fsdp``) it
    does nothing."""
    state = trainer.accelerator.state
    if trainer.args.fsdp_plugin_args is None or state.distributed_type != DistributedType.MULTI_CPU:
        return False
    plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)  # what accelerate does for FSDP on GPUs
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    # AcceleratorState copies PartialState's type whenever it is built again: keep the two in step, as it does.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    trainer.is_fsdp_enabled = True
    return True


def check_fsdp_state_dict(args: TrainingArguments) -> None:
    """UsageError unless FSDP (when on) saves full state dicts: the sharded kind leaves no ``model.safetensors`` in
    checkpoints or in the run folder."""
    if not args.fsdp:
        return
    kind = str((args.fsdp_config or {}).get("state_dict_type", "FULL_STATE_DICT"))
    if kind != "FULL_STATE_DICT":
        raise UsageError(
            f"fsdp_config state_dict_type must be FULL_STATE_DICT (a run's checkpoints and final model are "
            f"safetensors files); got {kind}"
        )
