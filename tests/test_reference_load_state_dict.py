"""Unit tests for ``reference.load_state_dict``: torch's return value and errors, the three paths,
identity on the swap path, ties, atomicity, hooks, overrides and the round trip."""

from __future__ import annotations

import warnings
import weakref

import pytest
import torch
from torch import Tensor, nn
from torch.testing._internal.two_tensor import TwoTensor

from swapspec import reference
from swapspec.reference.load_state_dict import choose_load_path, same_value
from tests.helpers_modules import (
    Shared,
    TaggedParameter,
    ThreeAliases,
    Tied,
    assert_unchanged,
    fill_grads,
    linear,
    snapshot,
    tagged,
)

PATHS = [(False, False), (False, True), (True, False), (True, True)]
PATH_IDS = ["copy", "assign", "swap", "swap+assign"]
paths = pytest.mark.parametrize(("swap", "assign"), PATHS, ids=PATH_IDS)


@pytest.fixture(autouse=True)
def _restore_flags():
    """Leave the reference's and torch's swap flags as each test found them."""
    saved = (reference.get_swap_module_params_on_conversion(),
             torch.__future__.get_swap_module_params_on_conversion())
    try:
        yield
    finally:
        reference.set_swap_module_params_on_conversion(saved[0])
        torch.__future__.set_swap_module_params_on_conversion(saved[1])


def shifted(module: nn.Module, by: float = 1.0) -> dict[str, torch.Tensor]:
    """The module's state dict with every floating value moved by ``by`` (new objects)."""
    return {k: v + by if v.is_floating_point() else v.clone() for k, v in module.state_dict().items()}


def load(module, state_dict, **kwargs):
    return reference.load_state_dict(module, state_dict, **kwargs)


def error_of(call) -> str:
    with pytest.raises(RuntimeError) as info:
        call()
    return str(info.value)


# ---- rules 1, 3 and 7: torch's return value, errors and messages --------------------------


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


# ---- rule 1: the caller's mapping is untouched; swap=None reads the flags -----------------


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


def test_rule4_path_choice():
    assert choose_load_path(swap=True, assign=True) == "swap"
    assert choose_load_path(swap=True, assign=False) == "swap"
    assert choose_load_path(swap=False, assign=True) == "assign"
    assert choose_load_path(swap=False, assign=False) == "copy"


# ---- rule 4: the three paths ----------------------------------------------------------------


def test_rule4_copy_keeps_object_and_cdata():
    module = linear()
    weight, cdata = module.weight, module.weight._cdata
    given = shifted(module)
    load(module, given)
    assert module.weight is weight and weight._cdata == cdata
    assert torch.equal(weight, given["weight"])


def test_rule4_assign_puts_the_value_in_with_the_slots_requires_grad():
    module = linear()
    module.bias.requires_grad_(False)
    given = {"weight": torch.ones(3, 3, dtype=torch.float64), "bias": nn.Parameter(torch.ones(3))}
    load(module, given, assign=True)
    assert isinstance(module.weight, nn.Parameter) and module.weight.dtype == torch.float64
    assert module.weight.requires_grad
    assert module.bias is given["bias"] and not given["bias"].requires_grad


def test_rule4_assign_buffer_is_the_value_itself():
    module = nn.BatchNorm1d(3)
    given = shifted(module)
    load(module, given, assign=True)
    assert module.running_mean is given["running_mean"]


@pytest.mark.parametrize("assign", [False, True], ids=["copy", "assign"])
def test_rule4_swap_keeps_object_with_new_contents(assign):
    module = linear()
    weight, cdata = module.weight, module.weight._cdata
    given = {k: v.double() for k, v in shifted(module).items()}
    load(module, given, swap=True, assign=assign)
    assert module.weight is weight and weight._cdata != cdata
    assert weight.dtype == (torch.float64 if assign else torch.float32)
    assert torch.equal(weight.double(), given["weight"])


def test_rule4_swap_honours_subclass_module_load():
    class Halving(nn.Parameter):
        def module_load(self, other, assign=False):
            return (other / 2).detach()

    module = linear()
    module.weight = Halving(module.weight.detach().clone())
    load(module, {"weight": torch.full((3, 3), 4.0), "bias": torch.zeros(3)}, swap=True)
    assert torch.equal(module.weight.detach(), torch.full((3, 3), 2.0))


def test_rule4_module_load_returning_an_input_is_torchs_error():
    class Lazy(nn.Parameter):
        def module_load(self, other, assign=False):
            return other

    module = linear()
    module.weight = Lazy(module.weight.detach().clone())
    before = snapshot(module)
    text = error_of(lambda: load(module, shifted(module), swap=True))
    assert 'While swapping the parameter named "weight"' in text
    assert "module_load returned one of self or other" in text
    assert_unchanged(before, module)


def test_rule4_swap_honours_torch_function_of_a_subclass():
    calls = []

    class Watched(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            calls.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    module = nn.Module()
    module.register_buffer("b", torch.zeros(2).as_subclass(Watched))
    load(module, {"b": torch.ones(2)}, swap=True)
    assert "module_load" in calls and torch.equal(module.b.as_subclass(torch.Tensor), torch.ones(2))


def test_rule4_two_tensor_value():
    module = linear()
    value = TwoTensor(torch.ones(3, 3), torch.ones(3, 3))
    load(module, {"weight": value, "bias": torch.zeros(3)}, swap=True, assign=True)
    assert isinstance(module.weight, TwoTensor) and isinstance(module.weight, nn.Parameter)


# ---- rule 5: identity on the swap path ----------------------------------------------------------


@pytest.mark.parametrize("assign", [False, True], ids=["copy", "assign"])
def test_rule5_swap_keeps_class_attributes_grad_hooks_and_optimizer(assign):
    module = linear()
    module.weight = tagged(module.weight.detach().clone(), "w")
    module.bias.requires_grad_(False)
    fill_grads(module)
    weight, grad = module.weight, module.weight.grad
    fired = []
    weight.register_hook(lambda g: fired.append("hook"))
    weight.register_post_accumulate_grad_hook(lambda p: fired.append("post"))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    load(module, shifted(module), swap=True, assign=assign)
    assert module.weight is weight and weight.tag == "w"
    assert type(weight) is (nn.Parameter if assign else TaggedParameter)
    assert weight.grad is grad and not module.bias.requires_grad
    assert optimizer.param_groups[0]["params"][0] is weight
    module(torch.ones(1, 3)).sum().backward()
    assert fired == ["hook", "post"]


def test_rule5_grad_follows_a_dtype_change():
    module = linear()
    fill_grads(module)
    load(module, {k: v.double() for k, v in module.state_dict().items()}, swap=True, assign=True)
    assert module.weight.grad.dtype == torch.float64


# ---- rule 6: ties ---------------------------------------------------------------------------------


@paths
def test_rule6_ties_kept(swap, assign):
    module = Tied()
    given = shifted(module)
    load(module, given, swap=swap, assign=assign)
    assert module.enc.weight is module.dec.weight and module.enc.scale is module.dec.scale
    assert torch.equal(module.enc.weight, given["dec.weight"])


@paths
def test_rule6_shared_submodule_stays_shared(swap, assign):
    module = Shared()
    load(module, shifted(module), swap=swap, assign=assign)
    assert module.a is module.b and module.a.weight is module.b.weight


@paths
def test_rule6_one_alias_given_fills_every_alias(swap, assign):
    module = Tied()
    given = shifted(module)
    del given["dec.weight"]
    load(module, given, strict=False, swap=swap, assign=assign)
    assert module.enc.weight is module.dec.weight
    assert torch.equal(module.dec.weight, given["enc.weight"])


@paths
def test_rule6_equal_values_in_different_objects_are_one_value(swap, assign):
    module = Tied()
    given = shifted(module)
    given["dec.weight"] = given["enc.weight"].clone()
    load(module, given, swap=swap, assign=assign)
    assert module.enc.weight is module.dec.weight


@paths
def test_rule6_different_values_for_aliases_are_an_error(swap, assign):
    module = Tied()
    given = shifted(module)
    given["dec.weight"] = given["enc.weight"] + 1
    before = snapshot(module)
    text = error_of(lambda: load(module, given, swap=swap, assign=assign))
    assert 'While loading the tied names "enc.weight" and "dec.weight"' in text
    assert_unchanged(before, module)


def test_same_value_rules():
    a = torch.tensor([1.0, float("nan")])
    assert same_value(a, a.clone()) and not same_value(a, a + 1)
    assert not same_value(a, a.double()) and not same_value(a, 3)
    assert same_value(torch.tensor([1, 2]), torch.tensor([1, 2]))
    assert not same_value(torch.tensor([1, 2]), torch.tensor([1, 3]))
    assert same_value(torch.empty(2, device="meta"), torch.empty(2, device="meta"))
    assert not same_value(a, TwoTensor(a, a))


class _RealFloatingIsnan(torch.overrides.TorchFunctionMode):
    """XLA's limitation, on the CPU: ``isnan`` of a complex or bool tensor raises (made
    stricter here: of any tensor that is not real floating-point)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.isnan, Tensor.isnan) and not args[0].is_floating_point():
            raise RuntimeError("Operands to IsNan must be real-valued floating-point")
        return func(*args, **(kwargs or {}))


def test_same_value_compares_complex_values_as_real_pairs():
    a = torch.tensor([complex(1, float("nan")), complex(2, 3)])
    b = a.clone()
    b[1] = complex(2, 4)
    with _RealFloatingIsnan():
        assert same_value(a, a.clone()) and not same_value(a, b)
        assert same_value(a.conj(), a.conj().resolve_conj())


def test_same_value_of_integers_and_bools_needs_no_isnan():
    with _RealFloatingIsnan():
        assert same_value(torch.tensor([True]), torch.tensor([True]))
        assert not same_value(torch.tensor([1, 2]), torch.tensor([1, 3]))


@pytest.mark.parametrize("buffer", [torch.tensor([complex(1, 2)]), torch.tensor([True]),
                                    torch.tensor([3])], ids=["complex", "bool", "int"])
def test_rule8_restores_every_tensor_where_isnan_takes_real_floating_only(buffer):
    module = nn.Module()
    module.register_buffer("c", buffer)
    module.register_parameter("p", nn.Parameter(torch.tensor([1.0])))
    p = module.p.detach().clone()
    with _RealFloatingIsnan(), pytest.raises(RuntimeError, match="Missing key"):
        reference.load_state_dict(module, {"p": torch.tensor([5.0])})
    assert torch.equal(module.p.detach(), p) and torch.equal(module.c, buffer)


# ---- rule 8: atomic ---------------------------------------------------------------------------------


@pytest.mark.parametrize("strict", [True, False])
@paths
def test_rule8_a_bad_key_leaves_the_module_as_it_was(swap, assign, strict):
    module = nn.Sequential(linear(), Tied())
    fill_grads(module)
    given = {k: v + 1 for k, v in module.state_dict().items()}
    given["1.dec.bias"] = torch.zeros(7)  # the last key: everything before it was written
    before = snapshot(module)
    error_of(lambda: load(module, given, strict=strict, swap=swap, assign=assign))
    assert_unchanged(before, module)


@paths
def test_rule8_a_missing_key_leaves_the_module_as_it_was(swap, assign):
    module = nn.Sequential(linear(), linear())
    given = shifted(module)
    del given["1.bias"]
    before = snapshot(module)
    error_of(lambda: load(module, given, swap=swap, assign=assign))
    assert_unchanged(before, module)


def test_rule8_refused_swap_rolls_back():
    module = nn.Sequential(linear(), linear())
    keep = weakref.ref(module[1].weight)  # swap_tensors refuses a tensor with a weakref
    before = snapshot(module)
    text = error_of(lambda: load(module, shifted(module), swap=True))
    assert 'While swapping the parameter named "1.weight"' in text and "weakref" in text
    assert_unchanged(before, module)
    assert keep() is module[1].weight


def test_rule8_hook_error_rolls_back_and_propagates():
    module = nn.Sequential(linear(), linear())

    def boom(module, keys):
        raise KeyError("boom")

    module.register_load_state_dict_post_hook(boom)
    before = snapshot(module)
    with pytest.raises(KeyError, match="boom"):
        load(module, shifted(module), assign=True)
    assert_unchanged(before, module)


def test_rule8_post_hook_returning_a_value_is_torchs_assertion():
    module = linear()
    module.register_load_state_dict_post_hook(lambda m, keys: 1)
    before = snapshot(module)
    with pytest.raises(AssertionError, match="not expected to return new values"):
        load(module, shifted(module))
    assert_unchanged(before, module)


def test_rule8_extra_state_and_given_parameter_restored():
    class WithExtra(nn.Linear):
        extra = 0

        def get_extra_state(self):
            return self.extra

        def set_extra_state(self, state):
            self.extra = state

    module = WithExtra(2, 2)
    given = {"weight": nn.Parameter(torch.ones(2, 2), requires_grad=False),
             "bias": torch.zeros(5), "_extra_state": 9}
    error_of(lambda: load(module, given, assign=True))
    assert module.extra == 0 and not given["weight"].requires_grad
    assert module.weight is not given["weight"]


def test_rule8_lazy_materialization_rolled_back():
    module = nn.Sequential(nn.LazyLinear(2), linear(2, 2))
    given = {"0.weight": torch.ones(2, 4), "0.bias": torch.ones(2), "1.weight": torch.ones(9)}
    error_of(lambda: load(module, given, strict=False))
    assert isinstance(module[0].weight, nn.UninitializedParameter)
    load(module, {**given, "1.weight": torch.ones(2, 2), "1.bias": torch.ones(2)})
    assert module[0].weight.shape == (2, 4) and type(module[0].weight) is nn.Parameter


def test_rule8_rnn_flat_weights_follow_the_rollback():
    module = nn.LSTM(2, 2)
    weights = list(module._flat_weights)
    given = shifted(module)
    given["bias_hh_l0"] = torch.zeros(3)
    error_of(lambda: load(module, given, assign=True))
    assert all(a is b for a, b in zip(module._flat_weights, weights, strict=True))


# ---- rule 2: hooks and overrides ----------------------------------------------------------------


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


# ---- rule 9: round trip -------------------------------------------------------------------------------


@paths
def test_rule9_round_trip_changes_nothing(swap, assign):
    module = nn.Sequential(Tied(), nn.BatchNorm1d(3), linear())
    module[2].weight = tagged(module[2].weight.detach().clone())
    fill_grads(module)
    before = snapshot(module)
    load(module, module.state_dict(), swap=swap, assign=assign)
    assert module[0].enc.weight is module[0].dec.weight
    if swap:  # new TensorImpls with the same contents
        for state in before:
            for t in [*state.params.values(), *state.buffers.values()]:
                t.cdata = t.obj._cdata
    assert_unchanged(before, module)


def test_rule4_assign_of_a_copy_of_own_data_is_a_new_object():
    module = linear()
    weight = module.weight
    load(module, {k: v.clone() for k, v in module.state_dict().items()}, assign=True)
    assert module.weight is not weight


@paths
def test_rule4_uninitialized_into_uninitialized_is_left_as_it_is(swap, assign):
    module = nn.Sequential(nn.LazyLinear(2))
    weight = module[0].weight
    load(module, module.state_dict(), swap=swap, assign=assign)
    assert module[0].weight is weight and isinstance(weight, nn.UninitializedParameter)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_rule9_old_weight_norm_on_the_swap_path():
    module = nn.utils.weight_norm(linear())
    g = module.weight_g
    given = shifted(module)
    load(module, given, swap=True)
    assert module.weight_g is g and torch.equal(g, given["weight_g"])
    assert torch.allclose(module.weight, torch._weight_norm(module.weight_v, g, 0))
    before = snapshot(module)
    error_of(lambda: load(module, {**given, "bias": torch.ones(5)}, swap=True))
    assert_unchanged(before, module)


def changed_one_alias(module: nn.Module, key: str) -> dict[str, Tensor]:
    """``state_dict()`` (every value the slot's own data) with ``key`` alone given new values."""
    given = module.state_dict()
    given[key] = given[key] + 1
    return given


@paths
@pytest.mark.parametrize("changed", ["a.weight", "b.weight"])
def test_rule6_own_data_of_a_shared_submodule_yields_to_the_changed_alias(swap, assign, changed):
    """PyTorch's shared-Linear scenario: the unchanged alias never undoes the changed one."""
    module = Shared()
    weight, bias = module.a.weight, module.a.bias
    given = changed_one_alias(module, changed)
    expected = given[changed].clone()
    assert load(module, given, swap=swap, assign=assign) == ([], [])
    assert module.a is module.b and module.a.bias is bias
    assert torch.equal(module.a.weight, expected)
    assert (module.a.weight is weight) == (swap or not assign)  # assign alone puts a new object


@paths
@pytest.mark.parametrize("changed", ["enc.weight", "dec.weight", "enc.scale", "dec.scale"])
def test_rule6_own_data_of_a_tie_made_by_assignment_yields(swap, assign, changed):
    module = Tied()
    given = changed_one_alias(module, changed)
    expected = given[changed].clone()
    load(module, given, swap=swap, assign=assign)
    name = changed.split(".")[1]
    assert getattr(module.enc, name) is getattr(module.dec, name)
    assert torch.equal(getattr(module.enc, name), expected)


@paths
def test_rule6_own_data_yields_also_when_a_post_hook_made_its_write_already(swap, assign):
    """A post hook on the shared module flushes the first alias's write before the second
    alias is reached: the changed value is still written."""
    module = Shared()
    seen = []
    module.a.register_load_state_dict_post_hook(
        lambda m, keys: seen.append(m.weight.detach().clone()))
    given = changed_one_alias(module, "b.weight")
    expected = given["b.weight"].clone()
    load(module, given, swap=swap, assign=assign)
    assert module.a is module.b and torch.equal(module.a.weight, expected)
    assert len(seen) == 2 and torch.equal(seen[1], expected)


@paths
def test_rule6_every_alias_given_own_data_is_a_round_trip(swap, assign):
    module = Tied()
    before = snapshot(module)
    load(module, module.state_dict(keep_vars=True), swap=swap, assign=assign)
    assert module.enc.weight is module.dec.weight and module.enc.scale is module.dec.scale
    assert all(torch.equal(a, b) for a, b in zip(module.state_dict().values(),
                                                 [s.value for s in _slot_states(before)],
                                                 strict=True))


def _slot_states(before):
    """The values of ``before``'s tree in ``state_dict()`` order (the modules have no
    non-persistent buffers)."""
    return [state for s in before for table in (s.params, s.buffers)
            for state in table.values() if state is not None]


@paths
def test_rule6_two_changed_aliases_are_refused_even_beside_own_data(swap, assign):
    module = ThreeAliases()
    given = module.state_dict()  # w, a.w, b.w: w stays the slot's own data
    given["a.w"], given["b.w"] = torch.tensor([5.0, 6.0]), torch.tensor([7.0, 8.0])
    before = snapshot(module)
    text = error_of(lambda: load(module, given, swap=swap, assign=assign))
    assert 'While loading the tied names "a.w" and "b.w": they were given different values.' in text
    assert "\"w\"" not in text
    assert_unchanged(before, module)


@paths
def test_rule6_changed_values_equal_to_each_other_beside_own_data_load(swap, assign):
    module = ThreeAliases()
    given = module.state_dict()
    given["a.w"], given["b.w"] = torch.tensor([5.0, 6.0]), torch.tensor([5.0, 6.0])
    load(module, given, swap=swap, assign=assign)
    assert module.w is module.a.w is module.b.w and torch.equal(module.w, given["b.w"])


@paths
@pytest.mark.parametrize("other", ["transposed alias", "another slot's data"])
def test_rule6_an_alias_with_another_layout_or_slot_is_not_own_data(swap, assign, other):
    """Own data is the slot's storage at its offset, shape and strides: a transposed view of
    it, or another slot's data of the same shape, is a value of its own and conflicts."""
    module = Shared()
    module.c = linear(2, 2, seed=11)
    given = module.state_dict()
    given["a.weight"] = torch.ones(2, 2)
    given["b.weight"] = (module.a.weight.detach().t() if other == "transposed alias"
                         else module.c.weight.detach())
    before = snapshot(module)
    text = error_of(lambda: load(module, given, swap=swap, assign=assign))
    assert 'While loading the tied names "a.weight" and "b.weight"' in text
    assert_unchanged(before, module)


@paths
def test_rule6_own_data_yields_under_the_flags_of_the_upstream_redirect(swap, assign):
    """The reference reads ``reference.flags`` when ``swap`` is not given."""
    module = Shared()
    given = changed_one_alias(module, "a.weight")
    expected = given["a.weight"].clone()
    with reference.flags(swap=swap):
        load(module, given, assign=assign)
    assert torch.equal(module.b.weight, expected)


class Marked(nn.Parameter):
    """A Parameter subclass a hook may turn a parameter into."""


def meddling_pre_hook(module, state_dict, prefix, *rest):
    """Changes everything a hook can change on the module's tensors, before the load fails."""
    weight = module.weight
    weight.__class__ = Marked
    weight.note = "added"
    weight.requires_grad_(False)
    weight.grad = None
    with torch.no_grad():
        module.bias.add_(5)
    module.running.data = torch.zeros(7)
    module._parameters["extra"] = nn.Parameter(torch.ones(1))
    module._non_persistent_buffers_set.add("running")
    module._parameters["weight"] = nn.Parameter(torch.zeros(3, 3))


def test_rule8_rollback_undoes_what_hooks_did_to_tensors_and_slots():
    module = linear()
    module.register_buffer("running", torch.arange(3.0))
    fill_grads(module)
    weight, grad = module.weight, module.weight.grad
    running_data = module.running.data
    module.register_load_state_dict_pre_hook(meddling_pre_hook)
    before = snapshot(module)
    given = {"weight": torch.ones(3, 3), "bias": torch.zeros(9), "running": torch.ones(3)}
    error_of(lambda: load(module, given))
    assert module._parameters["weight"] is weight and type(weight) is nn.Parameter
    assert "note" not in weight.__dict__ and weight.requires_grad and weight.grad is grad
    assert module.running.data.data_ptr() == running_data.data_ptr()
    assert "extra" not in module._parameters and "running" not in module._non_persistent_buffers_set
    assert_unchanged(before, module)


def test_rule4_assign_into_a_frozen_parameter_keeps_it_frozen():
    module = linear()
    module.weight.requires_grad_(False)
    load(module, {"weight": torch.ones(3, 3), "bias": torch.ones(3)}, assign=True)
    assert isinstance(module.weight, nn.Parameter) and not module.weight.requires_grad
    assert module.bias.requires_grad


def test_rule4_assign_updates_an_rnns_flat_weights():
    module = nn.LSTM(2, 2)
    load(module, shifted(module), assign=True)
    names = module._flat_weights_names
    assert all(w is getattr(module, n) for w, n in zip(module._flat_weights, names, strict=True))


def emptying_pre_hook(module, state_dict, prefix, *rest):
    module._parameters["bias"] = None
    module._buffers["running"] = torch.full((3,), 9.0)


def test_rule8_rollback_puts_back_none_and_rebound_slots():
    module = linear()
    module.register_buffer("running", torch.arange(3.0))
    bias, running = module.bias, module.running
    module.register_load_state_dict_pre_hook(emptying_pre_hook)
    before = snapshot(module)
    error_of(lambda: load(module, {"weight": torch.ones(2), "running": torch.ones(3)},
                          strict=False))
    assert module.bias is bias and module.running is running
    assert_unchanged(before, module)


# ---- focused rules (each one pins a branch of the reference) --------------------------------


def test_rule4_module_load_returning_self_is_torchs_error():
    class Selfish(nn.Parameter):
        def module_load(self, other, assign=False):
            return self

    ours, theirs = linear(), linear()
    for module in (ours, theirs):
        module.weight = Selfish(module.weight.detach().clone())
    given = shifted(ours)
    mine = error_of(lambda: load(ours, given, swap=True))
    torch.__future__.set_swap_module_params_on_conversion(True)
    assert mine == error_of(lambda: theirs.load_state_dict(given))
    assert "module_load returned one of self or other, please .detach() the result" in mine


@pytest.mark.parametrize("assign", [False, True])
def test_rule4_module_load_gets_the_assign_flag_as_a_bool(assign):
    seen = []

    class Recording(nn.Parameter):
        def module_load(self, other, assign=False):
            seen.append(assign)
            return super().module_load(other, assign=assign)

    module = linear()
    module.weight = Recording(module.weight.detach().clone())
    load(module, shifted(module), swap=True, assign=assign)
    assert seen == [assign] and type(seen[0]) is bool


def test_rule5_module_load_returning_a_frozen_parameter_gets_the_slots_requires_grad():
    class Frozen(nn.Parameter):
        def module_load(self, other, assign=False):
            return nn.Parameter(other.detach().clone(), requires_grad=False)

    module = linear()
    module.weight = Frozen(module.weight.detach().clone())
    load(module, shifted(module), swap=True)
    assert module.weight.requires_grad


def test_rule5_grad_follows_a_device_change():
    module = linear()
    fill_grads(module)
    load(module, {k: v.to("meta") for k, v in module.state_dict().items()}, swap=True, assign=True)
    assert module.weight.is_meta and module.weight.grad.is_meta


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


@paths
def test_rule6_tied_0_dim_slots_given_different_one_element_values_are_an_error(swap, assign):
    module = nn.Module()
    step = torch.tensor(1.0)
    module.register_buffer("a", step)
    module.register_buffer("b", step)
    before = snapshot(module)
    text = error_of(lambda: load(module, {"a": torch.tensor([2.0]), "b": torch.tensor([3.0])},
                                 swap=swap, assign=assign))
    assert 'While loading the tied names "a" and "b": they were given different values.' in text
    assert_unchanged(before, module)


def test_rule4_assign_of_an_alias_with_another_layout_puts_the_value_in():
    module = nn.Module()
    module.register_buffer("square", torch.arange(4.0).reshape(2, 2))
    old = module.square
    transposed = old.detach().t()
    load(module, {"square": transposed}, assign=True)
    assert module.square is transposed and module.square is not old


def test_rule8_rollback_puts_back_a_none_buffer_slot_as_a_buffer():
    module = linear()
    module.register_buffer("spare", None)

    def fill(state_dict, prefix, *args):
        module.spare = torch.ones(1)

    module._register_load_state_dict_pre_hook(fill)
    given = shifted(module)
    del given["bias"]
    error_of(lambda: load(module, given))
    assert "spare" in module._buffers and module._buffers["spare"] is None
    assert "spare" not in module._parameters


def test_rule8_rollback_puts_back_the_storage_a_hook_replaced():
    module = linear()
    weight, address = module.weight, module.weight.data_ptr()

    def replace(state_dict, prefix, *args):
        weight.data = weight.data.clone()

    module._register_load_state_dict_pre_hook(replace)
    given = shifted(module)
    del given["bias"]
    error_of(lambda: load(module, given, assign=True))
    assert module.weight is weight and weight.data_ptr() == address


@pytest.mark.parametrize("swap", [False, True])
def test_rule8_a_failed_load_that_wrote_nothing_leaves_versions_alone(swap):
    module = linear()
    versions = {k: v._version for k, v in module.state_dict(keep_vars=True).items()}
    given = shifted(module)
    given["bias"] = torch.zeros(7)
    error_of(lambda: load(module, given, swap=swap, assign=True))
    assert {k: v._version for k, v in module.state_dict(keep_vars=True).items()} == versions


def test_same_value_tells_infinity_from_the_largest_finite_and_matches_complex_nan():
    big = torch.finfo(torch.float32).max
    assert not same_value(torch.tensor([float("inf")]), torch.tensor([big]))
    z = torch.tensor([complex(float("nan"), 1.0), 2j])
    assert same_value(z, z.clone()) and not same_value(z, z + 1)
    assert same_value(torch.tensor([True]), torch.tensor([True]))
    assert not same_value(torch.tensor([True]), torch.tensor([False]))


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


def test_rule4_assign_of_a_real_value_into_an_uninitialized_slot_puts_it_in():
    module = nn.Module()
    module.w = nn.parameter.UninitializedParameter()
    value = torch.ones(2)
    load(module, {"w": value}, assign=True)
    assert type(module.w) is nn.Parameter and torch.equal(module.w, value)


def test_rule5_a_buffers_grad_goes_with_its_old_contents_as_in_torch():
    ours, theirs = nn.Module(), nn.Module()
    for module in (ours, theirs):
        buffer = torch.ones(2, requires_grad=True)
        (buffer * 2).sum().backward()
        module.register_buffer("b", buffer)
    load(ours, {"b": torch.zeros(2)}, swap=True)
    torch.__future__.set_swap_module_params_on_conversion(True)
    theirs.load_state_dict({"b": torch.zeros(2)})
    assert ours.b.grad is None and theirs.b.grad is None


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


@pytest.mark.parametrize("count", ["own", "other"])
def test_key_model_counts_a_batch_norms_filled_in_count_as_loaded(count):
    """Rule 6 with a class's own ``_load_from_state_dict``: a batch norm shared under two names,
    one ``num_batches_tracked`` key given and the other absent (no version metadata), loads its
    own count under the absent key; a given count of another value conflicts with it. The key
    model agrees with the reference on both."""
    from swapspec.properties.models.load_examples import key_model

    norm = nn.BatchNorm1d(2)
    module = nn.Sequential(norm, norm)
    given = dict(module.state_dict())
    del given["0.num_batches_tracked"]
    if count == "other":
        given["1.num_batches_tracked"] = torch.tensor(7)
    model = key_model(module, given)
    try:
        reference.load_state_dict(module, given, strict=False)
        message = None
    except RuntimeError as error:
        message = str(error)
    conflict = ['0.num_batches_tracked', '1.num_batches_tracked']
    assert model.conflicts == ([conflict] if count == "other" else [])
    assert (message is not None) == model.fails(strict=False) == (count == "other")
    assert message is None or all(f'"{k}"' in message for k in conflict)


@pytest.mark.parametrize("bad", ["0.weight", "1.bias", "missing"])
def test_rule8_a_load_failing_on_its_input_swaps_nothing_so_backward_still_runs(bad):
    """After ``backward(create_graph=True)`` through two layers each grad holds a graph over
    the other layer's autograd nodes, and a swap marks those unusable. A swap-path load that
    fails on its input (a wrong shape at the first key or the last, a missing key) writes
    nothing, so the next backward runs."""
    module = nn.Sequential(linear(), linear())
    module(torch.ones(1, 3)).sum().backward(create_graph=True)
    before = snapshot(module)
    impls = {name: p._cdata for name, p in module.named_parameters()}
    state_dict = {k: v.clone() for k, v in module.state_dict().items()}
    if bad == "missing":
        del state_dict["1.weight"]
    else:
        state_dict[bad] = torch.zeros(5)
    message = "Missing key" if bad == "missing" else f"size mismatch for {bad}"
    with pytest.raises(RuntimeError, match=message):
        load(module, state_dict, swap=True)
    assert {name: p._cdata for name, p in module.named_parameters()} == impls
    assert_unchanged(before, module)
    module(torch.ones(1, 3)).sum().backward()
