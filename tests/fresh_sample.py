"""Draw a derandomized sample in a fresh Python process, so the sample does not depend on what the
calling process has loaded.

Hypothesis draws a share of its integers and floats from the constants written in the loaded
local modules (those outside site-packages and outside test folders). Two processes that loaded
different local modules (a test session's modules depend on what it collected and what its worker
ran before) draw different derandomized samples. The reach floors are therefore measured here: a
fresh interpreter imports every swapspec module (:func:`load_every_swapspec_module`), then draws.

Command (repository root)::

    python tests/fresh_sample.py MODULE:FUNCTION '[ARGS, KWARGS]'   # prints the result as JSON
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def load_every_swapspec_module() -> None:
    """Import every module of swapspec but its test files, so the constants Hypothesis draws from
    are the same for every sample, whichever samples ran before and whatever they imported."""
    for package in ("swapspec.reference", "swapspec.strategies", "swapspec.properties"):
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            if not info.name.rsplit(".", 1)[-1].startswith("test_"):
                importlib.import_module(info.name)


def sample_in_fresh_process(function: str, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` (``'module:name'``) called in a fresh interpreter after
    :func:`load_every_swapspec_module`; its result through JSON (sets become sorted lists)."""
    done = subprocess.run(
        [sys.executable, __file__, function, json.dumps([list(args), kwargs])],
        capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, f"{function} failed in a fresh process:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.splitlines()[-1])


def strategy_tree_features(strategy: str, n: int) -> list[frozenset[str]]:
    """The ``tree_info`` features of ``n`` derandomized draws of the strategy ``'module:name'``."""
    from swapspec.strategies.reach import sample
    from swapspec.strategies.trees import tree_info

    return sample(_resolve(strategy), n, lambda m: tree_info(m).features)


def _resolve(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def main(argv: list[str]) -> int:
    import warnings

    sys.path.insert(0, str(ROOT))
    function, arguments = argv
    args, kwargs = json.loads(arguments)
    load_every_swapspec_module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = _resolve(function)(*args, **kwargs)
    print(json.dumps(_jsonable(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
