"""Running a repro script the way a user does: a fresh interpreter, in a directory of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_script(script: str, directory: Path, *, pythonpath: Path | None = None,
               timeout: int = 120) -> subprocess.CompletedProcess:
    """Run ``script`` with ``sys.executable`` from ``directory`` (a fresh file there each time);
    ``PYTHONPATH`` is ``pythonpath`` or unset, and no SWAPSPEC_/HYPOTHESIS_ setting is passed on."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"repro_{len(list(directory.glob('repro_*.py')))}.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith(("SWAPSPEC_", "HYPOTHESIS_", "PYTEST_"))}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, path.name], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=timeout)
