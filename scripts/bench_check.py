"""Has any kind's speed moved? (`make bench-check`; run it alone on the machine before submitting a change to ops/,
layers/ or the vLLM plugin.)

Reruns, in one process with the contenders interleaved, the side-by-side benchmark whose figures docs/bench_check.json
holds for this CPU model (DIFF V1, every other kind and the matched baseline: train steps, greedy decode, peak
memory) and compares every kind's ratio to the baseline with the committed one. Exits 1 naming each ratio that moved
past the figures' noise band (default ±5%, stated in the file; why that band: difftransformer.bench.regression),
0 when none did, 2 on a refusal (no figures for this CPU model, a busy machine), which comes before anything is
timed. A few minutes on 2 CPU cores.

``--write`` measures the figures instead: two passes, written (as this CPU model's entry, with the machine, date,
command, versions and settings) only when every ratio's two passes agree within the band. Take them alone on the
machine and commit the file with the table they go in (docs/performance.md).

Usage: python scripts/bench_check.py [--figures docs/bench_check.json] [--cpu MODEL] [--band 0.05]
       [--ignore-load] [--write]
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from difftransformer.bench.regression import BAND, check, write
from difftransformer.cli import CommandParser, one_line, with_flags
from difftransformer.errors import UsageError
from difftransformer.flags import flag_spellings

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "bench_check.json"


def main(argv: list[str] | None = None) -> int:
    """The command: check (default) or ``--write``; exit status 0 (nothing moved, or written), 1 (moved, or passes
    that disagree) or 2 (refused, one line)."""
    parser = CommandParser(prog="bench_check.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--figures", type=Path, default=FIGURES, help="the figures file (default: %(default)s)"
    )
    parser.add_argument(
        "--write", action="store_true", help="measure this CPU's figures (two passes) and write them"
    )
    parser.add_argument(
        "--cpu",
        help="compare with the figures taken on this CPU model (default: this machine's, /proc/cpuinfo)",
    )
    parser.add_argument(
        "--band",
        type=float,
        help=f"noise band, a share of each ratio (default: the figures' own; --write: {BAND})",
    )
    parser.add_argument(
        "--ignore-load", action="store_true", help="time even on a machine busy with other work"
    )
    args = parser.parse_args(argv)
    command = shlex.join(["python", "scripts/bench_check.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        if args.write:
            if args.cpu is not None:
                raise UsageError(
                    f"`cpu` names the figures a check compares with; --write measures this machine's; got {args.cpu!r}"
                )
            found = write(args.figures, command, band=BAND if args.band is None else args.band,
                          ignore_load=args.ignore_load)  # fmt: skip
        else:
            found = check(args.figures, cpu=args.cpu, band=args.band, ignore_load=args.ignore_load)
    except UsageError as err:
        print(
            f"bench-check: error: {with_flags(one_line(str(err)), flag_spellings(parser, args))}",
            file=sys.stderr,
        )
        return 2
    for line in found:
        print(f"bench-check: {line}", file=sys.stderr)
    if args.write:
        if found:
            print(f"bench-check: {len(found)} ratios' passes disagree by more than the band; nothing written. Run "
                  "alone on the machine, or state a wider --band", file=sys.stderr)  # fmt: skip
            return 1
        print(f"bench-check: wrote this CPU's figures into {args.figures}")
        return 0
    if found:
        print(f"bench-check: {len(found)} ratios moved past the band; if the run was alone on the machine, rerun "
              "once: a ratio that moves twice moved", file=sys.stderr)  # fmt: skip
        return 1
    print(f"bench-check: every ratio is within the band of {args.figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
