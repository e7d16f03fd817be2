"""Long mode: ``python -m tests.simulation [--seeds N] [--start S] [--duration D]``,
or replay one seed with its trace: ``python -m tests.simulation --seed S --trace``.

Prints a summary with the seeds of any failure; exits 1 if one failed.
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.simulation.scenario import run_seed, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation")
    parser.add_argument("--seeds", type=int, default=2000, help="how many seeds (default 2000)")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--seed", type=int, help="run this one seed")
    parser.add_argument("--duration", type=float, default=16.0, help="virtual seconds per seed")
    parser.add_argument("--trace", action="store_true", help="print the seed's trace")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    results, started = [], time.monotonic()
    for seed in seeds:
        result = run_seed(seed, duration=args.duration, trace=args.trace)
        results.append(result)
        if args.trace:
            print("\n".join(result.trace or ()))
        if not result.ok:
            print(f"seed {seed}: FAILED: {result.violations[0]}", flush=True)
        elif len(results) % 100 == 0:
            print(f"{len(results)} seeds ...", flush=True)
    print(summary(results))
    print(f"{time.monotonic() - started:.1f} s of real time")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
