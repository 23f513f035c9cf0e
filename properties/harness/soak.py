"""Soak the properties: run the suite N times with fresh random seeds and report every failure.

``python -m swapspec.properties.harness.soak N [options] [-- pytest arguments]`` (``.ci/soak N``) runs
``pytest properties`` N times against one target (``reference`` by default), each run with a
new ``--hypothesis-seed``, alternating ``--swapspec-profile=swapspec-dev`` (even runs) and no
profile at all (odd runs: Hypothesis' own default profile, as a user's plain run has). It
first prints the state of the code it tests (``code_state``: runs on one state add up across
soaks), then one line per run, then the number of runs and of failures, and for each failure
its test, seed, profile, ``@reproduce_failure`` blob and the commands that replay it. It exits 1
if any run failed (a health check, a false positive, a crash: on a correct target every
failure is a bug of the suite), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

PROPERTIES_DIR = Path(__file__).resolve().parent.parent  # the properties folder
PROFILES = ("swapspec-dev", None)  # None: no --swapspec-profile, Hypothesis' default stands
BLOB = re.compile(r"@reproduce_failure\((['\"][^'\"]+['\"]), (b['\"][^'\"]+['\"])\)")


@dataclass
class Failure:
    """One failed test of one run."""

    test: str
    seed: int
    profile: str | None
    blob: str | None  # the ``@reproduce_failure(...)`` decorator, when Hypothesis printed one
    message: str


@dataclass
class Run:
    """One pytest run of the soak."""

    index: int
    seed: int
    profile: str | None
    returncode: int
    seconds: float
    tests: int
    failures: list[Failure]
    code: str = "unknown"  # the state of the code it ran (``code_state``)


NEVER_LOADED = (":(exclude)*.md", ":(exclude)docs", ":(exclude).ci", ":(exclude).mutation")
HOST_ONLY = (":(exclude)tests", ":(exclude)examples")  # loaded by a run only through a host target


def code_pathspecs(target: str) -> tuple[str, ...]:
    """git pathspecs of the code a run of ``target`` can load: every tracked file but documents,
    CI scripts and the mutation tooling, and, when every target named is a built-in one, but the
    project's own tests and the example host too (a built-in target's run imports neither)."""
    from swapspec.properties.harness.targets import BUILTIN_NAMES

    builtin = all(name.strip() in BUILTIN_NAMES for name in target.split(","))
    return (".", *NEVER_LOADED, *(HOST_ONLY if builtin else ()))


def code_state(checkout: Path = PROPERTIES_DIR.parent, target: str = "reference") -> str:
    """The state of the code a run of ``target`` tests: the last commit of the checkout that
    changed a file such a run can load (``code_pathspecs``), with ``+dirty`` when such a file
    differs from HEAD; ``unknown`` outside a git checkout (an installed wheel). Runs of one
    state can be counted together, whatever else was committed between them."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True)

    code = code_pathspecs(target)
    try:
        last = git("log", "-1", "--format=%H", "--", *code)
    except OSError:  # no git on this machine
        return "unknown"
    if last.returncode != 0 or not last.stdout.strip():
        return "unknown"
    dirty = git("diff", "--quiet", "HEAD", "--", *code).returncode != 0
    return last.stdout.strip() + ("+dirty" if dirty else "")


def profile_of(index: int) -> str | None:
    """The profile of run ``index``: even runs swapspec-dev, odd runs Hypothesis' default."""
    return PROFILES[index % len(PROFILES)]


def pytest_command(seed: int, profile: str | None, target: str, junit: str,
                   extra: list[str]) -> list[str]:
    """The pytest command line of one soak run."""
    command = [sys.executable, "-m", "pytest", str(PROPERTIES_DIR), "-q", "-p", "no:cacheprovider",
               f"--swapspec-target={target}", f"--hypothesis-seed={seed}", f"--junitxml={junit}"]
    if profile is not None:
        command.append(f"--swapspec-profile={profile}")
    return [*command, *extra]


def replay_command(failure: Failure, target: str) -> str:
    """A shell command that replays the failure exactly: the failed test alone, given its
    ``@reproduce_failure`` blob (``--swapspec-reproduce``); without a blob, the seed command."""
    if failure.blob is None:
        return seed_command(failure, target)
    return (f"PYTHONHASHSEED=0 pytest '{failure.test}' --swapspec-target={target} "
            f"--swapspec-reproduce=\"{failure.blob}\"")


def seed_command(failure: Failure, target: str) -> str:
    """A shell command that reruns the failed test with the run's seed and profile. It collects
    every property file, as the soak run did: Hypothesis draws some values from constants it
    finds in the local modules loaded, so the same seed with fewer files collected draws other
    examples."""
    profile = f" --swapspec-profile={failure.profile}" if failure.profile else ""
    name = failure.test.rpartition("::")[2]
    return (f"PYTHONHASHSEED=0 pytest properties -k '{name}' --swapspec-target={target} "
            f"--hypothesis-seed={failure.seed}{profile}")


def failures_in(junit: Path, seed: int, profile: str | None) -> tuple[int, list[Failure]]:
    """(number of test cases, the failed or errored ones) from a JUnit XML report."""
    if not junit.exists():
        return 0, []
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    found = []
    for case in cases:
        for bad in (*case.iter("failure"), *case.iter("error")):
            text = f"{bad.get('message', '')}\n{bad.text or ''}"
            blob = BLOB.search(text)
            test = f"{case.get('file') or _file_of(case.get('classname', ''))}::{case.get('name')}"
            found.append(Failure(test, seed, profile,
                                 f"@reproduce_failure({blob[1]}, {blob[2]})" if blob else None,
                                 _headline(bad)))
    return len(cases), found


def _file_of(classname: str) -> str:
    """``properties.rules.test_apply`` -> ``properties/rules/test_apply.py`` (pytest's JUnit classname)."""
    return classname.replace(".", "/") + ".py"


def _headline(element: ET.Element) -> str:
    message = (element.get("message") or (element.text or "").strip()).strip()
    return message.splitlines()[0][:300] if message else element.tag


def soak_once(index: int, target: str, extra: list[str], timeout: float,
              profile: str | None = None, code: str = "unknown") -> Run:
    """One run with a fresh seed (and ``profile``, else the alternation's); a run that fails
    without a JUnit failure (a crash, a usage error, a timeout) counts as one failure of the
    whole run."""
    seed = secrets.randbelow(2**32)
    profile = profile_of(index) if profile is None else (None if profile == "default" else profile)
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory(prefix="swapspec-soak-") as tmp:
        junit = Path(tmp) / "junit.xml"
        start = time.monotonic()
        try:
            done = subprocess.run(pytest_command(seed, profile, target, str(junit), extra),
                                  capture_output=True, text=True, env=env, timeout=timeout)
            returncode, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            returncode, output = -1, f"timed out after {timeout:.0f} s: {e}"
        seconds = time.monotonic() - start
        tests, failures = failures_in(junit, seed, profile)
    if returncode not in (0,) and not failures:
        tail = "\n".join(output.strip().splitlines()[-5:])
        failures = [Failure("<run>", seed, profile, None, f"pytest exit code {returncode}: {tail}")]
    return Run(index, seed, profile, returncode, seconds, tests, failures, code)


def describe(run: Run, total: int) -> str:
    verdict = "ok" if not run.failures else f"{len(run.failures)} FAILED"
    return (f"run {run.index + 1}/{total} seed={run.seed} profile={run.profile or 'default'}: "
            f"{run.tests} tests, {verdict} ({run.seconds:.1f} s)")


def summary(runs: list[Run], target: str) -> list[str]:
    """The final lines: counts, then every failure with its seed, blob and replay command."""
    failures = [f for r in runs for f in r.failures]
    seconds = [r.seconds for r in runs]
    codes = sorted({r.code for r in runs})
    lines = [f"soak: {len(runs)} runs against {target}, {sum(1 for r in runs if r.failures)} "
             f"failed, {len(failures)} failures; code {', '.join(codes) or 'unknown'}"]
    if seconds:
        lines.append(f"soak: run time {min(seconds):.1f}-{max(seconds):.1f} s, "
                     f"mean {sum(seconds) / len(seconds):.1f} s")
    for f in failures:
        lines += [f"FAILURE {f.test} seed={f.seed} profile={f.profile or 'default'}",
                  f"  {f.message}",
                  f"  blob: {f.blob or '(none printed)'}",
                  f"  replay: {replay_command(f, target)}"]
        if f.blob is not None:
            lines.append(f"  replay by seed: {seed_command(f, target)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soak", description=__doc__.splitlines()[0],
                                     epilog="after --: more pytest arguments (-n 2, -k FC-TIES)")
    parser.add_argument("runs", type=int, help="how many runs")
    parser.add_argument("--target", default="reference", help="--swapspec-target (default: reference)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run (default 1800)")
    parser.add_argument("--log", default=None, help="append each run as a JSON line to this file")
    parser.add_argument("--profile", default=None,
                        help="one profile for every run (a swapspec profile, or 'default'); "
                             "default: alternate swapspec-dev and Hypothesis' default")
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser.parse_args(ours)
    runs, code = [], code_state(target=args.target)
    print(f"soak: code {code}", flush=True)
    for index in range(args.runs):
        run = soak_once(index, args.target, extra, args.timeout, args.profile, code)
        runs.append(run)
        print(describe(run, args.runs), flush=True)
        for f in run.failures:
            print(f"  FAILURE {f.test}: {f.message}\n  blob: {f.blob or '(none printed)'}",
                  flush=True)
        if args.log:
            with open(args.log, "a") as log:
                log.write(json.dumps(asdict(run)) + "\n")
    print("\n".join(summary(runs, args.target)))
    return 1 if any(r.failures for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
