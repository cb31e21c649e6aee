"""Trainer's ``--fsdp`` on CPU processes (torchrun over gloo).

accelerate turns FSDP on for accelerator devices only: with ``use_cpu`` under torchrun it builds a MULTI_CPU state
(DDP over gloo) and drops the FSDP plugin that Trainer made from ``--fsdp``/``--fsdp-config`` without a word, so
the run would silently be plain DDP. PyTorch's FSDP2 (``fully_shard``) itself shards CPU tensors over gloo, so once
Trainer has built its Accelerator, :func:`enable_fsdp_on_cpu` switches that state to FSDP with the plugin built
from the same arguments. From there accelerate shards the model (one unit per decoder layer and the root), and
Trainer saves and resumes checkpoints, exactly as on GPUs; no sharding is written here.
"""

from __future__ import annotations

from accelerate.state import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from transformers import Trainer


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
