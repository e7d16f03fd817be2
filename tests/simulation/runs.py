"""Many seeds of a set, on every CPU: each seed is its own deterministic run, so a
worker process per CPU changes nothing but the wall time.

``RACKBOOT_SIM_SEEDS`` seeds per set (default 200; 10,000 under
``RACKBOOT_TEST_PROFILE=long``), ``RACKBOOT_SIM_WORKERS`` processes (default: the
CPUs this process may use; 1 runs in this process).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable

from tests.simulation.mutations import MUTATIONS, applied
from tests.simulation.scenario import DURATION, SETS, Result, SeedSet, run_seed, with_margin


def default_seeds() -> int:
    long = os.environ.get("RACKBOOT_TEST_PROFILE") == "long"
    return int(os.environ.get("RACKBOOT_SIM_SEEDS", "10000" if long else "200"))


def default_workers() -> int:
    return int(os.environ.get("RACKBOOT_SIM_WORKERS", len(os.sched_getaffinity(0))))


def seed_set_for(name: str, mutation: str | None = None) -> SeedSet:
    seed_set = SETS[name]
    margin = MUTATIONS[mutation].margin if mutation else None
    return seed_set if margin is None else with_margin(seed_set, margin)


def run_seeds(
    set_name: str,
    seeds: Iterable[int],
    *,
    mutation: str | None = None,
    until: Callable[[Result], bool] = lambda result: False,
    duration: float = DURATION,
    trace: bool = False,
    workers: int | None = None,
) -> list[Result]:
    """Results in seed order, up to and including the first for which ``until`` is true."""
    seed_set = seed_set_for(set_name, mutation)
    jobs = [(seed, seed_set, duration, trace) for seed in seeds]
    workers = min(workers or default_workers(), len(jobs))
    results: list[Result] = []
    if workers <= 1:
        with applied(MUTATIONS.get(mutation)):
            for job in jobs:
                results.append(_one(job))
                if until(results[-1]):
                    break
        return results
    context = multiprocessing.get_context("fork")  # a worker starts from this one's imports
    with context.Pool(workers, initializer=_mutate, initargs=(mutation,)) as pool:
        for result in pool.imap(_one, jobs, chunksize=2):
            results.append(result)
            if until(result):
                break  # leaving the block ends the workers
    return results


_kept = []  # a worker's applied mutation: kept, or collecting it would undo the patches


def _mutate(mutation: str | None) -> None:
    """In a worker: the mutation stays applied for the worker's life."""
    _kept.append(applied(MUTATIONS.get(mutation)))
    _kept[-1].__enter__()


def _one(job) -> Result:
    seed, seed_set, duration, trace = job
    return run_seed(seed, seed_set, duration=duration, trace=trace)


def first_caught(set_name: str, mutation: str, seeds: int) -> Result | None:
    """The first seed of the set whose run breaks an invariant under ``mutation``."""
    results = run_seeds(set_name, range(seeds), mutation=mutation, until=lambda r: not r.ok)
    return next((r for r in results if not r.ok), None)
