"""Unit tests of the deviation machinery and the report's table: no subprocesses, no target calls."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from swapspec.properties import vocabulary
from swapspec.properties.harness import checker
from swapspec.properties.harness.checker import Checker, ConformanceError
from swapspec.properties.harness.report import (
    cell_note,
    conformance_table,
    render_cell,
    render_table,
)
from swapspec.properties.harness.targets import BUILTIN_NAMES, builtin_target
from swapspec.properties.vocabulary import Deviation, version_in_range
from tests.helpers_modules import torch_swap_flag_set

# ---- version_in_range ----------------------------------------------------------------------


@pytest.mark.parametrize(("version", "lowest", "below", "inside"), [
    ("2.13.0+cpu", None, None, True),
    ("2.13.0+cpu", "2.9", None, True),   # numeric, not string, comparison: 13 > 9
    ("2.13.0", None, "2.9", False),
    ("2.5.0", "2.5.0", None, True),      # lowest is inclusive
    ("2.5.0", None, "2.5.0", False),     # below is exclusive
    ("2.4.1", "2.5", None, False),
    ("2.5.1", "2.5", "2.6", True),
    ("2.6.0", "2.5", "2.6", False),
    ("2.6.0.dev20250101+cu121", "2.6", "2.7", True),
    ("2.6.0a0+git1234abc", "2.6", None, True),
    ("2.9.0+cpu", "2.9.0", "2.9.1", True),
    ("10.0.0", None, "9.9", False),
])
def test_version_in_range(version, lowest, below, inside):
    assert version_in_range(version, lowest, below) is inside


def test_version_in_range_release_candidate_is_below_next_patch():
    assert version_in_range("2.5.0rc1", None, "2.5.1")


def test_version_in_range_short_version_equals_its_padded_bound():
    assert version_in_range("2.5", "2.5.0", None)


def test_holds_for_installed_torch_reads_torch_version(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.4.0+cpu")
    only_25 = Deviation("P", lambda e: True, "c", "r", torch_versions=("2.5", None))
    assert not only_25.holds_for_installed_torch()
    monkeypatch.setattr(torch, "__version__", "2.5.0+cpu")
    assert only_25.holds_for_installed_torch()


# ---- Checker.verdict ----------------------------------------------------------------------


@pytest.fixture(autouse=True)
def restore_observed():
    """Checker.verdict counts into process-global counters; put them back after each test."""
    counters = (checker.OBSERVED, checker.DECLARED, checker.DECLARED_SHOWN,
                checker.UNDECLARED, checker.UNDECLARED_MESSAGES, checker.NOT_RUN)
    saved = [dict(c) for c in counters]
    for c in counters:
        c.clear()
    yield
    for c, kept in zip(counters, saved, strict=True):
        c.clear()
        c.update(kept)


def _target(*declared: Deviation, name: str = "planted") -> SimpleNamespace:
    return SimpleNamespace(name=name, deviations=list(declared))


EXAMPLE = SimpleNamespace(kind="tied")


def _always(clause: str, property_id: str = "APPLY-TIES", **kw) -> Deviation:
    return Deviation(property_id, lambda e: True, clause, "declared reason\nsecond line", **kw)


def test_unexplained_violation_raises_with_rule_and_repro():
    check = Checker("APPLY-TIES", _target(), EXAMPLE)
    assert check.that(True, "fine", "not shown")
    assert not check.that(False, "tie-split", "names a, b hold 2 objects", code="a is b")
    seen = []

    def repro(violations):
        seen.append([v.clause for v in violations])
        return "print('repro body')"

    with pytest.raises(ConformanceError) as e:
        check.verdict(repro)
    text = str(e.value)
    assert text.startswith("APPLY-TIES on target 'planted':")
    assert "  broken rule [tie-split]: names a, b hold 2 objects" in text
    assert "fine" not in text
    assert text.endswith("standalone repro: printed below as 'swapspec standalone repro'")
    assert "repro body" not in text  # the script is a report section, not part of the message
    assert e.value.repro == "print('repro body')"
    assert [v.clause for v in e.value.violations] == ["tie-split"]
    assert seen == [["tie-split"]]
    assert not checker.OBSERVED


def test_no_repro_env_var_leaves_the_repro_out(monkeypatch):
    monkeypatch.setenv("SWAPSPEC_NO_REPRO", "1")
    check = Checker("APPLY-TIES", _target(), EXAMPLE)
    check.that(False, "tie-split", "split")
    with pytest.raises(ConformanceError) as e:
        check.verdict(lambda v: "print('repro body')")
    assert "standalone repro" not in str(e.value) and e.value.repro == ""
    assert "broken rule [tie-split]" in str(e.value)


def test_stale_declaration_raises():
    check = Checker("APPLY-TIES", _target(_always("tie-split")), EXAMPLE)
    check.that(True, "tie-split", "held")
    with pytest.raises(ConformanceError) as e:
        check.verdict()
    text = str(e.value)
    assert "stale deviation [tie-split]: declared (declared reason) but the target now " \
           "follows the spec here" in text
    assert "second line" not in text
    assert "broken rule" not in text
    assert not checker.OBSERVED


def test_covered_violation_passes_and_is_counted():
    target = _target(_always("tie-split"))
    for _ in range(2):
        check = Checker("APPLY-TIES", target, EXAMPLE)
        check.that(False, "tie-split", "split")
        check.that(False, "tie-split", "split again")  # one example counts once
        check.verdict()
    assert dict(checker.OBSERVED) == {("APPLY-TIES", "planted", "tie-split"): 2}


def test_covered_and_unexplained_together_raise_and_count_nothing():
    check = Checker("APPLY-TIES", _target(_always("tie-split")), EXAMPLE)
    check.that(False, "tie-split", "split")
    check.that(False, "fn-repeated", "fn ran twice")
    with pytest.raises(ConformanceError) as e:
        check.verdict()
    assert "broken rule [fn-repeated]" in str(e.value)
    assert "tie-split" not in str(e.value)
    assert not checker.OBSERVED


@pytest.mark.parametrize("declaration", [
    Deviation("APPLY-TIES", lambda e: e.kind != "tied", "tie-split", "predicate false here"),
    Deviation("APPLY-PATH", lambda e: True, "tie-split", "another property"),
    Deviation("APPLY-TIES", lambda e: True, "tie-split", "old torch only",
              torch_versions=(None, "1.0")),
], ids=["predicate-false", "other-property", "other-torch"])
def test_declaration_that_does_not_apply_neither_covers_nor_goes_stale(declaration):
    quiet = Checker("APPLY-TIES", _target(declaration), EXAMPLE)
    assert quiet.declared == []
    quiet.verdict()  # no violation and nothing declared here: passes, not stale
    broken = Checker("APPLY-TIES", _target(declaration), EXAMPLE)
    broken.that(False, "tie-split", "split")
    with pytest.raises(ConformanceError, match=r"broken rule \[tie-split\]"):
        broken.verdict()


def test_predicate_sees_the_example():
    seen = []
    declaration = Deviation("APPLY-TIES", lambda e: seen.append(e) or True, "c", "r")
    Checker("APPLY-TIES", _target(declaration), EXAMPLE)
    assert seen == [EXAMPLE]


def test_a_passing_example_counts_each_declaration_that_applied_and_whether_it_showed():
    shown, quiet = _always("tie-split"), _always("other", always=False)
    check = Checker("APPLY-TIES", _target(shown, quiet), EXAMPLE)
    check.that(False, "tie-split", "split")
    check.verdict()
    assert dict(checker.DECLARED) == {("APPLY-TIES", "planted", shown.key): 1,
                                   ("APPLY-TIES", "planted", quiet.key): 1}
    assert dict(checker.DECLARED_SHOWN) == {("APPLY-TIES", "planted", shown.key): 1,
                                         ("APPLY-TIES", "planted", quiet.key): 0}


def test_a_sequence_step_counts_each_declaration_that_applied_and_whether_it_showed():
    from swapspec.properties.harness.step_checker import StepCheck
    from swapspec.properties.models.examples import StepExample

    shown = _always("value", property_id="SEQ-STATE")
    quiet = _always("grad-lost", property_id="SEQ-STATE", always=False)
    step = StepExample(module=torch.nn.Linear(1, 1), step="train")
    check = StepCheck("SEQ-STATE", _target(shown, quiet), step)
    check.that(False, "value", "stale value", "")
    assert check.verdict(lambda violations: "") is True
    assert dict(checker.DECLARED) == {("SEQ-STATE", "planted", shown.key): 1,
                                         ("SEQ-STATE", "planted", quiet.key): 1}
    assert dict(checker.DECLARED_SHOWN) == {("SEQ-STATE", "planted", shown.key): 1,
                                               ("SEQ-STATE", "planted", quiet.key): 0}


def test_a_declared_crash_skips_the_example_and_counts_only_itself():
    crash, other = _always(vocabulary.CRASH), _always("tie-split")
    check = Checker("APPLY-TIES", _target(crash, other), EXAMPLE)
    assert check.skips_declared_crash()
    assert dict(checker.OBSERVED) == {("APPLY-TIES", "planted", vocabulary.CRASH): 1}
    assert dict(checker.DECLARED) == {("APPLY-TIES", "planted", crash.key): 1}
    assert dict(checker.DECLARED_SHOWN) == {("APPLY-TIES", "planted", crash.key): 1}
    assert dict(checker.NOT_RUN) == {("APPLY-TIES", "planted", crash.key): 1}


def test_without_a_crash_declaration_nothing_is_skipped_or_counted():
    check = Checker("APPLY-TIES", _target(_always("tie-split")), EXAMPLE)
    assert not check.skips_declared_crash()
    assert not checker.OBSERVED and not checker.DECLARED


def test_a_declared_crash_the_target_survived_is_stale():
    check = Checker("APPLY-TIES", _target(_always(vocabulary.CRASH)), EXAMPLE)
    with pytest.raises(ConformanceError, match=r"stale deviation \[crash\]"):
        check.verdict()


def test_survey_mode_counts_undeclared_and_stale_instead_of_raising(monkeypatch):
    monkeypatch.setenv("SWAPSPEC_SURVEY", "1")
    stale = _always("tie-split", torch_versions=(None, "1.0"))  # outside the range: applies anyway
    check = Checker("APPLY-TIES", _target(stale), EXAMPLE)
    assert check.declared == [stale]
    check.that(False, "grad-lost", "grad gone")
    check.verdict()
    assert dict(checker.UNDECLARED) == {("APPLY-TIES", "planted", "grad-lost"): 1}
    assert checker.UNDECLARED_MESSAGES[("APPLY-TIES", "planted", "grad-lost")] == "grad gone"
    assert dict(checker.DECLARED_SHOWN) == {("APPLY-TIES", "planted", stale.key): 0}
    assert not checker.OBSERVED


def test_without_survey_mode_the_same_example_raises(monkeypatch):
    monkeypatch.delenv("SWAPSPEC_SURVEY", raising=False)
    check = Checker("APPLY-TIES", _target(_always("tie-split")), EXAMPLE)
    check.that(False, "grad-lost", "grad gone")
    with pytest.raises(ConformanceError):
        check.verdict()
    assert not checker.UNDECLARED and not checker.DECLARED


# ---- conformance_table and rendering -----------------------------------------------------


def _result(pid, target, status, deviations=None, reason=""):
    return {"property": pid, "target": target, "status": status,
            "deviations": deviations or {}, "reason": reason}


def test_table_merges_tests_of_one_pair():
    table = conformance_table([
        _result("P", "t", "pass"),
        _result("P", "t", "deviation", {"a": 2}),
        _result("P", "t", "deviation", {"a": 1, "b": 4}),
        _result("P", "t", "pass"),
    ])
    assert table == {"P": {"t": {"status": "deviation", "deviations": {"a": 3, "b": 4},
                                 "reason": "", "tests": 4, "failures": [], "declarations": {},
                                 "not_run": {}, "undeclared": {}, "undeclared_messages": {}}}}
    assert render_cell(table["P"]["t"], 1) == "dev [1]"
    assert cell_note(table["P"]["t"]) == "deviations seen: a x3, b x4"


def test_a_deviation_note_names_the_declarations_that_matched_and_the_crashes():
    results = [{**_result("P", "t", "deviation", {"a": 2, vocabulary.CRASH: 7}),
                "declarations": {"host.p.a": [5, 2], "host.p.quiet": [3, 0],
                                 "torch.p.crash": [7, 7]},
                "not_run": {"torch.p.crash": 4}},
               {**_result("P", "t", "pass"), "not_run": {"torch.p.crash": 3}}]
    cell = conformance_table(results)["P"]["t"]
    assert cell["not_run"] == {"torch.p.crash": 7}
    assert cell_note(cell) == ("deviations seen: a x2, crash x7; matched: host.p.a x2; "
                               "not run (declared crash): torch.p.crash x7")
    lines = render_table({"P": {"t": cell}}, width=40)
    assert "torch.p.crash x7" in " ".join(lines)  # an ID is never broken at its hyphens


@pytest.mark.parametrize(("statuses", "worst"), [
    (["pass", "skipped"], "skipped"),
    (["skipped", "pass"], "skipped"),
    (["deviation", "skipped"], "deviation"),
    (["fail", "deviation", "pass"], "fail"),
    (["pass", "fail", "skipped"], "fail"),
])
def test_table_cell_takes_the_worst_status(statuses, worst):
    results = [_result("P", "t", s, {"a": 1} if s == "deviation" else None,
                       "why" if s == "skipped" else "") for s in statuses]
    cell = conformance_table(results)["P"]["t"]
    assert (cell["status"], cell["tests"]) == (worst, len(statuses))


def test_table_sums_declaration_and_undeclared_counts():
    results = [{**_result("P", "t", "deviation", {"a": 1}), "declarations": {"a: r": [3, 1]},
                "undeclared": {"u": 2}},
               {**_result("P", "t", "pass"), "declarations": {"a: r": [2, 0]}}]
    cell = conformance_table(results)["P"]["t"]
    assert (cell["declarations"], cell["undeclared"]) == ({"a: r": [5, 1]}, {"u": 2})


def test_table_keeps_skip_reason_and_sorts():
    table = conformance_table([
        _result("Z-PROP", "b", "pass"),
        _result("A-PROP", "b", "skipped", reason="does not apply"),
        _result("A-PROP", "a", "fail"),
    ])
    assert list(table) == ["A-PROP", "Z-PROP"]
    assert list(table["A-PROP"]) == ["a", "b"]
    assert render_cell(table["A-PROP"]["b"], 2) == "skip [2]"
    assert cell_note(table["A-PROP"]["b"]) == "skipped: does not apply"
    assert render_cell(table["A-PROP"]["a"]) == "FAIL"
    assert render_cell(table["Z-PROP"]["b"]) == "pass"
    lines = render_table(table)
    assert [c.strip() for c in lines[0].split(" | ")] == ["property", "a", "b"]
    assert [c.strip() for c in lines[2].split(" | ")] == ["A-PROP", "FAIL", "skip [1]"]
    assert [c.strip() for c in lines[3].split(" | ")] == ["Z-PROP", "-", "pass"]
    assert "[1] skipped: does not apply" in lines


def test_rows_skipped_on_every_target_are_collapsed_by_reason():
    why = {"A-ONE": "t does not implement apply", "A-TWO": "t does not implement apply",
           "F-STRICT": "t does not implement strict"}
    table = conformance_table([_result(pid, "t", "skipped", reason=r) for pid, r in why.items()]
                              + [_result("F-ORACLE", "t", "pass")])
    lines = render_table(table)
    rows = [line.split(" | ")[0].strip() for line in lines if " | " in line]
    assert rows == ["property", "F-ORACLE"]
    notes = dict(re.findall(r"^\[(\d+)\] (.*)$", "\n".join(lines), re.M))
    by_reason = {notes[n]: line.split(": ", 1)[1]
                 for line in lines for n in re.findall(r"^skip \[(\d+)\] \(\d+\):", line)}
    assert by_reason == {"skipped: t does not implement apply": "A-ONE, A-TWO",
                         "skipped: t does not implement strict": "F-STRICT"}
    # a row skipped on one target only stays a row
    two = conformance_table([_result("A-ONE", "t", "skipped", reason="r"),
                             _result("A-ONE", "u", "pass"), _result("B", "t", "pass")])
    assert "A-ONE" in [line.split(" | ")[0].strip() for line in render_table(two)]


def _worst_cells(target) -> dict[str, dict]:
    """Every property's cell for ``target`` at its longest: every clause it declares seen
    (counts in the thousands), its declared skips, a long failure elsewhere."""
    cells = {}
    for pid in vocabulary.ALL:
        clauses = {c: 1234 for d in target.deviations if pid in d.property_ids for c in d.clauses}
        cell = {"status": "pass", "deviations": {}, "reason": "", "tests": 1, "failures": []}
        if pid in target.skips:
            cell.update(status="skipped", reason=f"{target.name} declares a skip for {pid}: "
                        f"{target.skips[pid]}")
        elif clauses:
            cell.update(status="deviation", deviations=clauses)
        else:
            cell.update(status="fail", failures=[{"property": pid, "clause": "not-restored",
                                                  "message": "slot 'a.b.c' holds another object " * 9,
                                                  "repro": ""}])
        cells[pid] = cell
    return cells


def test_table_of_every_property_and_builtin_target_fits_100_columns():
    targets = [builtin_target(name) for name in BUILTIN_NAMES]
    long_named = dataclasses.replace(targets[1], name="a-third-party-target-with-a-long-name")
    by_target = {t.name: _worst_cells(t) for t in [*targets, long_named]}
    table = {pid: {name: cells[pid] for name, cells in by_target.items()} for pid in vocabulary.ALL}
    lines = render_table(table)
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert sum(line.startswith("property ") for line in lines) >= 1
    shown = " ".join(lines)
    for name in by_target:  # every target is shown, by name or in the legend
        assert name in shown
    for pid in vocabulary.ALL:  # every property is a row of every block
        assert sum(line.split(" ")[0] == pid for line in lines) == sum(
            line.startswith("property ") for line in lines)
    notes = [line for line in lines if re.match(r"\[\d+\] ", line)]
    texts = [cell_note(c) for cells in by_target.values() for c in cells.values() if cell_note(c)]
    assert len(notes) == len(set(texts))  # each long text once


# ---- torch's declarations: predicates against what torch does ------------------------------


def _old_weight_norm_linear(step: str) -> torch.nn.Module:
    """A bias-free ``Linear`` (``weight_g`` its first tensor) under the old hook-based
    ``weight_norm``, after ``step``: ``"built"``, a
    ``"forward"``, or a forward and ``"backward"`` (which frees the graph's saved tensors)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        module = torch.nn.utils.weight_norm(torch.nn.Linear(2, 2, bias=False))
    if step != "built":
        out = module(torch.ones(1, 2)).sum()
        if step == "backward":
            out.backward()
    return module


def _torch_double_raises(module: torch.nn.Module) -> bool:
    saved = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        module.double()
    except RuntimeError:
        return True
    finally:
        torch.__future__.set_swap_module_params_on_conversion(saved)
    return False


@pytest.mark.parametrize("step", ["built", "forward", "backward"])
def test_old_weight_norm_refusal_is_predicted_exactly_when_torch_refuses(step):
    from swapspec.properties.declarations.torch_apply import old_weight_norm_swapped
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting
    from swapspec.strategies.conversions import CONVERSIONS

    double = next(c for c in CONVERSIONS if c.name == "double()")
    module = _old_weight_norm_linear(step)
    example = Example(module, conversion=double, flags=FlagSetting(overwrite=False, swap=True))
    predicted = old_weight_norm_swapped(example)
    assert predicted == _torch_double_raises(_old_weight_norm_linear(step)), (
        f"after {step!r} the predicate says torch raises: {predicted}")


def _pruned_linear(history: str) -> torch.nn.Module:
    """A pruned Linear after ``history``: nothing, a same-dtype conversion, or a ``half()``
    off the swap path (a ``.data =`` of another dtype)."""
    import torch.nn.utils.prune as prune

    module = torch.nn.Linear(2, 2, bias=False)
    prune.l1_unstructured(module, "weight", amount=0.5)
    if history == "float":
        module.float()
    elif history == "half":
        module.half()
    return module


@pytest.mark.parametrize("history", ["built", "float", "half"])
def test_pruned_orig_refusal_is_predicted_exactly_when_torch_refuses(history):
    from swapspec.properties.declarations.torch_apply import old_weight_norm_swapped
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting
    from swapspec.strategies.conversions import CONVERSIONS

    double = next(c for c in CONVERSIONS if c.name == "double()")
    example = Example(_pruned_linear(history), conversion=double,
                      flags=FlagSetting(overwrite=False, swap=True))
    predicted = old_weight_norm_swapped(example)
    assert predicted == _torch_double_raises(_pruned_linear(history)), (
        f"after {history!r} the predicate says torch raises: {predicted}")


def test_a_refused_old_norm_swap_commits_nothing_before_a_later_fn_error():
    from swapspec.properties.declarations.torch_apply import commits_before_raising
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting
    from swapspec.strategies.conversions import raising_conversion

    # torch refuses weight_g's swap right after fn's first call, before its raising second
    example = Example(_old_weight_norm_linear("forward"), conversion=raising_conversion(2),
                      flags=FlagSetting(overwrite=False, swap=True))
    assert not commits_before_raising(example)
    freed = Example(_old_weight_norm_linear("backward"), conversion=raising_conversion(2),
                    flags=FlagSetting(overwrite=False, swap=True))
    assert commits_before_raising(freed)  # the swap goes through, so the first call commits


def _rnn_tree(shape: str) -> tuple[torch.nn.Module, bool]:
    """A tree with an ``nn.RNN`` and whether ``_apply`` recurses into it: its flat weight tied
    into another module met before the RNN (``tie-first``) or after it (``rnn-first``), held
    by a root converted with ``recurse=False`` (``root-holds``), no tie at all (``untied``),
    or the RNN alone as a root with ``recurse=False`` (``rnn-root``)."""
    rnn, other = torch.nn.RNN(2, 2), torch.nn.Module()
    if shape != "untied":
        other.p0 = rnn.weight_ih_l0
    if shape == "root-holds":
        other.rnn = rnn
        return other, False
    if shape == "rnn-root":
        return rnn, False
    return torch.nn.Sequential(*((rnn, other) if shape == "rnn-first" else (other, rnn))), True


def _torch_apply_error(module: torch.nn.Module, fn, recurse: bool, swap: bool):
    """The error torch's ``_apply(fn, recurse)`` raises under the swap flag ``swap``, or None."""
    saved = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(swap)
    try:
        module._apply(fn, recurse=recurse)
    except Exception as e:
        return e
    finally:
        torch.__future__.set_swap_module_params_on_conversion(saved)
    return None


@pytest.mark.parametrize("swap", [True, False])
@pytest.mark.parametrize("shape", ["tie-first", "rnn-first", "root-holds", "untied", "rnn-root"])
def test_a_refused_rnn_weight_swap_is_predicted_exactly_when_torch_refuses(shape, swap):
    from swapspec.properties.declarations.torch_apply import rnn_weight_swapped_elsewhere
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting
    from swapspec.strategies.conversions import CONVERSIONS

    double = next(c for c in CONVERSIONS if c.name == "double()")
    module, recurse = _rnn_tree(shape)
    example = Example(module, conversion=double, recurse=recurse,
                      flags=FlagSetting(overwrite=False, swap=swap))
    predicted = rnn_weight_swapped_elsewhere(example)
    error = _torch_apply_error(_rnn_tree(shape)[0], double.make_fn(), recurse, swap)
    assert predicted == (error is not None), (
        f"{shape}, swap={swap}: the predicate says torch raises: {predicted}; torch raised {error!r}")


@pytest.mark.parametrize("k", [1, 2, 3, 7])
@pytest.mark.parametrize("shape", ["tie-first", "rnn-first", "root-holds"])
def test_a_refused_rnn_weight_swap_hides_fn_error_exactly_when_it_comes_first(shape, k):
    """``raise_on(k)`` on the swap path: torch's own refusal comes out instead of fn's error
    exactly when the predicate says so, and it commits something first exactly when
    ``commits_before_raising`` says so."""
    from swapspec.properties.declarations.torch_apply import (
        commits_before_raising,
        rnn_weight_refused_before_fn_raises,
    )
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting
    from swapspec.strategies.conversions import raising_conversion

    conversion = raising_conversion(k)
    module, recurse = _rnn_tree(shape)
    example = Example(module, conversion=conversion, recurse=recurse,
                      flags=FlagSetting(overwrite=False, swap=True))
    hidden, commits = rnn_weight_refused_before_fn_raises(example), commits_before_raising(example)
    fresh = _rnn_tree(shape)[0]
    before = {name: t.clone() for name, t in fresh.state_dict().items()}
    error = _torch_apply_error(fresh, conversion.make_fn(), recurse, swap=True)
    changed = any(not torch.equal(t, before[name]) for name, t in fresh.state_dict().items())
    assert error is not None, f"{shape}, k={k}: torch raised nothing"
    assert hidden == (type(error) is RuntimeError), (
        f"{shape}, k={k}: predicted torch's own error: {hidden}; torch raised {error!r}")
    assert commits == changed, f"{shape}, k={k}: predicted a commit: {commits}; changed: {changed}"


def _torch_add_one_commits_before_refusing(module: torch.nn.Module, refused: str) -> bool:
    """Whether torch's swap-path ``_apply(t + 1)``, with ``refused`` held by a weak reference,
    raises and leaves some parameter converted."""
    import weakref

    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    held = weakref.ref(module.get_parameter(refused))
    with torch_swap_flag_set(), pytest.raises(RuntimeError):
        module._apply(lambda t: t + 1)
    del held
    return any(not torch.equal(p.detach(), before[n]) for n, p in module.named_parameters())


@pytest.mark.parametrize("step", ["built", "backward"])
def test_a_refused_weight_v_swap_commits_weight_g_only_once_its_graph_is_freed(step):
    from swapspec.properties.declarations.torch_apply import converts_before_refused_swap
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting
    from swapspec.strategies.conversions import ADD_ONE

    # weight_g comes before weight_v; while the norm's graph holds it torch refuses its swap
    # first, so nothing is converted before the refused weight_v
    example = Example(_old_weight_norm_linear(step), conversion=ADD_ONE,
                      flags=FlagSetting(overwrite=False, swap=True), refused="weight_v")
    predicted = converts_before_refused_swap(example)
    assert predicted == _torch_add_one_commits_before_refusing(
        _old_weight_norm_linear(step), "weight_v"), (
        f"after {step!r} the predicate says torch commits before the refusal: {predicted}")
    assert predicted == (step == "backward")


def _torch_swaps_before_refusing(module: torch.nn.Module, fn, refused: str) -> dict[str, bool]:
    """Per parameter, whether torch's swap-path ``_apply(fn)`` with ``refused`` held by a weak
    reference gave it a new TensorImpl, and whether its values changed."""
    import weakref

    before = {n: (p._cdata, p.detach().clone()) for n, p in module.named_parameters()}
    held = weakref.ref(module.get_parameter(refused))
    with torch_swap_flag_set(), pytest.raises(RuntimeError):
        module._apply(fn)
    del held
    return {n: (p._cdata != before[n][0], not torch.equal(p.detach(), before[n][1]))
            for n, p in module.named_parameters()}


def _two_parameters() -> torch.nn.Module:
    module = torch.nn.Module()
    module.a = torch.nn.Parameter(torch.ones(2))
    module.b = torch.nn.Parameter(torch.ones(2))
    return module


@pytest.mark.parametrize("name", ["add(1)", "cpu()"])
def test_a_swap_before_a_refused_one_is_predicted_visible_or_impl_only(name):
    """``fn`` returning ``a`` changed: a visible conversion before the refused ``b``; returning
    it as it was (``cpu()``): only ``a``'s TensorImpl is new, which the second declaration
    (an allocator may reuse the address) covers, and torch does swap it."""
    from swapspec.properties.declarations.torch_apply import (
        converts_before_refused_swap,
        swaps_unseen_before_refused_swap,
    )
    from swapspec.properties.models.apply_state import conversion_named
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting

    conversion = conversion_named(name)
    example = Example(_two_parameters(), conversion=conversion,
                      flags=FlagSetting(overwrite=False, swap=True), refused="b")
    changed = _torch_swaps_before_refusing(_two_parameters(), conversion.make_fn(), "b")
    assert converts_before_refused_swap(example) == changed["a"][1]
    assert swaps_unseen_before_refused_swap(example) == (not changed["a"][1])
    assert not changed["b"][0] and not changed["b"][1]


def test_an_fn_that_returns_its_input_commits_nothing_visible_before_raising():
    """``raise_on(2)`` over a function that returns a tensor as it was: the first call's commit
    shows only where the overwrite path puts a new parameter in the slot."""
    from swapspec.properties.declarations.torch_apply import commits_before_raising
    from swapspec.properties.models.apply_state import conversion_named
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting
    from swapspec.strategies.conversions import raising_conversion

    over_cpu = raising_conversion(2, conversion_named("cpu()"))
    for overwrite in (False, True):
        example = Example(_two_parameters(), conversion=over_cpu,
                          flags=FlagSetting(overwrite=overwrite, swap=False))
        module = _two_parameters()
        a, values = module.a, module.a.detach().clone()
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
        try:
            with pytest.raises(RuntimeError, match="raise_on"):
                module._apply(over_cpu.make_fn())
        finally:
            torch.__future__.set_overwrite_module_params_on_conversion(False)
        shows = module.a is not a or not torch.equal(module.a.detach(), values)
        assert commits_before_raising(example) == shows == overwrite


class _Tagged(torch.nn.Parameter):
    """A ``Parameter`` subclass: torch's swap and overwrite paths refuse it returned as is."""


@pytest.mark.parametrize("tagged_first", [True, False])
def test_a_subclass_refused_first_commits_nothing_before_the_raise(tagged_first):
    """Swap flag, ``fn`` returning 2-D tensors as they are and converting 1-D ones: torch raises
    at the ``Parameter`` subclass it cannot wrap; only tensors before it are committed."""
    from swapspec.properties.declarations.torch_apply import commits_before_its_raise
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting
    from swapspec.strategies.conversions import Conversion

    def build() -> torch.nn.Module:
        module = torch.nn.Module()
        tagged = _Tagged(torch.ones(2, 3))
        plain = torch.nn.Parameter(torch.ones(4))
        module.a, module.b = (tagged, plain) if tagged_first else (plain, tagged)
        return module

    repro = "lambda t: t if t.dim() == 2 else t.double()"
    conversion = Conversion("2-D kept, else double", repro)
    example = Example(build(), conversion=conversion, flags=FlagSetting(overwrite=False, swap=True))
    module = build()
    plain = module.b if tagged_first else module.a
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with pytest.raises(RuntimeError):
            module._apply(conversion.make_fn())
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    committed = plain.dtype == torch.float64
    assert committed == (not tagged_first)
    assert commits_before_its_raise(example) == committed


def _tied_buffers(keys: int) -> torch.nn.Module:
    """One buffer under ``keys`` names (tied), beside a ``count`` buffer a load leaves missing."""
    module = torch.nn.Module()
    shared = torch.ones(2)
    for i in range(keys):
        module.register_buffer(f"b{i}", shared)
    module.register_buffer("count", torch.tensor(0))
    return module


@pytest.mark.parametrize("keys", [1, 2])
def test_a_failing_load_swapping_a_slot_twice_may_leave_its_cdata_as_it_was(keys):
    """Swap flag, a strict load missing ``count``, every other key given the slot's own tensor:
    a slot swapped once shows a new TensorImpl for certain (``writes-before-failing``); a slot
    swapped twice may end at its old address (the other declaration, never judged stale)."""
    from swapspec.properties.declarations.torch_load_failures import (
        swaps_twice_before_failing,
        writes_before_failing,
    )
    from swapspec.properties.models.examples import Example
    from swapspec.strategies.state_dicts import LoadInput

    module = _tied_buffers(keys)
    own = module.b0
    state_dict = {f"b{i}": own for i in range(keys)}
    probe = _tied_buffers(keys)
    example = Example(probe, load=LoadInput({f"b{i}": probe.b0 for i in range(keys)},
                                            strict=True, assign=False, swap=True))
    start = own._cdata
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with pytest.raises(RuntimeError, match="count"):
            module.load_state_dict(state_dict)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert writes_before_failing(example) == (keys == 1)
    assert swaps_twice_before_failing(example) == (keys == 2)
    if keys == 1:
        assert own._cdata != start, "one swap: a new TensorImpl, the old one alive meanwhile"


@pytest.mark.parametrize("keys", [1, 2])
def test_a_load_swapping_a_slot_twice_is_predicted_where_torch_swaps_it_twice(keys, monkeypatch):
    """Swap flag, a load that succeeds, every key given the slot's own tensor: torch swaps the
    buffer once per key that reaches it, and ``torch.load.swapped-twice`` (never judged stale:
    whether a second swap shows depends on the allocator) applies exactly where it swaps twice."""
    from swapspec.properties.declarations.torch_load_objects import swapped_twice
    from swapspec.properties.models.examples import Example
    from swapspec.strategies.state_dicts import LoadInput

    module = _tied_buffers(keys)
    probe = _tied_buffers(keys)
    example = Example(probe, load=LoadInput(
        {**{f"b{i}": probe.b0 for i in range(keys)}, "count": probe.count},
        strict=True, assign=False, swap=True))
    swaps = Counter()
    swap = torch.utils.swap_tensors

    def counting_swap(t1, t2):
        swaps[id(t1)] += 1
        return swap(t1, t2)

    monkeypatch.setattr(torch.utils, "swap_tensors", counting_swap)
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        module.load_state_dict({**{f"b{i}": module.b0 for i in range(keys)}, "count": module.count})
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert swaps[id(module.b0)] == keys
    assert swapped_twice(example) == (keys == 2)


@pytest.mark.parametrize("another_weight", [False, True])
def test_an_rnn_ignores_a_none_weight_only_when_no_other_weight_changes(another_weight):
    """``functional_call`` giving ``None`` to an RNN weight: alone, torch runs forward with the
    old weight; with another weight changed, it re-reads them all and raises as the spec does."""
    from swapspec.properties.declarations.torch_functional_call import rnn_ignores_a_none_weight
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import CallInput

    rnn, x = torch.nn.RNN(2, 2, num_layers=2, bias=False), torch.zeros(3, 2)
    tensors = {"weight_hh_l1": None, **({"weight_ih_l0": torch.ones(2, 2)} if another_weight else {})}
    example = Example(rnn, call=CallInput(dict(tensors), (x,), {}))
    assert rnn_ignores_a_none_weight(example) == (not another_weight)
    if another_weight:
        with pytest.raises(TypeError):
            torch.func.functional_call(rnn, tensors, (x,))
    else:
        out = torch.func.functional_call(rnn, tensors, (x,))
        assert torch.equal(out[0], rnn(x)[0]), "forward ran with the weight the call took out"


@pytest.mark.parametrize("itself_last", [True, False])
def test_an_assign_load_keeps_a_slot_whose_last_key_gives_the_parameter_itself(itself_last):
    """``assign=True``, no swap flag, a shared ``Linear``'s bias given under both paths, once as
    its detached alias and once as the ``Parameter`` itself: torch's last write decides whether
    the slot ends with its own object."""
    from swapspec.properties.declarations.torch_load_objects import assign_replaces_own_data
    from swapspec.properties.models.examples import Example
    from swapspec.strategies.state_dicts import LoadInput

    def build() -> torch.nn.Module:
        shared = torch.nn.Linear(2, 2)
        return torch.nn.Sequential(shared, shared)

    def state_dict(module: torch.nn.Module) -> dict:
        own, alias = module[0].bias, module[0].bias.detach()
        order = [("0.bias", alias), ("1.bias", own)] if itself_last else [("0.bias", own), ("1.bias", alias)]
        weight = module[0].weight  # the Parameter itself under both keys: kept by torch too
        return {"0.weight": weight, "1.weight": weight, **dict(order)}

    probe = build()
    example = Example(probe, load=LoadInput(state_dict(probe), strict=True, assign=True, swap=False))
    module = build()
    bias = module[0].bias
    module.load_state_dict(state_dict(module), assign=True)
    assert (module[0].bias is bias) == itself_last
    assert assign_replaces_own_data(example) == (not itself_last)


def _hooks_fire_after(module: torch.nn.Module, conversions: list) -> bool:
    """Whether a hook registered on the first parameter before ``conversions`` (torch's
    ``_apply``, default flags) fires in a backward after them."""
    fired = []
    next(module.parameters()).register_hook(lambda g: fired.append(1))
    for conversion in conversions:
        module._apply(conversion.make_fn())
    sum(p.sum() for p in module.parameters()).backward()
    return bool(fired)


@pytest.mark.parametrize("world", ["", "meta"])
def test_hook_loss_is_predicted_for_an_earlier_conversion_that_changes_the_tensor_impl(world):
    from swapspec.properties.declarations.torch_apply import loses_tensor_hooks
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting, build_tree
    from swapspec.strategies.conversions import CONVERSIONS
    from swapspec.strategies.trees import LeafSpec, TreeSpec

    to_empty, to_float = (next(c for c in CONVERSIONS if c.name == name)
                          for name in ("to_empty(device='cpu')", "float()"))
    spec = TreeSpec(root=LeafSpec(kind="Linear"), world=world)
    module = build_tree(spec)
    module._apply(to_empty.make_fn())  # the earlier conversion, as the property runs it
    example = Example(module, conversion=to_float, flags=FlagSetting(overwrite=False, swap=False),
                      earlier=(to_empty,))
    lost = not _hooks_fire_after(build_tree(spec), [to_empty, to_float])
    assert lost == (world == "meta"), "torch itself changed: meta -> cpu kept the object"
    assert loses_tensor_hooks(example) == lost


def _tied_batch_norm() -> torch.nn.Module:
    module = torch.nn.BatchNorm1d(2)
    module.running_var = module.running_mean
    return module


def _half_tied(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two objects that share the memory of some of their plain parts and not of others."""
    def pointers(t):
        parts = [getattr(t, n) for n in t.__tensor_flatten__()[0]] if hasattr(t, "__tensor_flatten__") else [t]
        return [p.untyped_storage().data_ptr() for p in parts]

    shared = [x == y for x, y in zip(pointers(a), pointers(b), strict=True)]
    return a is not b and any(shared) and not all(shared)


@pytest.mark.parametrize("name", ["TwoTensor", "double()", "add(1)"])
def test_a_half_tie_is_predicted_where_torch_leaves_one(name):
    from swapspec.properties.declarations.torch_apply import split_tied_buffer_shares_storage
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting
    from swapspec.strategies.conversions import CONVERSIONS

    conversion = next(c for c in CONVERSIONS if c.name == name)
    example = Example(_tied_batch_norm(), conversion=conversion,
                      flags=FlagSetting(overwrite=False, swap=False))
    converted = _tied_batch_norm()._apply(conversion.make_fn())
    left = _half_tied(converted.running_mean, converted.running_var)
    assert left == (name == "TwoTensor"), "torch itself changed how it splits a tied buffer"
    assert split_tied_buffer_shares_storage(example) == left


@pytest.mark.parametrize("seed", range(8))
def test_a_rounded_weight_norm_restore_is_predicted_exactly_when_torch_rounds(seed):
    from swapspec.properties.declarations.torch_functional_call import weight_norm_restore_rounds
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import CallInput

    torch.manual_seed(seed)
    module = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(3, 2 + seed % 3))
    originals = [module.parametrizations.weight.original0, module.parametrizations.weight.original1]
    before = [t.detach().clone() for t in originals]
    call = CallInput({"weight": torch.rand(module.weight.shape)}, (torch.ones(1, 3),), {},
                     tie_weights=True, strict=False)
    predicted = weight_norm_restore_rounds(Example(module, call=call))
    torch.func.functional_call(module, call.tensors, call.args)
    rounded = any(not torch.equal(t, b) for t, b in zip(originals, before, strict=True))
    assert predicted == rounded


def _weight_normed_linear() -> torch.nn.Module:
    return torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("swap", [False, True])
def test_a_refused_parametrized_swap_is_predicted_exactly_when_torch_raises(swap):
    from swapspec.properties.declarations.torch_functional_call import (
        parametrized_name_swap_refused,
    )
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import CallInput

    tensors = {"weight": torch.ones(2, 2)}
    call = CallInput(tensors, (torch.ones(1, 2),), {}, tie_weights=True, strict=False)
    saved = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(swap)
    try:
        predicted = parametrized_name_swap_refused(Example(_weight_normed_linear(), call=call))
        try:
            torch.func.functional_call(_weight_normed_linear(), tensors, call.args)
            raised = False
        except RuntimeError:
            raised = True
    finally:
        torch.__future__.set_swap_module_params_on_conversion(saved)
    assert raised == swap, "torch itself changed: the swap flag no longer decides it"
    assert predicted == raised


@pytest.mark.parametrize("converged", [False, True])
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("swap", [False, True])
def test_a_power_iteration_before_a_refused_swap_is_predicted_exactly_where_torch_runs_one(
        swap, training, converged):
    """A spectral norm whose power iteration has converged (seed 0's 3 x 3 weight) raises
    with its vectors unchanged; a weight scaled after registration moves them. A call that
    runs (no swap) iterates on the given weight too, so in training mode it always moves them."""
    from swapspec.properties.declarations.torch_functional_call import (
        spectral_norm_iterates_before_refused_swap,
    )
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import CallInput

    def spectral_normed_linear() -> torch.nn.Module:
        torch.manual_seed(0)
        module = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(3, 3))
        if not converged:
            with torch.no_grad():
                module.parametrizations.weight.original.mul_(torch.arange(1.0, 10.0).view(3, 3))
        return module.train(training)

    tensors = {"weight": torch.ones(3, 3)}
    call = CallInput(tensors, (torch.ones(1, 3),), {}, tie_weights=True, strict=False)
    module = spectral_normed_linear()
    vectors = [module.parametrizations.weight[0]._u, module.parametrizations.weight[0]._v]
    before = [t.clone() for t in vectors]
    saved = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(swap)
    try:
        predicted = spectral_norm_iterates_before_refused_swap(
            Example(spectral_normed_linear(), call=call))
        try:
            torch.func.functional_call(module, tensors, call.args)
            raised = False
        except RuntimeError:
            raised = True
    finally:
        torch.__future__.set_swap_module_params_on_conversion(saved)
    changed = any(not torch.equal(t, b) for t, b in zip(vectors, before, strict=True))
    assert raised == swap, "torch itself changed: the swap flag no longer decides the refusal"
    assert changed == (training and not (raised and converged)), "torch changed: see the repro"
    assert predicted == (raised and changed)


def test_each_kind_of_failure_has_its_own_error_class():
    """Rule: failures of different clauses (or a stale declaration) raise different
    ``ConformanceError`` subclasses, the same kind the same class."""
    def raised(clauses: list[str], declared: tuple = ()) -> type:
        check = Checker("APPLY-TIES", _target(*declared), EXAMPLE)
        for clause in clauses:
            check.that(False, clause, f"{clause} broke")
        with pytest.raises(ConformanceError) as e:
            check.verdict()
        return type(e.value)

    assert raised(["tie-split"]) is raised(["tie-split"])
    assert raised(["tie-split"]) is not raised(["values"])
    assert raised(["values", "tie-split"]) is raised(["tie-split"])  # the first clause's kind
    assert raised([], (_always("tie-split"),)) not in {raised(["tie-split"]), raised(["values"])}


def test_two_independent_bugs_of_one_property_are_both_reported():
    """Rule: a run of a property that breaks two clauses in different examples reports both,
    each shrunk on its own (Hypothesis tells them apart by their error class)."""
    from hypothesis import Phase, given, settings
    from hypothesis import strategies as st

    # every setting that decides it explicit: a profile another test module loads must not
    @settings(database=None, derandomize=True, max_examples=300, report_multiple_bugs=True,
              phases=[Phase.generate, Phase.shrink])
    @given(st.integers(0, 1000))
    def planted(n: int) -> None:
        check = Checker("APPLY-TIES", _target(), EXAMPLE)
        check.that(n % 7 != 3, "tie-split", f"{n}: bug one")
        check.that(n % 11 != 5, "values", f"{n}: bug two")
        check.verdict()

    with pytest.raises(BaseExceptionGroup) as group:
        planted()
    kinds = [min(v.clause for v in e.violations) for e in group.value.exceptions
             if isinstance(e, ConformanceError)]
    assert sorted(kinds) == ["tie-split", "values"]


def test_a_declaration_covers_its_own_clauses_only(monkeypatch):
    """Rule: a declared clause that shows does not excuse an invariant break of the same
    example; only a declaration that names the invariant and applies does."""
    monkeypatch.delenv("SWAPSPEC_INVARIANTS", raising=False)

    def verdict(*declared: Deviation) -> None:
        target = SimpleNamespace(name="planted", deviations=list(declared), invariants=True)
        check = Checker("APPLY-TIES", target, EXAMPLE)
        check.that(False, "tie-split", "split")
        check.that(False, "INV-KINDS", "a Parameter became a Tensor")
        check.verdict()

    with pytest.raises(ConformanceError) as e:
        verdict(_always("tie-split"))
    assert [v.clause for v in e.value.violations] == ["INV-KINDS"]
    verdict(_always("tie-split"), _always("INV-KINDS", property_id="FC-RESTORE"))


def test_an_invariant_only_declaration_is_judged_only_where_the_invariants_are_checked(monkeypatch):
    """Rule: a declaration naming invariant clauses only (a reused torch declaration on a host's
    target) is never stale on a target whose invariants are off, where it cannot show; on one
    whose invariants are on it is stale where it applies and nothing shows it."""
    monkeypatch.delenv("SWAPSPEC_INVARIANTS", raising=False)
    kinds_only = _always("INV-KINDS")

    def verdict(checked: bool) -> None:
        target = SimpleNamespace(name="planted", deviations=[kinds_only], invariants=checked)
        Checker("APPLY-TIES", target, EXAMPLE).verdict()

    verdict(False)
    with pytest.raises(ConformanceError, match=r"stale deviation \[INV-KINDS\]"):
        verdict(True)


def test_a_sometimes_declaration_is_stale_after_its_count_unless_no_count_can_tell(monkeypatch):
    """An ``always=False`` declaration whose region ``stale_after`` examples hit without one
    showing it is stale; one with ``stale_after=None`` (an allocator's behaviour) never is."""
    counted = _always("tie-split", always=False, stale_after=3)
    luck = _always("path-swap", property_id="APPLY-PATH", always=False, stale_after=None)
    with monkeypatch.context() as patch:  # this test's counts stay its own, gone before the plugin reads them
        for name in ("IN_REGION", "SHOWN"):
            patch.setattr(checker, name, Counter())
        patch.setattr(checker, "STALE_AFTER", {})
        for declaration in (counted, luck):
            check = Checker(declaration.property_ids[0], _target(declaration), EXAMPLE)
            for _ in range(3):
                check.verdict()
        hits, seen = Counter(checker.IN_REGION), Counter(checker.SHOWN)
        stale = checker.stale_sometimes(hits, seen)
        not_yet = checker.stale_sometimes(Counter({k: 2 for k in hits}), seen)
    assert sorted(hits.values()) == [3, 3] and not any(seen.values())
    assert [key[2] for key in stale] == [counted.key]
    assert not not_yet  # under 3 examples: not yet


def test_a_norm_layer_fills_in_its_missing_batch_count_unless_the_metadata_is_version_two():
    """``norm_defaults``: torch's ``_NormBase`` loads a missing ``num_batches_tracked`` from the
    buffer itself where the state dict's metadata gives no version 2 (a plain dict)."""
    from torch import nn

    from swapspec.properties.models.load_examples import norm_defaults

    module = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), nn.BatchNorm1d(2, track_running_stats=False))
    [(key, slot, value)] = norm_defaults(module, {})
    assert key == "1.num_batches_tracked" and slot is value is module[1].num_batches_tracked
    versioned = module.state_dict()
    del versioned["1.num_batches_tracked"]
    assert norm_defaults(module, versioned) == []  # version 2 metadata: torch leaves it missing
    assert norm_defaults(module, {"1.num_batches_tracked": torch.tensor(3)}) == []


def test_a_refused_grad_leaves_its_parameter_without_grad_whatever_fn_returns():
    """torch sets a parameter's grad to None before it swaps the grad; a refused grad swap
    leaves it None even where ``fn`` (``cpu()``) returns every tensor as it was."""
    import weakref

    from swapspec.properties.declarations.torch_apply import converts_before_refused_swap
    from swapspec.properties.models.apply_state import conversion_named
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting

    def with_grad() -> torch.nn.Module:
        module = _two_parameters()
        module.a.grad = torch.ones(2)
        return module

    conversion = conversion_named("cpu()")
    example = Example(with_grad(), conversion=conversion,
                      flags=FlagSetting(overwrite=False, swap=True), refused="a.grad")
    module = with_grad()
    held = weakref.ref(module.a.grad)
    with torch_swap_flag_set(), pytest.raises(RuntimeError):
        module._apply(conversion.make_fn())
    del held
    assert module.a.grad is None and converts_before_refused_swap(example)


def test_a_raise_on_a_swapped_parameters_grad_leaves_that_grad_none():
    """On the swap path torch clears a parameter's grad before converting it: ``fn`` raising on
    the grad (call 2, after a parameter it returned as it was) leaves the grad None."""
    from swapspec.properties.declarations.torch_apply import commits_before_raising
    from swapspec.properties.models.apply_state import conversion_named
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting
    from swapspec.strategies.conversions import raising_conversion

    def with_grad() -> torch.nn.Module:
        module = torch.nn.Module()
        module.a = torch.nn.Parameter(torch.ones(2))
        module.a.grad = torch.ones(2)
        return module

    over_cpu = raising_conversion(2, conversion_named("cpu()"))
    example = Example(with_grad(), conversion=over_cpu,
                      flags=FlagSetting(overwrite=False, swap=True))
    module = with_grad()
    with torch_swap_flag_set(), pytest.raises(RuntimeError, match="raise_on"):
        module._apply(over_cpu.make_fn())
    assert module.a.grad is None and commits_before_raising(example)


@pytest.mark.parametrize("given", [{"bias": None}, {"bias": "tensor"}, {"weight": None},
                                   {"weight": "tensor", "bias": "tensor"}])
def test_torch_takes_a_value_for_a_lazy_tensor_exactly_where_declared(given):
    from swapspec.properties.declarations.torch_functional_call import gives_a_lazy_tensor
    from swapspec.properties.models.examples import Example
    from swapspec.strategies.calls import CallInput

    shapes = {"weight": (2, 3), "bias": (2,)}
    tensors = {k: None if v is None else torch.zeros(shapes[k]) for k, v in given.items()}
    module = torch.nn.LazyLinear(2)
    call = CallInput(tensors, (torch.ones(1, 3),), {}, tie_weights=True, strict=False)
    assert gives_a_lazy_tensor(Example(module, call=call))
    # torch never refuses with the spec's ValueError: it runs, or fails in the lazy hook
    with contextlib.suppress(AttributeError):
        torch.func.functional_call(module, tensors, (torch.ones(1, 3),))
    initialized = torch.nn.Linear(2, 2)
    assert not gives_a_lazy_tensor(Example(initialized, call=CallInput(
        {"bias": None}, (torch.ones(1, 2),), {}, tie_weights=True, strict=False)))


@pytest.mark.parametrize("then", ["float()", "double()"])
def test_a_grad_shared_by_an_earlier_split_is_declared_where_the_next_conversion_keeps_it(then):
    """After an overwrite split that left one grad in two Parameters, a next conversion on the
    overwrite path keeps it shared where ``fn`` returns the grad itself (``float()``), and
    gives each its own where it makes a new one (``double()``)."""
    from swapspec.properties.declarations.torch_apply import split_tie_shares_grad
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting
    from swapspec.strategies.conversions import CONVERSIONS

    conversion = next(c for c in CONVERSIONS if c.name == then)
    module = torch.nn.Module()
    module.a = torch.nn.Parameter(torch.ones(2))
    module.b = module.a
    module.a.grad = torch.ones(2)
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        module.float()  # the split: two Parameters, one grad (float() returns it itself)
        assert module.a is not module.b and module.a.grad is module.b.grad
        example = Example(module, conversion=conversion, flags=FlagSetting(overwrite=True, swap=False))
        predicted = split_tie_shares_grad(example)
        module._apply(conversion.make_fn())
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    assert predicted == (module.a.grad is module.b.grad) == (then == "float()")


@pytest.mark.parametrize("conflict", [True, False])
def test_forward_writes_stay_after_a_slot_conflict_torch_runs_exactly_where_declared(conflict):
    """Two names of a shared leaf given different objects with ``tie_weights=False``: torch runs
    forward, so a counter buffer it rebinds elsewhere is not restored; given one object, the
    call is valid and the spec keeps that write too (nothing declared)."""
    from swapspec.properties.declarations.torch_functional_call import (
        forward_writes_beside_a_conflict,
    )
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import build_tree
    from swapspec.strategies.calls import CallInput
    from swapspec.strategies.trees import ContainerSpec, LeafSpec, ShareSpec, TensorSpec, TreeSpec

    spec = TreeSpec(root=ContainerSpec(children=(
        LeafSpec(tensors=(TensorSpec(name="p0"),)),
        LeafSpec(tensors=(TensorSpec(name="p0"),), behaviours=("rebind",)),
    )), shares=(ShareSpec(source="0", parent="", name="2"),))
    module = build_tree(spec)
    counter = module[1].count
    first = torch.zeros(4)
    second = torch.ones(4) if conflict else first
    call = CallInput({"0.p0": first, "2.p0": second}, (torch.zeros(2, 4),), {},
                     tie_weights=False, strict=False)
    predicted = forward_writes_beside_a_conflict(Example(module, call=call))
    torch.func.functional_call(module, call.tensors, call.args, tie_weights=False)
    assert predicted is conflict
    assert module[1].count is not counter  # torch ran forward either way


@pytest.mark.parametrize("create_graph", [True, False])
def test_a_conversion_step_after_a_graph_kept_by_an_old_norm_is_declared_where_torch_commits_first(
        create_graph):
    """An old-style ``weight_norm`` whose attribute's graph a ``backward(create_graph=True)``
    kept alive (its grads then set to None): at a conversion step on the swap path torch
    refuses ``weight_g`` after it converted the bias. A plain backward frees that graph, and
    the swap goes through."""
    from swapspec.properties.declarations.torch_functional_call import (
        swap_refused_by_graph_grads,
    )
    from swapspec.properties.models.apply_state import conversion_named
    from swapspec.properties.models.examples import StepExample
    from swapspec.strategies import FlagSetting

    module = torch.nn.Linear(2, 2)
    torch.nn.utils.weight_norm(module)
    (module(torch.ones(1, 2)) ** 2).sum().backward(create_graph=create_graph)
    module.zero_grad()  # no grad left to carry a graph: only the attribute's graph holds
    double = conversion_named("double()")
    step = StepExample(module, conversion=double, flags=FlagSetting(overwrite=False, swap=True),
                       step="convert")
    predicted = swap_refused_by_graph_grads(step)
    with torch_swap_flag_set(), contextlib.suppress(RuntimeError):
        module._apply(double.make_fn())
    refused = module.weight_g.dtype == torch.float32
    assert predicted is refused is create_graph
    assert module.bias.dtype == torch.float64  # converted before the refusal, or with the rest


@pytest.mark.parametrize("tagged", [True, False])
def test_a_form_call_leaving_a_clone_in_a_shared_slot_is_declared_where_the_kind_changes(tagged):
    """FC-INPUT-FORMS' calls give fresh clones: a shared Linear's weight named once, with
    ``tie_weights=True``, is swapped under both names and left holding the clone. That shows
    in ``INV-KINDS`` only where the clone's kind differs (a tagged weight's clone is a plain
    ``Parameter``)."""
    from swapspec.properties.declarations.torch_functional_call import forms_swap_one_slot_twice
    from swapspec.properties.models.call_state import cloned_inputs
    from swapspec.properties.models.examples import Example
    from swapspec.properties.models.invariants import kinds, kinds_kept
    from swapspec.strategies import build_tree
    from swapspec.strategies.calls import CallInput
    from swapspec.strategies.trees import ContainerSpec, LeafSpec, ShareSpec, TreeSpec

    spec = TreeSpec(root=ContainerSpec(children=(LeafSpec(kind="Linear", bias=False, tagged=tagged),
                                                 LeafSpec())),
                    shares=(ShareSpec(source="0", parent="", name="2"),))
    module = build_tree(spec)
    call = CallInput({"2.weight": module[0].weight}, (torch.zeros(2, 4),), {},
                     tie_weights=True, strict=False)
    predicted = forms_swap_one_slot_twice(Example(module, call=call))
    fresh = build_tree(spec)
    before, weight = kinds(fresh), fresh[0].weight
    torch.func.functional_call(fresh, cloned_inputs(call.tensors), call.args)
    assert fresh[0].weight is not weight  # the clone stays, tagged or not
    assert predicted is bool(kinds_kept(before, fresh)) is tagged


@pytest.mark.parametrize("hooked_before", [True, False])
def test_a_hook_registered_after_a_swapping_load_is_not_held_to_the_model(hooked_before):
    """At a sequence's load step under the swap flag torch's matched declarations name
    ``after-hook-lost``, and the model stops holding the hooks registered afterwards; torch
    fires none of them where the parameter had a hook before the load (its Python object keeps
    the hook table, never registered on the swapped-in TensorImpl), and fires them otherwise."""
    from swapspec.properties.harness.step_checker import StepCheck
    from swapspec.properties.models.examples import StepExample
    from swapspec.properties.models.module_model import ModuleModel
    from swapspec.strategies import build_tree, tree_info
    from swapspec.strategies.state_dicts import LoadInput
    from swapspec.strategies.trees import LeafSpec, TreeSpec

    module = build_tree(TreeSpec(root=LeafSpec(kind="Linear", bias=False)))
    fired: list[str] = []
    if hooked_before:
        module.weight.register_hook(lambda g: fired.append("before"))
    model = ModuleModel.observe(module, tree_info(module).spec)
    state_dict = {"weight": torch.ones_like(module.weight)}
    load = LoadInput(state_dict, strict=True, assign=False, swap=True)
    step = StepCheck("SEQ-HOOKS", builtin_target("torch"),
                     StepExample(module, step="load_state_dict", load=load))
    assert "after-hook-lost" in step.declared_clauses
    model.stop_checking_hooks(range(len(model.tensors)), later=True)
    with torch_swap_flag_set():
        module.load_state_dict(state_dict)
    module.weight.register_hook(lambda g: fired.append("after"))
    model.add_hooks(model.slots["weight"], "h1")
    module(torch.ones(1, module.weight.shape[1])).sum().backward()
    assert fired == ([] if hooked_before else ["after"])
    assert not any(hook.checked for hook in model.hooks)
    model.deepcopied()  # new objects take new hooks
    model.add_hooks(model.slots["weight"], "h2")
    assert all(hook.checked for hook in model.hooks if hook.key.startswith("h2"))


@pytest.mark.parametrize("another_weight", [False, True])
@pytest.mark.parametrize("later_raises", [False, True])
def test_an_ignored_none_rnn_weight_hides_forward_error_exactly_when_predicted(
        later_raises, another_weight):
    """torch's RNN runs on the weight a ``None`` took out (``rnn_ignores_a_none_weight``), so a
    later layer's error comes out instead of the spec's ``TypeError``: predicted exactly where
    torch raises that other error."""
    from swapspec.properties.declarations.torch_functional_call import (
        rnn_none_weight_hides_forward_error,
    )
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import build_tree
    from swapspec.strategies.calls import CallInput
    from swapspec.strategies.modules import ForwardError
    from swapspec.strategies.trees import ContainerSpec, LeafSpec, TensorSpec, TreeSpec

    spec = TreeSpec(root=ContainerSpec(children=(
        LeafSpec(kind="catalogue", entry="nn.RNN"),
        LeafSpec(tensors=(TensorSpec(name="p0"),), behaviours=("raise",)))))
    module = build_tree(spec)
    tensors = {"0.inner.weight_hh_l0": None}
    if another_weight:
        tensors["0.inner.weight_ih_l0"] = torch.ones_like(module[0].inner.weight_ih_l0)
    call = CallInput(tensors, (torch.zeros(2, 4),), {"fail": True} if later_raises else {})
    predicted = rnn_none_weight_hides_forward_error(Example(module, call=call))
    raised = None
    try:
        torch.func.functional_call(module, dict(tensors), call.args, call.kwargs)
    except (TypeError, ForwardError) as e:
        raised = type(e)
    assert predicted == (raised is ForwardError)
    assert raised is (TypeError if another_weight else ForwardError if later_raises else None)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_tensor_converted_twice_is_declared_only_where_it_holds_values(device):
    """torch applies ``add(1)`` twice to a tied parameter (``torch.apply.non-idempotent-twice``);
    on ``meta`` the ``+2`` shows in no value, so the declaration must not apply there."""
    from swapspec.properties.declarations.torch_apply import non_idempotent_twice
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting
    from swapspec.strategies.conversions import ADD_ONE

    module = torch.nn.Module()
    module.a = torch.nn.Parameter(torch.zeros(1, device=device))
    module.b = module.a
    example = Example(module, conversion=ADD_ONE, flags=FlagSetting(overwrite=False, swap=False))
    assert non_idempotent_twice(example) is (device == "cpu")
    if device == "cpu":  # what the declaration says torch does
        module._apply(lambda t: t + 1)
        assert module.a.item() == 2.0


def test_remove_spectral_norm_leaves_its_load_pre_hook_so_no_round_trip_loads():
    """Why no strategy draws ``remove_spectral_norm`` (docs/state-space.md):
    torch removes the forward pre-hook and the state_dict hook, but misses the load pre-hook
    (registered wrapped), which then demands the keys spectral norm had (torch 2.13)."""
    module = torch.nn.Linear(3, 3)
    torch.nn.utils.remove_spectral_norm(torch.nn.utils.spectral_norm(module), "weight")
    assert (len(module._forward_pre_hooks), len(module._load_state_dict_pre_hooks)) == (0, 1)
    with pytest.raises(RuntimeError, match=r'Missing key.*"weight_orig", "weight_u"'):
        module.load_state_dict(module.state_dict())


def test_removing_a_global_backward_hook_leaves_its_kind_set_for_good():
    """Why the isolation fixture and the sequence machine save and restore
    ``torch.nn.modules.module._global_is_full_backward_hook`` with the global hook tables: torch
    sets it at a registration and never resets it, so after a non-full global backward hook is
    registered and removed a full one is still refused (torch 2.13)."""
    import torch.nn.modules.module as module_globals

    from swapspec.properties.harness.isolation import (
        global_module_hooks,
        restore_global_module_hooks,
    )

    saved = global_module_hooks()
    try:
        module_globals.register_module_backward_hook(lambda *a: None).remove()
        assert not module_globals._global_backward_hooks
        assert module_globals._global_is_full_backward_hook is False
        with pytest.raises(RuntimeError, match="Cannot use both regular backward hooks and full"):
            module_globals.register_module_full_backward_hook(lambda *a: None)
    finally:
        restore_global_module_hooks(saved)
    assert module_globals._global_is_full_backward_hook is saved[-1][1]


def test_removing_a_module_backward_hook_leaves_its_kind_set_for_good():
    """The same on one module: once a non-full backward hook was registered and removed, the
    module refuses a full one (``Module._is_full_backward_hook`` is never reset; torch 2.13)."""
    module = torch.nn.Linear(2, 2)
    module.register_backward_hook(lambda *a: None).remove()
    assert not module._backward_hooks
    with pytest.raises(RuntimeError, match="Cannot use both regular backward hooks and full"):
        module.register_full_backward_hook(lambda *a: None)


def _parameter_in_buffer_slot(order: str) -> tuple[torch.nn.Module, torch.nn.Module, str]:
    """A module whose parameter ``p`` a buffer slot ``b`` holds too: in the module itself
    (``same``), or in a sibling torch's traversal meets before (``buffer-first``) or after
    (``param-first``) the parameter's own module. Returns the root, the buffer's owner and the
    parameter's owner's attribute name."""
    root = torch.nn.Module()
    if order == "same":
        root.p = torch.nn.Parameter(torch.ones(2))
        root.register_buffer("b", root.p)
        return root, root, ""
    first, second = torch.nn.Module(), torch.nn.Module()
    root.first, root.second = first, second
    holder, owner = (first, second) if order == "buffer-first" else (second, first)
    owner.p = torch.nn.Parameter(torch.ones(2))
    holder.register_buffer("b", owner.p)
    return root, holder, "first" if owner is first else "second"


@pytest.mark.parametrize("flags", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("name", ["float()", "double()", "add(1)", "to('meta')",
                                  "to_empty(device='cpu')", "TwoTensor"])
@pytest.mark.parametrize("order", ["same", "buffer-first", "param-first"])
def test_a_parameter_in_a_buffer_slot_is_split_exactly_when_torch_splits_it(order, name, flags):
    """``torch.apply.splits-parameter-in-buffer-slot`` and ``buffer-slot-keeps-graph``: the
    predicates say whether torch's ``_apply`` leaves the buffer slot holding another object than
    the parameter slot, and whether that object carries an autograd graph, exactly as it does."""
    from swapspec.properties.declarations.torch_apply import (
        buffer_slot_keeps_graph,
        splits_parameter_in_buffer_slot,
    )
    from swapspec.properties.models.apply_state import conversion_named
    from swapspec.properties.models.examples import Example
    from swapspec.strategies import FlagSetting

    conversion = conversion_named(name)
    overwrite, swap = flags
    root, holder, owner_name = _parameter_in_buffer_slot(order)
    example = Example(root, conversion=conversion, flags=FlagSetting(overwrite=overwrite, swap=swap))
    split, graph = splits_parameter_in_buffer_slot(example), buffer_slot_keeps_graph(example)
    root, holder, owner_name = _parameter_in_buffer_slot(order)
    owner = getattr(root, owner_name) if owner_name else root
    saved = (torch.__future__.get_overwrite_module_params_on_conversion(),
             torch.__future__.get_swap_module_params_on_conversion())
    torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    torch.__future__.set_swap_module_params_on_conversion(swap)
    try:
        root._apply(conversion.make_fn())
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(saved[0])
        torch.__future__.set_swap_module_params_on_conversion(saved[1])
    assert split == (holder.b is not owner.p), f"predicted split {split}; torch: {holder.b is not owner.p}"
    assert graph == (holder.b.grad_fn is not None), (
        f"predicted a graph {graph}; torch's buffer slot holds grad_fn {holder.b.grad_fn}")


@pytest.mark.parametrize("flags", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("name", ["double()", "add(1)", "float()"])
def test_a_conversion_under_inference_mode_leaves_inference_tensors_exactly_where_torch_does(name, flags):
    """``torch.seq.conversion-under-inference-mode``: ``holds_inference_tensors`` is false on a
    module built outside inference mode, and after torch's ``_apply`` under
    ``torch.inference_mode()`` it is true exactly where torch left an inference tensor in a slot,
    which then never accumulates a grad; after the reference's conversion it is false."""
    from swapspec import reference
    from swapspec.properties.declarations.torch_apply import holds_inference_tensors
    from swapspec.properties.models.apply_state import conversion_named
    from swapspec.properties.models.examples import Example

    conversion = conversion_named(name)
    overwrite, swap = flags
    built = [torch.nn.Linear(2, 2) for _ in range(2)]
    assert not holds_inference_tensors(Example(built[0]))
    saved = (torch.__future__.get_overwrite_module_params_on_conversion(),
             torch.__future__.get_swap_module_params_on_conversion())
    torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    torch.__future__.set_swap_module_params_on_conversion(swap)
    try:
        with torch.inference_mode():
            built[0]._apply(conversion.make_fn())
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(saved[0])
        torch.__future__.set_swap_module_params_on_conversion(saved[1])
    with torch.inference_mode():
        reference.apply(built[1], conversion.make_fn(), overwrite=overwrite, swap=swap)
    torch_module, reference_module = built
    left = any(p.is_inference() for p in torch_module.parameters())
    assert holds_inference_tensors(Example(torch_module)) == left
    assert left == (name != "float()"), f"torch left inference tensors: {left}"  # float() of float32 is t itself
    assert not holds_inference_tensors(Example(reference_module))
    for module in built:
        module(torch.ones(1, 2, dtype=module.weight.dtype)).sum().backward()
    assert (torch_module.weight.grad is None) == left, "torch's inference parameter got a grad"
    assert reference_module.weight.grad is not None
