"""Fuzzing the properties with HypoFuzz: a bounded campaign runner and the campaign's report.

``python -m swapspec.properties.harness.fuzz run SECONDS [-n N] [--stop-on-failure] [-- pytest arguments]``
runs N HypoFuzz workers (``hypofuzz.hypofuzz.FuzzWorker``, one process each, the fuzz targets
dealt out round-robin) for SECONDS (or until a shrunk failure is saved), then stops them. ``hypothesis fuzz -n N -- ...`` is the same engine
run forever behind HypoFuzz's hub; the hub leaves when no worker has reported within its
first minute, which a loaded machine (collecting the properties and running a target's first
100 examples take longer) makes it do at once, so this runner starts the workers itself. A
worker that dies (a segfault inside torch) is reported with the fuzz target and the repro of the
example it was running, and restarted without that target for the time left; the run then exits 1.

``python -m swapspec.properties.harness.fuzz report [-- pytest arguments]`` prints, for every fuzz
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
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from swapspec.properties.harness import crashes

MIN_RESTART_S = 30  # a dead worker is restarted only with at least this much time left
STOP_GRACE_S = 60  # a worker still running this long after the deadline is terminated
POLL_S = 2.0  # how often a --stop-on-failure campaign looks for a saved failure


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def fuzz_targets(pytest_args: list[str]) -> list[Any]:
    """HypoFuzz's fuzz targets for these pytest arguments (its own collection)."""
    from hypofuzz.collection import collect_tests

    return collect_tests(pytest_args).fuzz_targets


class _Stop(BaseException):
    """The campaign's time is up. A BaseException, so that neither Hypothesis nor HypoFuzz takes
    it for a failure of the test it interrupts."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop


def _worker(pytest_args: list[str], nodeids: list[str], seconds: float, inflight: str) -> None:
    """One HypoFuzz worker on ``nodeids`` until ``seconds`` have passed; its report is saved.
    Each example it runs leaves its in-flight repro in ``inflight`` (see ``crashes``)."""
    from hypofuzz import detection
    from hypofuzz.hypofuzz import FuzzWorker

    os.environ[crashes.DIR_ENV], os.environ[crashes.FUZZ_ENV] = inflight, "1"
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


@dataclass
class Crash:
    """A worker that died: its exit code, and the fuzz target and repro of its last example."""

    exitcode: int
    nodeid: str
    repro: str


def crashed_target(entry: dict[str, str] | None, nodeids: list[str],
                   properties: dict[str, tuple[str, str]]) -> str | None:
    """The fuzz target among ``nodeids`` whose (property, target) the in-flight entry names."""
    if entry is None:
        return None
    named = (entry.get("property"), entry.get("target"))
    return next((n for n in nodeids if properties.get(n) == named), None)


def _save_crash(crash: Crash, storage: Path) -> Path:
    """Write a crash's repro to ``storage/crashes/``; its path."""
    folder = storage / "crashes"
    folder.mkdir(parents=True, exist_ok=True)
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in crash.nodeid.rpartition("::")[2])
    path = folder / f"{name.strip('-') or 'unknown'}.py"
    path.write_text(crash.repro or f"# no repro: the worker died (exit code {crash.exitcode})\n")
    return path


def _properties_of(targets: list[Any]) -> dict[str, tuple[str, str]]:
    """``{nodeid: (property id, target name)}`` for HypoFuzz's fuzz targets."""
    found = {}
    for t in targets:
        item = getattr(t, "pytest_item", None)
        marker = item.get_closest_marker("swapspec_property") if item is not None else None
        target = getattr(getattr(item, "callspec", None), "params", {}).get("target")
        if marker is not None and target is not None:
            found[t.nodeid] = (marker.args[0], target.name)
    return found


def run(seconds: float, processes: int, pytest_args: list[str],
        stop_on_failure: bool = False) -> int:
    """Fuzz every target the arguments select for ``seconds`` with ``processes`` workers
    (``stop_on_failure``: stop as soon as a shrunk failure is saved).

    A worker that dies (a crash inside torch) is reported with the fuzz target and repro of
    the example it was running (also written to ``$HYPOTHESIS_STORAGE_DIRECTORY/crashes/``), and
    restarted for the time left without that target. Exit status 1 when a worker died."""
    start = time.monotonic()
    targets = fuzz_targets(pytest_args)
    nodeids = [t.nodeid for t in targets]
    if not nodeids:
        print("fuzz: no fuzz targets collected", file=sys.stderr)
        return 2
    properties = _properties_of(targets)
    left = seconds - (time.monotonic() - start)
    print(f"fuzz: {len(nodeids)} targets, {processes} worker(s), {left:.0f} s", flush=True)
    storage = Path(os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY", ".hypothesis"))
    failed = partial(failure_saved, targets) if stop_on_failure else None
    crashed: list[Crash] = []
    with tempfile.TemporaryDirectory(prefix="swapspec-fuzz-inflight-") as inflight:
        shares = [nodeids[i::processes] for i in range(processes)]
        with ThreadPoolExecutor(max_workers=processes) as pool:
            for found in pool.map(lambda share: _supervise(pytest_args, share, start + seconds,
                                                           inflight, properties, failed), shares):
                crashed += found
    for crash in crashed:
        path = _save_crash(crash, storage)
        print(f"fuzz: CRASH (exit code {crash.exitcode}) in {crash.nodeid or 'an unknown target'}; "
              f"repro: {path}", flush=True)
    print(f"fuzz: done after {time.monotonic() - start:.0f} s, {len(crashed)} crash(es)", flush=True)
    return 1 if crashed else 0


def _supervise(pytest_args: list[str], share: list[str], deadline: float, inflight: str,
               properties: dict[str, tuple[str, str]],
               failed: Callable[[], bool] | None = None) -> list[Crash]:
    """Run one worker on ``share`` until ``deadline`` (or until ``failed()``), restarting it
    without the target it died on; the crashes."""
    context = multiprocessing.get_context("spawn")
    crashes_seen: list[Crash] = []
    while share and deadline - time.monotonic() > MIN_RESTART_S:
        worker = context.Process(target=_worker, args=(pytest_args, share,
                                                       deadline - time.monotonic(), inflight))
        worker.start()
        _wait(worker, deadline + STOP_GRACE_S, failed)
        if worker.is_alive():  # a failure was saved, or it ignored its alarm: stop it
            worker.terminate()
            worker.join()
            break
        if worker.exitcode == 0:
            break
        entry = crashes.read(inflight, worker.pid)
        nodeid = crashed_target(entry, share, properties)
        crashes_seen.append(Crash(worker.exitcode, nodeid or "", (entry or {}).get("repro", "")))
        if nodeid is None:
            break  # no way to tell which target killed it: restarting would only repeat it
        share = [n for n in share if n != nodeid]
    return crashes_seen


def _wait(worker: Any, until: float, failed: Callable[[], bool] | None) -> None:
    """Wait for ``worker`` to end, at most until ``until``, or until ``failed()`` holds."""
    while worker.is_alive() and time.monotonic() < until:
        worker.join(timeout=POLL_S)
        if failed is not None and failed():
            return


def failure_saved(targets: list[Any]) -> bool:
    """Whether HypoFuzz has saved a shrunk failure for any of ``targets``."""
    from hypofuzz.database import FailureState, HypofuzzDatabase
    from hypothesis import settings

    db = HypofuzzDatabase(settings().database)
    return any(next(iter(db.failures(state=FailureState.SHRUNK).fetch(t.database_key)), None)
               is not None for t in targets)


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
    go.add_argument("--stop-on-failure", action="store_true",
                    help="stop as soon as a shrunk failure is saved")
    sub.add_parser("report", help="print what the campaign reported")
    args = parser.parse_args(ours)
    if args.command == "run":
        return run(args.seconds, args.processes, pytest_args, args.stop_on_failure)
    return report(pytest_args)


if __name__ == "__main__":
    sys.exit(main())
