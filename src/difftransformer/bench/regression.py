"""`make bench-check`: the side-by-side benchmark (DIFF V1, every other kind and the baseline, in one process, medians
of interleaved rounds) against the figures committed for this CPU, failing on every ratio that moved past their
noise band. ``scripts/bench_check.py`` is its command; ``--write`` measures the figures.

The figures file (docs/bench_check.json) holds one entry per CPU model, each with the machine, date, command,
versions, the noise band, the settings it was measured with and every ratio (a kind's cost over the baseline's in
the train, decode and memory sections, beside its FLOP ratio). A check reruns the entry's own settings, so what it
compares was measured alike; figures taken on another CPU model are refused unless the CPU is named.

The band is relative: a ratio moved when it differs from the committed one by more than ``band`` times the committed
one. :data:`BAND` is 5% because targets and FLOP floors sit a few percent apart (DIFF V1's train target is 1.00;
it read 1.03-1.05 on an Intel Xeon, 2026-12-06, issue 47), so a wider band would let a kind slip past its target
unnoticed, while three decode runs alone on one machine spread 1.5% (docs/performance.md, 2026-12-06). Runs of the
same code alone on one machine have also read 12% apart (train at 2,048 tokens, issue 47), so ``--write`` measures
:data:`PASSES` passes and refuses to commit figures whose passes disagree by more than the band: the band is
checked on the machine it is stated for, and the figure is the passes' median.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from difftransformer.bench.machine import cpu_model, environment
from difftransformer.bench.report import format_kinds_table, kind_ratios
from difftransformer.bench.sections import measure
from difftransformer.bench.settings import BenchSettings
from difftransformer.errors import UsageError
from difftransformer.storage import check_output_file, read_json, versions, write_json

BAND = 0.05
PASSES = 2
# The most other work the machine may carry when a run starts, as its 1-minute load average: beside other work the
# same harness read DIFF V1 / baseline anywhere from 0.81 to 2.29 (issue 47).
LOAD_LIMIT = 1.0


def check_settings(threads: int) -> BenchSettings:
    """What bench-check measures, in a few minutes on 2 cores: train steps at 512 and 2,048 tokens (batch 4),
    greedy decode at batch 1 and 8 (64 tokens after a 512-token prompt), peak train memory; every kind at its bench
    point, no DiffLlama (not ours to guard); 7 rounds after a warm-up; ``threads`` threads."""
    return BenchSettings(
        sections=("train", "decode", "memory"),
        train_lengths=(512, 2048),
        decode_batches=(1, 8),
        new_tokens=64,
        repeats=7,
        warmup=1,
        threads=threads,
        diffllama=False,
    )


def ratio_key(row: dict, kind: str) -> str:
    """A ratio's name: its section, setting and kind ("train T=512 B=4 diff_v2")."""
    return f"{row['section']} {row['setting']} {kind}"


def ratios(rows: list[dict]) -> dict[str, float]:
    """Every kind's cost over the baseline in ``rows``, by :func:`ratio_key`."""
    return {ratio_key(row, kind): value for row in rows for kind, value in kind_ratios(row).items()}


def flop_ratios(rows: list[dict]) -> dict[str, float]:
    """Every kind's FLOPs over the baseline's in ``rows`` (train and decode), by :func:`ratio_key`."""
    return {
        ratio_key(row, kind): value
        for row in rows
        for kind, value in row.get("flops_over_baseline", {}).items()
    }


def moved(committed: dict[str, float], measured: dict[str, float], band: float) -> list[str]:
    """One line for every ratio that moved past ``band`` (relative to the committed one), that the committed
    figures hold and this run did not measure, or that this run measured and they do not hold."""
    lines = []
    for key, was in committed.items():
        if key not in measured:
            lines.append(f"{key}: committed {was:.3f}, not measured")
            continue
        change = measured[key] / was - 1
        if abs(change) > band:
            way = "slower: find why" if change > 0 else "faster: commit new figures with --write"
            lines.append(
                f"{key}: {measured[key]:.3f} against {was:.3f} committed ({change:+.1%}, past ±{band:.0%}; {way})"
            )
    lines += [f"{key}: measured {value:.3f}, not in the committed figures" for key, value in measured.items()
              if key not in committed]  # fmt: skip
    return lines


def disagreements(passes: list[dict[str, float]], band: float) -> list[str]:
    """One line for every ratio whose passes lie further apart than ``band`` (largest over smallest)."""
    lines = []
    for key in passes[0]:
        values = [ratios_[key] for ratios_ in passes]
        if max(values) / min(values) - 1 > band:
            lines.append(f"{key}: passes read {', '.join(f'{v:.3f}' for v in values)}")
    return lines


def read_figures(path: Path) -> list[dict]:
    """The entries of a figures file, one per CPU model; a UsageError naming ``path`` for a file that is missing,
    unreadable or not a figures file."""
    if not path.exists():
        raise UsageError(
            f"`figures` {path} does not exist: `python scripts/bench_check.py --write` measures this CPU's figures "
            "(alone on the machine)"
        )
    document = read_json(path)
    entries = document.get("figures") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and {"machine", "band", "settings", "ratios"} <= set(e) for e in entries
    ):
        raise UsageError(
            f"`figures` {path} is not a bench-check figures file (a list of entries under 'figures')"
        )
    return entries


def entry_for(entries: list[dict], cpu: str, path: Path) -> dict:
    """The entry measured on the CPU model ``cpu``; a UsageError naming the models ``path`` holds otherwise."""
    for entry in entries:
        if entry["machine"]["cpu"] == cpu:
            return entry
    held = "; ".join(repr(e["machine"]["cpu"]) for e in entries) or "none"
    raise UsageError(
        f"`cpu`: {path} holds no figures taken on {cpu!r} (it holds {held}); measure this CPU's alone with --write, "
        "or name one of those with --cpu to compare across CPUs"
    )


def check_quiet(ignore_load: bool) -> None:
    """Refuse to time on a machine already busy (1-minute load average above :data:`LOAD_LIMIT`) unless told to."""
    if ignore_load or not hasattr(os, "getloadavg"):
        return
    load = os.getloadavg()[0]
    if load > LOAD_LIMIT:
        raise UsageError(
            f"the machine is busy: its 1-minute load average is {load:.2f}, above {LOAD_LIMIT}; timings taken beside "
            "other work say nothing. Run alone, or pass `ignore_load` to time anyway"
        )


def check(
    path: Path,
    *,
    cpu: str | None = None,
    band: float | None = None,
    ignore_load: bool = False,
    say: Callable[[str], None] = print,
) -> list[str]:
    """Measure the settings of the figures ``path`` holds for ``cpu`` (default: this machine's CPU model) and
    return one line for every ratio that moved past ``band`` (default: the figures' own); empty when none did.
    Every refusal (no figures for the CPU, a busy machine, settings this version does not take) is a UsageError
    raised before anything is timed."""
    if band is not None and not 0 < band < 1:
        raise UsageError(f"`band` must lie in (0, 1) (a share of the committed ratio); got {band}")
    here = cpu_model()
    entry = entry_for(read_figures(path), cpu or here, path)
    try:
        settings = BenchSettings.from_json(entry["settings"])
    except UsageError as err:
        raise UsageError(
            f"`figures` {path}: its settings do not run with this version on this machine ({err}); write them "
            "again with --write"
        ) from err
    check_quiet(ignore_load)
    band = entry["band"] if band is None else band
    machine = entry["machine"]
    if machine["cpu"] != here:
        say(f"bench-check: comparing this {here!r} with figures taken on {machine['cpu']!r}, as asked")
    if machine.get("versions") != versions():
        say(f"bench-check: note: the figures were taken with {machine.get('versions')}; this is {versions()}")
    say(f"bench-check: measuring the settings of {path}'s figures for {machine['cpu']!r} ({machine.get('date')}, "
        f"{machine.get('command')}), band ±{band:.0%}")  # fmt: skip
    rows = measure(settings)
    say(format_kinds_table(rows))
    committed = {key: value["ratio"] for key, value in entry["ratios"].items()}
    return moved(committed, ratios(rows), band)


def write(
    path: Path,
    command: str,
    *,
    band: float = BAND,
    settings: BenchSettings | None = None,
    passes: int = PASSES,
    ignore_load: bool = False,
    say: Callable[[str], None] = print,
) -> list[str]:
    """Measure ``settings`` (default: :func:`check_settings` with torch's threads) ``passes`` times and, when
    every ratio's passes agree within ``band``, write their medians into ``path`` as this CPU model's entry (the
    entries of other CPUs kept); return one line for every ratio whose passes disagree (nothing written then)."""
    if not 0 < band < 1:
        raise UsageError(f"`band` must lie in (0, 1) (a share of the committed ratio); got {band}")
    if passes < 2:
        raise UsageError(f"`passes` must be at least 2 (the band is checked on their spread); got {passes}")
    entries = read_figures(path) if path.exists() else []
    check_output_file(path, "figures")
    check_quiet(ignore_load)
    settings = settings or check_settings(torch.get_num_threads())
    runs = []
    for index in range(passes):
        say(f"bench-check: pass {index + 1} of {passes}")
        rows = measure(settings)
        say(format_kinds_table(rows))
        runs.append(rows)
    measured = [ratios(rows) for rows in runs]
    found = disagreements(measured, band)
    if found:
        return found
    machine = environment(torch.device(settings.device), command)
    entry = dict(
        machine=machine,
        band=band,
        settings=settings.to_json(),
        ratios={
            key: dict(
                ratio=statistics.median(m[key] for m in measured),
                passes=[m[key] for m in measured],
                flops=flop_ratios(runs[0]).get(key),
            )
            for key in measured[0]
        },
        passes=runs,
    )
    kept = [e for e in entries if e["machine"]["cpu"] != machine["cpu"]]
    write_json(path, dict(figures=[*kept, entry]))
    return []
