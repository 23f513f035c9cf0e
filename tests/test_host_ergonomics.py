"""A host's own folder: a top-level module there is a target, and a run with the example
database off writes nothing into it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from swapspec.properties.harness.targets import TargetError, load_target

TOP_LEVEL_TARGET = '''"""A top-level module target: the reference's call, each name written on its own."""
from swapspec import reference

name = "{name}"
lacks = ("tie_weights", "strict")
call_forms = ("dict",)


def functional_call(module, tensors, args=(), kwargs=None):
    return reference.functional_call(module, tensors, args, kwargs, tie_weights=False)
'''


@pytest.fixture
def host(tmp_path, monkeypatch) -> Path:
    """A host folder holding a top-level module target; ``sys.path`` and the module are
    forgotten after the test."""
    folder = tmp_path / "host"
    folder.mkdir()
    (folder / "swapspec_host_modtarget.py").write_text(
        TOP_LEVEL_TARGET.format(name="modtarget"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "swapspec_host_modtarget", raising=False)
    yield folder
    sys.modules.pop("swapspec_host_modtarget", None)


def test_a_top_level_module_is_a_target_not_an_unknown_builtin(host):
    target = load_target("swapspec_host_modtarget", search=[host])
    assert target.name == "modtarget" and target.selector == "swapspec_host_modtarget"
    assert str(host) == sys.path[0]
    assert not target.has("tie_weights")


def test_a_top_level_module_with_an_attribute(host):
    (host / "swapspec_host_modtarget.py").write_text(
        "from types import SimpleNamespace\n" + TOP_LEVEL_TARGET.format(name="mod")
        + "second = SimpleNamespace(name='second', functional_call=functional_call)\n")
    assert load_target("swapspec_host_modtarget:second", search=[host]).name == "second"


def test_a_module_found_nowhere_says_it_is_neither_builtin_nor_importable(host):
    with pytest.raises(TargetError) as caught:
        load_target("swapspec_host_nosuch", search=[host])
    message = str(caught.value)
    assert "not a built-in name (reference, torch, torch-stateless)" in message
    assert "No module named 'swapspec_host_nosuch'" in message
    assert "pythonpath" in message
    assert str(host) not in sys.path  # searched, not added


def test_a_builtin_name_stays_builtin(host):
    assert load_target("torch", search=[host]).name == "torch"


@pytest.mark.slow  # a pytest run in a subprocess: CI-only (see pyproject's markers)
def test_a_host_run_imports_its_folder_and_writes_nothing_there(tmp_path):
    """The installed route from the host's folder: ``pytest`` (not ``python -m pytest``, which
    would put the folder on ``sys.path`` itself), its database off, no storage directory set."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "modtarget.py").write_text(TOP_LEVEL_TARGET.format(name="modtarget"))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SWAPSPEC_", "PYTEST_", "HYPOTHESIS_", "PYTHONPATH"))
           and k not in ("CI", "TF_BUILD")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # Python's own caches are not the suite's writes
    pytest_script = Path(sys.executable).with_name("pytest")
    run = subprocess.run(
        [str(pytest_script), "-p", "no:cacheprovider", "-p", "no:xdist", "--pyargs",
         "swapspec.properties", "--swapspec-target=modtarget", "--swapspec-property=FC-ORACLE",
         "--swapspec-profile=swapspec-ci"],
        cwd=host, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "FC-ORACLE | pass" in run.stdout
    assert sorted(p.name for p in host.iterdir()) == ["modtarget.py"]
