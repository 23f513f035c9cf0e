"""Crash isolation: a target that kills the interpreter fails one property, with its repro.

Rules:

* Under ``pytest -n`` (pytest-xdist), a worker that dies (a segfault inside torch) is
  replaced and the run goes on; xdist reports the test it was running as failed.
* Before each example runs the target, an xdist worker writes the example's repro (the call
  on that target, without asserts: the crash is the failure) to an in-flight file named after
  its process, in a directory the controller chose. A test that finishes removes its file.
* When xdist reports a crash, the controller adds the crashed worker's in-flight repro to
  the failure, and the property's report cell for that target becomes ``fail``.
* A HypoFuzz worker of ``python -m swapspec.properties.harness.fuzz run`` (``FUZZ_ENV`` set) writes the
  same in-flight file; the campaign runner reads a dead worker's file, reports the crash with
  its repro, and restarts the worker without that fuzz target.
* Without xdist or the campaign runner a crash ends the whole run: nothing can survive its own
  process dying.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

DIR_ENV = "SWAPSPEC_CRASH_DIR"
FUZZ_ENV = "SWAPSPEC_FUZZ_WORKER"  # set in the campaign runner's HypoFuzz workers
CURRENT: dict[str, str] = {}  # the worker's running test: {"nodeid": ...}


_MADE: list[str] = []


def make_directory() -> str:
    """A fresh directory for in-flight files; the controller exports it to its workers."""
    path = os.environ.get(DIR_ENV)
    if not path:
        path = tempfile.mkdtemp(prefix="swapspec-inflight-")
        _MADE.append(path)
        os.environ[DIR_ENV] = path
    return path


def remove_directory() -> None:
    """Remove the directory ``make_directory`` made (not one the environment named)."""
    while _MADE:
        path = _MADE.pop()
        shutil.rmtree(path, ignore_errors=True)
        if os.environ.get(DIR_ENV) == path:
            del os.environ[DIR_ENV]


def _own_file() -> Path | None:
    directory = os.environ.get(DIR_ENV)
    return Path(directory) / f"inflight-{os.getpid()}.json" if directory else None


def record(property_id: str, target: Any, example: Any) -> None:
    """Write the repro of the example about to run (best effort: never fails the test)."""
    path = _own_file()
    xdist = "nodeid" in CURRENT and os.environ.get("PYTEST_XDIST_WORKER")
    if path is None or not (xdist or os.environ.get(FUZZ_ENV)):
        return  # without xdist or the campaign runner nothing would read the file
    from swapspec.properties.harness.repro import apply_repro, call_repro

    try:
        script = (call_repro(example, target, [], verify=False) if example.call is not None
                  else apply_repro(example, target, [], verify=False)
                  if example.conversion is not None else "")
    except Exception as e:  # a repro that cannot be written must not change the verdict
        script = f"# no repro: {type(e).__name__}: {e}"
    entry = {"nodeid": CURRENT.get("nodeid", ""), "property": property_id, "target": target.name,
             "repro": script}
    path.write_text(json.dumps(entry))


def clear() -> None:
    """Forget the in-flight example (its test ended in this process)."""
    path = _own_file()
    if path is not None:
        path.unlink(missing_ok=True)


def read(directory: str, pid: int) -> dict[str, str] | None:
    """The in-flight entry process ``pid`` left in ``directory`` (it died running it), if any."""
    path = Path(directory) / f"inflight-{pid}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def find(nodeid: str) -> dict[str, str] | None:
    """The in-flight entry a crashed worker left for ``nodeid``, if any."""
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return None
    for path in Path(directory).glob("inflight-*.json"):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if entry.get("nodeid") == nodeid:
            path.unlink(missing_ok=True)
            return entry
    return None
