"""Fuzzing the properties with HypoFuzz: a bounded campaign runner and the campaign's report.

``python -m swapspec.properties.fuzz run SECONDS [-n N] [-- pytest arguments]`` runs N HypoFuzz
workers (``hypofuzz.hypofuzz.FuzzWorker``, one process each, the fuzz targets dealt out
round-robin) for SECONDS, then stops them. ``hypothesis fuzz -n N -- ...`` is the same engine
run forever behind HypoFuzz's hub; the hub leaves when no worker has reported within its
first minute, which a loaded machine (collecting the properties and running a target's first
100 examples take longer) makes it do at once, so this runner starts the workers itself.

``python -m swapspec.properties.fuzz report [-- pytest arguments]`` prints, for every fuzz
target (property x target) the arguments select, what the campaign's workers reported to the
database: test cases run (invalid ones apart), behaviours (HypoFuzz's coverage count), test
cases since the last new behaviour (the plateau), and failures saved.

Both use Hypothesis' default database, ``$HYPOTHESIS_STORAGE_DIRECTORY/examples`` (HypoFuzz
fuzzes only tests whose database is the default one); a failure saved there replays in plain
pytest with ``--swapspec-database=$HYPOTHESIS_STORAGE_DIRECTORY/examples``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import signal
import sys
import time
from typing import Any


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def fuzz_targets(pytest_args: list[str]) -> list[Any]:
    """HypoFuzz's fuzz targets for these pytest arguments (its own collection)."""
    from hypofuzz.collection import collect_tests

    return collect_tests(pytest_args).fuzz_targets


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop


def _worker(pytest_args: list[str], nodeids: list[str], seconds: float) -> None:
    """One HypoFuzz worker on ``nodeids`` until ``seconds`` have passed; its report is saved."""
    from hypofuzz import detection
    from hypofuzz.hypofuzz import FuzzWorker

    detection._in_hypofuzz_run = True  # as hypofuzz's own worker entry point sets it
    state = {"hub_state": {"nodeids": nodeids},
             "worker_state": {"nodeids": {}, "current_lifetime": 0.0,
                              "expected_lifetime": 0.0, "valid_nodeids": []}}
    worker = FuzzWorker(pytest_args=pytest_args, shared_state=state)
    signal.signal(signal.SIGALRM, _raise_stop)
    signal.alarm(max(1, int(seconds)))
    try:
        worker.start()
    except _Stop:
        pass
    finally:
        signal.alarm(0)
        current = getattr(worker, "_current_target", None)
        if current is not None:
            current.save_report()


def run(seconds: float, processes: int, pytest_args: list[str]) -> int:
    """Fuzz every target the arguments select for ``seconds`` with ``processes`` workers."""
    start = time.monotonic()
    nodeids = [t.nodeid for t in fuzz_targets(pytest_args)]
    if not nodeids:
        print("fuzz: no fuzz targets collected", file=sys.stderr)
        return 2
    left = seconds - (time.monotonic() - start)
    print(f"fuzz: {len(nodeids)} targets, {processes} worker(s), {left:.0f} s", flush=True)
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker, args=(pytest_args, nodeids[i::processes], left))
               for i in range(processes)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    print(f"fuzz: done after {time.monotonic() - start:.0f} s", flush=True)
    return 0


def target_report(db: Any, target: Any) -> dict[str, Any]:
    """What the workers reported for one target: the latest report of each worker, summed."""
    from hypofuzz.database import FailureState
    from hypofuzz.database.models import Status

    latest: dict[str, Any] = {}
    for report in db.reports.fetch(target.database_key):
        seen = latest.get(report.worker_uuid)
        if seen is None or report.elapsed_time > seen.elapsed_time:
            latest[report.worker_uuid] = report
    counts = {s: sum(r.status_counts.get(s, 0) for r in latest.values()) for s in Status}
    failures = sum(len(list(db.failures(state=state).fetch(target.database_key)))
                   for state in (FailureState.SHRUNK, FailureState.UNSHRUNK))
    plateau = [r.since_new_behavior for r in latest.values() if r.since_new_behavior is not None]
    return {"nodeid": target.nodeid,
            "cases": sum(counts.values()) - counts[Status.OVERRUN],
            "invalid": counts[Status.INVALID],
            "behaviours": max((r.behaviors for r in latest.values()), default=0),
            "since_new": min(plateau) if plateau else None,
            "seconds": sum(r.elapsed_time for r in latest.values()),
            "failures": failures}


def report(pytest_args: list[str]) -> int:
    """Print the campaign's Markdown table for the selected targets, and its totals."""
    from hypofuzz.database import HypofuzzDatabase
    from hypothesis import settings

    db = HypofuzzDatabase(settings().database)
    rows = [target_report(db, t) for t in fuzz_targets(pytest_args)]
    print("| fuzz target | test cases (invalid) | behaviours | since last new | seconds | failures |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        since = "-" if r["since_new"] is None else r["since_new"]
        print(f"| `{r['nodeid']}` | {r['cases']} ({r['invalid']}) | {r['behaviours']} | {since} "
              f"| {r['seconds']:.0f} | {r['failures']} |")
    print(f"\ntotal: {sum(r['cases'] for r in rows)} test cases, "
          f"{sum(r['failures'] for r in rows)} failures, {len(rows)} fuzz targets")
    return 0


def main(argv: list[str] | None = None) -> int:
    ours, pytest_args = _split(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="fuzz", description=__doc__.splitlines()[0],
                                     epilog="after --: pytest arguments selecting the properties "
                                            "(e.g. properties --swapspec-target=torch)")
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="fuzz for a number of seconds")
    go.add_argument("seconds", type=float)
    go.add_argument("-n", "--processes", type=int, default=1)
    sub.add_parser("report", help="print what the campaign reported")
    args = parser.parse_args(ours)
    if args.command == "run":
        return run(args.seconds, args.processes, pytest_args)
    return report(pytest_args)


if __name__ == "__main__":
    sys.exit(main())
