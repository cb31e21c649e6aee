"""Where a benchmark ran: the CPU's model as the operating system names it, the threads, the load and the versions.
A ratio measured on one CPU model says little about another (docs/performance.md keeps a table per CPU vendor), so
every result records its machine."""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone
from pathlib import Path

import torch

from difftransformer.storage import versions

CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model and the widest vector instructions torch's kernels use on it: /proc/cpuinfo's first
    ``model name`` (Linux on x86 and most ARM servers), else what :func:`platform.processor` says, else the
    architecture, then torch's CPU capability (``"AMD EPYC, AVX512"``). The operating system may name two CPUs alike
    whose kernels differ: the package's C++ kernels are compiled for the machine they run on, and an AMD EPYC with
    AVX-512 and one with AVX2 alone read DIFF V1's train step at 2,048 tokens 0.94 and 1.19 of the baseline's
    (docs/performance.md)."""
    name = None
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name" and value.strip():
                name = value.strip()
                break
    except OSError:
        pass  # not Linux: the platform's own name below
    return f"{name or platform.processor() or platform.machine()}, {torch.backends.cpu.get_cpu_capability()}"


def environment(device: torch.device, command: str) -> dict:
    """The machine a measurement ran on and how: ``command``, the UTC date, the versions, the device, the CPU's
    model, its logical CPUs, torch's threads and the load averages when asked."""
    env = dict(
        command=command,
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        versions=versions(),
        device=str(device),
        cpu=cpu_model(),
        logical_cpus=os.cpu_count(),
        threads=torch.get_num_threads(),
    )
    if hasattr(os, "getloadavg"):
        env["load_average_1_5_15"] = list(os.getloadavg())
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env
