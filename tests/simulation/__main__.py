"""Long mode: ``python -m tests.simulation [--set NAME] [--seeds N] [--start S]``, one
seed with its trace: ``python -m tests.simulation --set NAME --seed S --trace``, or how
many seeds catch a mutation: ``python -m tests.simulation --mutation NAME``.

Prints a summary per set with the seeds of any failure; exits 1 if one failed (with
``--mutation``: if no seed caught it).
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.simulation.mutations import MUTATIONS
from tests.simulation.runs import default_workers, run_seeds
from tests.simulation.scenario import CI_SETS, DURATION, SETS, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation")
    parser.add_argument("--set", choices=[*SETS, "all"], help="seed set (default: all CI sets)")
    parser.add_argument("--seeds", type=int, default=2000, help="seeds per set (default 2000)")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--seed", type=int, help="run this one seed")
    parser.add_argument("--duration", type=float, default=DURATION, help="virtual s per seed")
    parser.add_argument("--trace", action="store_true", help="print the seed's trace")
    parser.add_argument("--mutation", choices=MUTATIONS, help="run with this mutation applied")
    parser.add_argument("--workers", type=int, default=default_workers(), help="processes")
    parser.add_argument("--list", action="store_true", help="list the sets and mutations")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(f"set {s.name}: {s.doc}" for s in SETS.values()))
        print("\n".join(f"mutation {m.name} ({m.set}): {m.doc}" for m in MUTATIONS.values()))
        return 0
    mutation = MUTATIONS.get(args.mutation)
    names = [args.set or (mutation.set if mutation else "all")]
    if names == ["all"]:
        names = CI_SETS
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    failed = caught = 0
    for name in names:
        started = time.monotonic()
        results = run_seeds(
            name, seeds, mutation=args.mutation, duration=args.duration, trace=args.trace,
            workers=1 if args.trace else args.workers,
        )  # fmt: skip
        for result in results:
            if args.trace:
                print("\n".join(result.trace or ()))
        print(f"set {name}" + (f", mutation {args.mutation}" if mutation else ""))
        print(summary(results))
        print(f"{time.monotonic() - started:.1f} s of real time")
        failed += sum(not r.ok for r in results)
        if mutation:
            hits = [r.seed for r in results if any(mutation.expect in v for v in r.violations)]
            caught += len(hits)
            print(f"caught ({mutation.expect!r}) in {len(hits)} of {len(results)} seeds: {hits}")
    if mutation:
        return 0 if caught else 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
