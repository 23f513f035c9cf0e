"""The shell helpers of the regression oracle (``.ci/torch-env``): pins and cache keys per torch version."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _torch_env(call: str, home: Path) -> str:
    proc = subprocess.run(["bash", "-c", f"source .ci/torch-env && {call}"], cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
                          capture_output=True, text=True, timeout=30, check=True)
    return proc.stdout


@pytest.mark.parametrize(("version", "numpy"), [
    ("2.3.0", "numpy<2"), ("2.3.1", "numpy<2"), ("2.4.0", "numpy"), ("2.14.1", "numpy")])
def test_pins_hold_torch_and_the_numpy_its_build_needs(version, numpy, tmp_path):
    assert _torch_env(f"torch_env_pins {version}", tmp_path).split() == [f"torch=={version}", numpy]


def test_each_version_has_its_own_key(tmp_path):
    keys = {_torch_env(f"torch_env_key {v}", tmp_path).strip() for v in ("2.3.0", "2.4.0", "2.14.1")}
    assert len(keys) == 3 and all(len(k) == 16 for k in keys)


def test_release_keeps_the_newest_legs_environment_and_drops_other_pins(tmp_path):
    cache = tmp_path / ".cache" / "swapspec"
    for name in ("torch-2.14.1-new", "torch-2.14.1-old", "torch-2.4.0-new"):
        (cache / name).mkdir(parents=True)
    _torch_env(f"release_torch_env 2.14.1 {cache}/torch-2.14.1-new; "
               f"release_torch_env 2.4.0 {cache}/torch-2.4.0-new", tmp_path)
    assert sorted(p.name for p in cache.iterdir()) == ["torch-2.14.1-new"]
