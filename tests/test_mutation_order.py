"""Tests of ``.mutation/fastest_first.py``: the mutation run's test order."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fastest_first", ROOT / ".mutation" / "fastest_first.py")
fastest_first = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fastest_first)


def _items(*nodeids: str) -> list:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_tests_run_in_increasing_measured_duration_untimed_last(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    stats = {"duration_by_test": {"slow": 9.0, "fast": 0.1, "middle": 1.5}}
    (tmp_path / "mutmut-stats.json").write_text(json.dumps(stats))
    monkeypatch.chdir(tmp_path)
    items = _items("slow", "untimed", "middle", "fast")
    fastest_first.pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == ["fast", "middle", "slow", "untimed"]


def test_order_left_alone_without_a_stats_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    items = _items("b", "a", "c")
    fastest_first.pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == ["b", "a", "c"]
