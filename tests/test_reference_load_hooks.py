"""Unit tests for hooks and overrides in ``reference.load_state_dict`` (rule 2): pre- and
post-hooks, a class's own ``_load_from_state_dict``, and what each receives, as in torch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers_load import (
    load,
    restore_swap_flags,  # noqa: F401  (autouse: the swap flags restored)
)
from tests.helpers_modules import (
    Shared,
    linear,
)


def test_rule2_pre_hooks_may_rename_keys_and_post_hooks_may_clear_them():
    module = linear()

    def rename(module, state_dict, prefix, *rest):
        if prefix + "w" in state_dict:
            state_dict[prefix + "weight"] = state_dict.pop(prefix + "w")

    def forgive(module, keys):
        keys.unexpected_keys.clear()

    module.register_load_state_dict_pre_hook(rename)
    module.register_load_state_dict_post_hook(forgive)
    load(module, {"w": torch.ones(3, 3), "bias": torch.ones(3), "junk": torch.ones(1)})
    assert torch.equal(module.weight, torch.ones(3, 3))


def test_rule2_post_hook_sees_loaded_values_and_live_keys():
    module = nn.Sequential(linear())
    seen = []
    module[0].register_load_state_dict_post_hook(
        lambda m, keys: seen.append((m.weight.sum().item(), list(keys.missing_keys))))
    load(module, {"0.weight": torch.ones(3, 3)}, strict=False)
    assert seen == [(9.0, ["0.bias"])]


def test_rule2_override_is_honoured_and_reaches_the_reference():
    class Renaming(nn.Linear):
        def _load_from_state_dict(self, state_dict, prefix, *args):
            if prefix + "old_weight" in state_dict:
                state_dict[prefix + "weight"] = state_dict.pop(prefix + "old_weight")
            super()._load_from_state_dict(state_dict, prefix, *args)

    module = nn.Sequential(Renaming(2, 2))
    weight = module[0].weight
    load(module, {"0.old_weight": torch.ones(2, 2), "0.bias": torch.ones(2)}, swap=True)
    assert module[0].weight is weight and torch.equal(weight, torch.ones(2, 2))
    assert nn.Module._load_from_state_dict.__qualname__ == "Module._load_from_state_dict"


def test_rule2_batchnorm_override_adds_num_batches_tracked():
    module = nn.BatchNorm1d(2)
    old = {k: v for k, v in module.state_dict().items() if k != "num_batches_tracked"}
    old = dict(old)

    class Versioned(dict):
        _metadata = {"": {"version": 1}}

    assert load(module, Versioned(old)) == ([], [])


def test_rule2_shared_submodule_hooks_run_per_path():
    module = Shared()
    calls = []
    module.a.register_load_state_dict_pre_hook(lambda m, sd, prefix, *rest: calls.append(prefix))
    load(module, module.state_dict())
    assert calls == ["a.", "b."]


def _recorded_hook_calls(module: nn.Module, call) -> list:
    """What every pre-hook and ``_load_from_state_dict`` of ``module``'s tree received."""
    seen = []

    class Recording(nn.Linear):
        def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, *rest):
            seen.append(("override", prefix, dict(local_metadata), strict))
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, *rest)

    module[1] = Recording(3, 2)
    for m in module.modules():
        m._register_load_state_dict_pre_hook(
            lambda sd, prefix, meta, strict, *rest: seen.append(("hook", prefix, dict(meta),
                                                                  strict)))
    given = module.state_dict()
    given._metadata = {"": {"version": 1}, "0": {"version": 7}}  # none for "1"
    call(module, given)
    return seen


@pytest.mark.parametrize("assign", [False, True])
def test_rule2_metadata_and_strict_reach_hooks_and_overrides_as_in_torch(assign):
    mine = _recorded_hook_calls(nn.Sequential(linear(), linear()),
                                lambda m, sd: load(m, sd, assign=assign))
    torchs = _recorded_hook_calls(nn.Sequential(linear(), linear()),
                                  lambda m, sd: m.load_state_dict(sd, assign=assign))
    assert mine == torchs
    assert ("hook", "0.", {"version": 7, **({"assign_to_params_buffers": True} if assign else {})},
            True) in mine


def test_rule2_post_hook_returning_a_value_is_torchs_exact_assertion():
    ours, theirs = linear(), linear()
    for module in (ours, theirs):
        module.register_load_state_dict_post_hook(lambda m, keys: keys)
    with pytest.raises(AssertionError) as mine:
        load(ours, ours.state_dict())
    with pytest.raises(AssertionError) as torchs:
        theirs.load_state_dict(theirs.state_dict())
    assert str(mine.value) == str(torchs.value)


def test_rule2_a_childs_metadata_is_found_under_its_whole_name():
    """A child named ``norm`` reads the metadata under ``"norm"``: with its version 2 a
    ``BatchNorm`` without ``num_batches_tracked`` reports it missing, as torch's does."""
    from collections import OrderedDict

    results = []
    for who in ("torch", "reference"):
        module = nn.Sequential(OrderedDict(norm=nn.BatchNorm1d(2)))
        given = module.state_dict()
        del given["norm.num_batches_tracked"]
        assert given._metadata["norm"]["version"] == 2
        results.append(module.load_state_dict(given, strict=False) if who == "torch"
                       else load(module, given, strict=False))
    assert results[1] == results[0] == (["norm.num_batches_tracked"], [])


class _Reporting(nn.Linear):
    """Adds a missing and an unexpected key of its own in its ``_load_from_state_dict``."""

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        missing_keys.append(prefix + "override_missing")
        unexpected_keys.append(prefix + "override_unexpected")


def _report_from_pre_hook(module, state_dict, prefix, local_metadata, strict, missing_keys,
                          unexpected_keys, error_msgs):
    missing_keys.append(prefix + "hook_missing")
    unexpected_keys.append(prefix + "hook_unexpected")


def test_rule2_hooks_and_overrides_report_into_the_loads_lists():
    """A pre-hook and a class's ``_load_from_state_dict`` append to the lists they are given:
    the load returns those keys, as torch's does."""
    results = []
    for who in ("torch", "reference"):
        module = nn.Sequential(_Reporting(2, 2))
        module[0].register_load_state_dict_pre_hook(_report_from_pre_hook)
        given = module.state_dict()
        results.append(module.load_state_dict(given, strict=False) if who == "torch"
                       else load(module, given, strict=False))
    assert results[1] == results[0]
    assert "0.override_missing" in results[1].missing_keys
    assert "0.hook_unexpected" in results[1].unexpected_keys


class _Refusing(nn.Linear):
    def _load_from_state_dict(self, state_dict, prefix, *args):
        super()._load_from_state_dict(state_dict, prefix, *args)
        args[-1].append("the override refuses")


@pytest.mark.parametrize("source", ["override", "pre-hook"])
def test_rule2_an_error_a_hook_or_override_reports_fails_the_load(source):
    """An error message a pre-hook or an override appends fails the load with torch's
    ``RuntimeError`` text, and the module is left as it was."""
    def refuse(module, state_dict, prefix, *args):
        args[-1].append("the pre-hook refuses")

    messages = []
    for who in ("torch", "reference"):
        module = nn.Sequential(_Refusing(2, 2) if source == "override" else nn.Linear(2, 2))
        if source == "pre-hook":
            module[0].register_load_state_dict_pre_hook(refuse)
        weight = module[0].weight.detach().clone()
        given = {k: v + 1 for k, v in module.state_dict().items()}
        with pytest.raises(RuntimeError) as raised:
            module.load_state_dict(given) if who == "torch" else load(module, given)
        messages.append(str(raised.value))
        if who == "reference":
            assert torch.equal(module[0].weight.detach(), weight)
    assert messages[1] == messages[0] and "refuses" in messages[1]
