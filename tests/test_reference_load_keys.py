"""Unit tests for ``reference.load_state_dict``'s keys and errors (rules 1, 3 and 7): torch's
return value, errors, messages and warnings, which keys load and which do not, and the caller's
mapping left as it was."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from swapspec import reference
from swapspec.properties.harness.targets import torch_future_flags
from tests.helpers_load import (
    error_of,
    load,
    paths,
    restore_swap_flags,  # noqa: F401  (autouse: the swap flags restored)
    shifted,
)
from tests.helpers_modules import (
    linear,
)


def test_rule1_non_mapping_is_torchs_type_error():
    module = linear()
    with pytest.raises(TypeError, match="Expected state_dict to be dict-like, got <class 'list'>"):
        load(module, [])
    with pytest.raises(TypeError, match="Expected state_dict to be dict-like"):
        module.load_state_dict([])


@paths
def test_rule7_all_keys_matched(swap, assign):
    module = linear()
    result = load(module, shifted(module), swap=swap, assign=assign)
    assert result == ([], []) and repr(result) == "<All keys matched successfully>"


def bad_state_dict(module: nn.Module) -> dict:
    bad = shifted(module)
    del bad["0.bias"]
    bad["extra"] = torch.ones(1)
    bad["1.bias"] = torch.zeros(5)
    bad["1.weight"] = 3
    return bad


@pytest.mark.parametrize("strict", [True, False])
@paths
def test_rule7_messages_and_keys_are_torchs(swap, assign, strict):
    ours, theirs = nn.Sequential(linear(), linear()), nn.Sequential(linear(), linear())
    bad = bad_state_dict(ours)
    mine = error_of(lambda: load(ours, bad, strict=strict, swap=swap, assign=assign))
    torch.__future__.set_swap_module_params_on_conversion(swap)
    assert mine == error_of(lambda: theirs.load_state_dict(bad, strict=strict, assign=assign))
    assert mine.startswith("Error(s) in loading state_dict for Sequential:\n\t")
    assert ('Missing key(s) in state_dict: "0.bias"' in mine) is strict
    assert "size mismatch for 1.bias" in mine and '"1.weight"' in mine


@paths
def test_rule7_non_strict_returns_the_keys(swap, assign):
    module = nn.Sequential(linear(), linear())
    given = shifted(module)
    del given["0.bias"]
    given["extra"] = torch.ones(1)
    given["2.weight"] = torch.ones(1)
    result = load(module, given, strict=False, swap=swap, assign=assign)
    assert result.missing_keys == ["0.bias"]
    assert result.unexpected_keys == ["extra", "2.weight"]
    assert torch.equal(module[1].weight, given["1.weight"])


def test_rule3_one_element_value_into_a_0_dim_slot():
    module = nn.Module()
    module.register_buffer("step", torch.tensor(1.0))
    load(module, {"step": torch.tensor([7.0])})
    assert module.step.shape == () and module.step.item() == 7.0


def test_rule3_meta_slot_from_real_value_warns_as_torch():
    module = linear().to("meta")
    with pytest.warns(UserWarning, match="copying from a non-meta parameter"):
        load(module, linear().state_dict())
    assert module.weight.is_meta


def test_rule3_extra_state_loaded_missing_and_unexpected():
    class WithExtra(nn.Module):
        def __init__(self):
            super().__init__()
            self.state = 1

        def get_extra_state(self):
            return self.state

        def set_extra_state(self, state):
            self.state = state

    module = WithExtra()
    load(module, {"_extra_state": 5})
    assert module.state == 5
    assert load(module, {}, strict=False).missing_keys == ["_extra_state"]
    assert load(linear(), {**linear().state_dict(), "_extra_state": 1},
                strict=False).unexpected_keys == ["_extra_state"]


def test_rule3_none_slot_key_is_unexpected():
    module = linear()
    module.bias = None
    result = load(module, {"weight": torch.zeros(3, 3), "bias": torch.zeros(3)}, strict=False)
    assert result.unexpected_keys == ["bias"] and module.bias is None


def test_rule3_non_persistent_buffer_is_not_loaded():
    module = nn.Module()
    module.register_buffer("seen", torch.zeros(2), persistent=False)
    result = load(module, {"seen": torch.ones(2)}, strict=False)
    assert result.unexpected_keys == ["seen"] and torch.equal(module.seen, torch.zeros(2))


def test_rule1_caller_mapping_and_metadata_unchanged():
    module = linear()
    given = module.state_dict()
    metadata = {"": {"version": 1}}
    given._metadata = metadata
    load(module, given, assign=True)
    assert metadata == {"": {"version": 1}} and list(given) == ["weight", "bias"]


def test_rule1_swap_none_reads_reference_flags():
    module = linear()
    weight = module.weight
    cdata = weight._cdata
    with reference.flags(swap=True):
        load(module, shifted(module))
    assert module.weight is weight and weight._cdata != cdata
    cdata = weight._cdata
    load(module, shifted(module))
    assert weight._cdata == cdata


def test_rule3_copy_into_real_slots_does_not_warn():
    module = linear()
    given = shifted(module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning fails the load
        load(module, given)
    assert torch.equal(module.weight, given["weight"])


def test_rule7_several_missing_and_unexpected_keys_are_listed_as_torch_does():
    ours, theirs = nn.Sequential(linear(), linear()), nn.Sequential(linear(), linear())
    given = shifted(ours)
    del given["0.bias"], given["1.bias"]
    given["x"], given["y"] = torch.ones(1), torch.ones(1)
    mine = error_of(lambda: load(ours, given))
    assert mine == error_of(lambda: theirs.load_state_dict(given))
    assert 'Missing key(s) in state_dict: "0.bias", "1.bias". ' in mine
    assert 'Unexpected key(s) in state_dict: "x", "y". ' in mine


def test_rule3_meta_warning_text_is_torchs():
    ours, theirs = linear().to("meta"), linear().to("meta")
    given = linear().state_dict()
    with pytest.warns(UserWarning) as mine:
        load(ours, given)
    with pytest.warns(UserWarning) as torchs:
        theirs.load_state_dict(given)
    assert [str(w.message) for w in mine] == [str(w.message) for w in torchs]


def test_rule3_a_failed_copy_is_torchs_copying_message():
    ours, theirs = linear(), linear()
    given = {k: v.to("meta") for k, v in ours.state_dict().items()}
    mine = error_of(lambda: load(ours, given))
    assert mine == error_of(lambda: theirs.load_state_dict(given))
    assert 'While copying the parameter named "weight"' in mine


@pytest.mark.parametrize("dropped", [(), ("0.weight_orig",), ("0.weight_u",), ("0.weight_v",),
                                     ("0.weight_u", "0.weight_v")])
@pytest.mark.parametrize("metadata", [False, True])
def test_key_model_counts_the_missing_keys_old_spectral_norm_adds(dropped, metadata):
    """Without version metadata, an old-style spectral_norm's load pre-hook adds its own
    missing keys (``<name>`` among them), whatever ``strict``: the spec's key model says so."""
    from swapspec.properties.models.load_examples import key_model

    def build() -> nn.Module:
        m = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 4))
        torch.nn.utils.spectral_norm(m[0])
        return m

    given = build().state_dict()
    given = given if metadata else dict(given)
    for key in dropped:
        del given[key]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_keys = build().load_state_dict(given, strict=False)
        reference_keys = reference.load_state_dict(build(), given, strict=False)
    model = key_model(build(), given)
    assert sorted(torch_keys.missing_keys) == sorted(reference_keys.missing_keys) == sorted(model.missing)


def test_a_one_element_value_loads_a_0d_slot_with_its_element_like_torch():
    """torch's 0.3 compatibility: a ``(1,)`` value loads a 0-dim slot with its element, on
    every path, and the load model (``as_loaded``) predicts it; any other shape stays a size
    mismatch."""
    from swapspec.properties.models.load_examples import as_loaded, loaded_values

    for assign, swap in [(False, False), (True, False), (False, True), (True, True)]:
        ours, theirs = nn.Module(), nn.Module()
        for m in (ours, theirs):
            m.register_buffer("count", torch.tensor(1.0))
        value = torch.tensor([3.0])
        reference.load_state_dict(ours, {"count": value}, assign=assign, swap=swap)
        with torch_future_flags(swap=swap):
            theirs.load_state_dict({"count": value.clone()}, assign=assign)
        assert ours.count.shape == theirs.count.shape == ()
        assert float(ours.count) == float(theirs.count) == 3.0
        assert float(loaded_values({"count": torch.tensor(1.0)}, {"count": value})["count"]) == 3.0
    two = torch.tensor([3.0, 4.0])
    assert as_loaded(torch.tensor(1.0), two) is two
    with pytest.raises(RuntimeError, match="size mismatch"):
        reference.load_state_dict(ours, {"count": two})
