"""Unit tests for ``reference.functional_call``: swap in, restore, ties, strict, write-back, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swapspec import reference
from tests.helpers_modules import (
    Boom,
    BoomBase,
    Echo,
    InplaceBuffer,
    Plain,
    Raises,
    RebindBuffer,
    Shared,
    Small,
    ThreeAliases,
    Tied,
    assert_unchanged,
    randn,
    snapshot,
)

X2 = torch.tensor([[1.0, -2.0]])
LIST = [1, 2]
jit_warning = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning"
)


def torch_error(make_module, tensors, args=(X2,), **kwargs) -> BaseException:
    """The exception ``torch.func.functional_call`` raises on a fresh module."""
    with pytest.raises(BaseException) as info:
        torch.func.functional_call(make_module(), tensors, args, **kwargs)
    return info.value


def assert_same_error_as_torch(make_module, tensors, args=(X2,), **kwargs) -> None:
    """Same type and message as torch; raised before the module or forward is touched."""
    expected = torch_error(make_module, tensors, args, **kwargs)
    module = make_module()
    calls = []
    before = None
    if not isinstance(module, torch.jit.ScriptModule):
        module.register_forward_pre_hook(lambda *a: calls.append(a))
        before = snapshot(module)
    with pytest.raises(BaseException) as info:
        reference.functional_call(module, tensors, args, **kwargs)
    assert type(info.value) is type(expected)
    assert str(info.value) == str(expected)
    assert calls == []
    if before is not None:
        assert_unchanged(before, module)


# ---------------------------------------------------------------------------
# Rule 6: swapping in


def test_forward_sees_given_objects_everywhere():
    """Rule 6: attribute access, parameters(), buffers(), named_*, state_dict, get_* see the given objects."""
    m = Plain()
    w = nn.Parameter(randn(2, 2, seed=30))
    b, buf = randn(2, seed=31), torch.tensor([5.0, 6.0])
    seen = {}

    def hook(module, args):
        seen["attr"] = (module.l1.weight, module.l1.bias, module.buffer)
        seen["params"] = list(module.parameters())
        seen["buffers"] = list(module.buffers())
        seen["named"] = dict([*module.named_parameters(), *module.named_buffers()])
        seen["state"] = module.state_dict(keep_vars=True)
        seen["get"] = (module.get_parameter("l1.weight"), module.get_buffer("buffer"))
        seen["table"] = module.l1._parameters["bias"]

    m.register_forward_pre_hook(hook)
    out = reference.functional_call(m, {"l1.weight": w, "l1.bias": b, "buffer": buf}, (X2,))
    assert seen["attr"][0] is w and seen["attr"][1] is b and seen["attr"][2] is buf
    assert [id(t) for t in seen["params"]] == [id(w), id(b)]
    assert [id(t) for t in seen["buffers"]] == [id(buf)]
    assert {k: id(v) for k, v in seen["named"].items()} == {
        "l1.weight": id(w),
        "l1.bias": id(b),
        "buffer": id(buf),
    }
    assert {k: id(v) for k, v in seen["state"].items()} == {
        "l1.weight": id(w),
        "l1.bias": id(b),
        "buffer": id(buf),
    }
    assert seen["get"][0] is w and seen["get"][1] is buf
    assert type(seen["table"]) is torch.Tensor  # not wrapped in a Parameter
    assert torch.equal(out, X2 @ w.detach().T + b + buf)


def test_partial_input_keeps_other_tensors():
    """Rule 6: tensors not named keep the module's own objects during the call."""
    m = Plain()
    own_bias, own_buf = m.l1.bias, m.buffer
    seen = {}
    m.register_forward_pre_hook(lambda mod, a: seen.update(bias=mod.l1.bias, buf=mod.buffer))
    reference.functional_call(m, {"l1.weight": torch.zeros(2, 2)}, (X2,))
    assert seen["bias"] is own_bias
    assert seen["buf"] is own_buf


def test_none_value_disables_tensor_for_the_call():
    """Rule 6: a None value disables that tensor for the call; the original comes back."""
    m = Plain()
    before = snapshot(m)
    seen = {}
    m.register_forward_pre_hook(
        lambda mod, a: seen.update(bias=mod.l1.bias, n=len(list(mod.parameters())))
    )
    out = reference.functional_call(m, {"l1.bias": None}, (X2,))
    assert seen == {"bias": None, "n": 1}
    assert torch.equal(out, X2 @ m.l1.weight.detach().T + m.buffer)
    assert_unchanged(before, m)


def test_unknown_leaf_name_is_set_for_the_call_and_removed():
    """Rule 6/7: an unknown leaf name becomes an attribute for the call, then disappears."""
    m = Plain()
    before = snapshot(m)
    extra = torch.tensor([9.0])
    p = nn.Parameter(torch.tensor([8.0]))
    seen = {}

    def hook(mod, a):
        seen["extra"] = mod.extra
        seen["l1_extra"] = mod.l1.p_extra
        seen["params"] = [id(t) for t in mod.parameters()]

    m.register_forward_pre_hook(hook)
    reference.functional_call(m, {"extra": extra, "l1.p_extra": p}, (X2,))
    assert seen["extra"] is extra
    assert seen["l1_extra"] is p
    assert id(p) in seen["params"]
    assert not hasattr(m, "extra")
    assert not hasattr(m.l1, "p_extra")
    m._forward_pre_hooks.clear()
    assert_unchanged(before, m)


def test_unknown_name_on_a_compiled_wrapper_is_removed_where_it_was_set():
    """Rule 7: ``OptimizedModule`` routes attributes to the module it wraps; the attribute set
    for the call is removed from there, and a plain attribute the wrapped module had comes back."""
    from torch._dynamo.eval_frame import DisableContext, OptimizedModule

    inner = Plain()
    own = torch.tensor([1.5])
    inner.scale = own
    wrapper = OptimizedModule(inner, DisableContext())
    seen = {}
    inner.register_forward_pre_hook(lambda mod, a: seen.update(extra=mod.extra, scale=mod.scale))
    extra, scale = torch.tensor([9.0]), torch.tensor([2.5])
    reference.functional_call(wrapper, {"extra": extra, "scale": scale}, (X2,))
    assert seen["extra"] is extra and seen["scale"] is scale
    assert "extra" not in inner.__dict__ and "extra" not in wrapper.__dict__
    assert inner.scale is own


def test_existing_plain_tensor_attribute_restored():
    """Rule 7: an unregistered tensor attribute is replaced for the call, then restored as the same object."""
    m = Plain()
    own = torch.tensor([1.5])
    m.scale = own
    keys = list(m.__dict__)
    seen = {}
    m.register_forward_pre_hook(lambda mod, a: seen.update(scale=mod.scale))
    given = torch.tensor([2.5])
    reference.functional_call(m, {"scale": given}, (X2,))
    assert seen["scale"] is given
    assert m.scale is own
    assert list(m.__dict__) == keys


# ---------------------------------------------------------------------------
# Rule 7: restoring


def test_slots_restored_after_return():
    """Rule 7: after a normal return every slot holds the object it held before."""
    m = Tied()
    before = snapshot(m)
    given = {"enc.weight": torch.zeros(3, 3), "dec.bias": torch.ones(3), "enc.scale": torch.ones(3)}
    reference.functional_call(m, given, (torch.ones(1, 3),))
    assert_unchanged(before, m)
    assert m.enc.weight is m.dec.weight


@pytest.mark.parametrize(
    "error",
    [Boom("forward failed"), ValueError("bad"), BoomBase("base"), KeyboardInterrupt()],
    ids=["Exception-subclass", "ValueError", "BaseException-subclass", "KeyboardInterrupt"],
)
def test_slots_restored_after_raise(error):
    """Rule 7: when forward raises (any BaseException) slots are restored and the error propagates as is."""
    m = Raises(error)
    before = snapshot(m)
    w, buf = torch.zeros(2, 2), torch.zeros(2)
    with pytest.raises(type(error)) as info:
        reference.functional_call(m, {"l1.weight": w, "buffer": buf, "temp": torch.ones(1)}, (X2,))
    assert info.value is error
    assert m.seen["weight"] is w and m.seen["buffer"] is buf
    assert not hasattr(m, "temp")
    assert_unchanged(before, m)


# ---------------------------------------------------------------------------
# Rule 3: shared submodules


@pytest.mark.parametrize("tie_weights", [True, False])
@pytest.mark.parametrize("name", ["a.weight", "b.weight"])
def test_shared_submodule_either_path_addresses_one_slot(name, tie_weights):
    """Rule 3/7: a name through either path of a shared submodule fills the slot; it is restored."""
    m = Shared()
    before = snapshot(m)
    given = torch.zeros(2, 2)
    seen = {}
    m.register_forward_pre_hook(lambda mod, a: seen.update(a=mod.a.weight, b=mod.b.weight))
    reference.functional_call(m, {name: given}, (X2,), tie_weights=tie_weights)
    assert seen["a"] is given and seen["b"] is given
    m._forward_pre_hooks.clear()
    assert_unchanged(before, m)
    assert m.a is m.b


@pytest.mark.parametrize("tie_weights", [True, False])
def test_shared_submodule_same_object_through_both_paths_is_fine(tie_weights):
    """Rule 3: both names of one slot carrying one object are accepted."""
    m = Shared()
    before = snapshot(m)
    given = torch.zeros(2, 2)
    out = reference.functional_call(
        m, {"a.weight": given, "b.weight": given}, (X2,), tie_weights=tie_weights
    )
    assert torch.equal(out, (X2 @ given.T + m.a.bias) @ given.T + m.a.bias + m.offset)
    assert_unchanged(before, m)


def test_shared_slot_conflict_is_found_after_a_bad_name():
    """Rule 3 comes before rule 5: a bad name earlier in the dict does not hide a slot conflict."""
    m = Shared()
    before = snapshot(m)
    tensors = {"nope.weight": torch.zeros(2, 2), "a.weight": torch.zeros(2, 2),
               "b.weight": torch.ones(2, 2)}
    with pytest.raises(ValueError, match=r"\['a\.weight', 'b\.weight'\]"):
        reference.functional_call(m, tensors, (X2,), tie_weights=False)
    assert_unchanged(before, m)


def test_unknown_name_before_a_tied_name_does_not_stop_tying():
    """Rule 2: every given tied name fills its aliases, whatever names come before it."""
    m = Tied()
    w = torch.full_like(m.enc.weight, 2.0)
    view = {}
    m.register_forward_pre_hook(lambda mod, args: view.update(dec=mod.dec.weight))
    reference.functional_call(m, {"extra": torch.zeros(1), "enc.weight": w}, (torch.ones(1, 3),))
    assert view["dec"] is w


@pytest.mark.parametrize("tie_weights", [True, False])
def test_shared_submodule_two_objects_for_one_slot_raise(tie_weights):
    """Rule 3: two names of one slot with different objects raise ValueError, before anything changes."""
    m = Shared()
    before = snapshot(m)
    tensors = {"a.weight": torch.zeros(2, 2), "b.weight": torch.ones(2, 2)}
    with pytest.raises(ValueError, match=r"\['a\.weight', 'b\.weight'\]") as info:
        reference.functional_call(m, tensors, (X2,), tie_weights=tie_weights)
    if tie_weights:
        assert str(info.value) == str(torch_error(Shared, tensors))
    assert_unchanged(before, m)


# ---------------------------------------------------------------------------
# Rule 2: ties


@pytest.mark.parametrize("name", ["w", "a.w", "b.w"])
def test_any_alias_fills_all_three(name):
    """Rule 2: with tie_weights=True, giving one of three aliases fills every alias."""
    m = ThreeAliases()
    given = torch.tensor([7.0, 8.0])
    out = reference.functional_call(m, {name: given}, (X2,))
    assert all(t is given for t in out)
    assert m.w is m.a.w is m.b.w
    assert m.w is not given


def test_same_object_for_several_aliases_is_fine():
    """Rule 2: several aliases given the same object do not raise."""
    m = ThreeAliases()
    given = torch.tensor([7.0, 8.0])
    out = reference.functional_call(m, {"w": given, "b.w": given}, (X2,))
    assert all(t is given for t in out)
    out = reference.functional_call(m, {"w": given, "a.w": given, "b.w": given}, (X2,))
    assert all(t is given for t in out)


def test_three_aliases_different_objects_match_torch_message():
    """Rule 2: all three aliases with different objects raise torch's ValueError byte for byte."""
    tensors = {"w": torch.zeros(2), "a.w": torch.ones(2), "b.w": torch.full((2,), 3.0)}
    assert_same_error_as_torch(ThreeAliases, tensors)


def test_two_of_three_aliases_different_objects_raise():
    """Rule 2: two aliases of three with different objects (even equal values) raise ValueError."""
    m = ThreeAliases()
    before = snapshot(m)
    with pytest.raises(ValueError) as info:
        reference.functional_call(m, {"a.w": torch.zeros(2), "b.w": torch.zeros(2)}, (X2,))
    assert str(info.value) == (
        "functional_call got multiple values for keys ['a.w', 'b.w', 'w'], "
        "which are tied. Consider using tie_weights=False"
    )
    assert_unchanged(before, m)


def test_tied_module_two_names_different_objects_match_torch():
    """Rule 2: tied weights of two modules given different objects: torch's ValueError."""
    tensors = {"enc.weight": torch.zeros(3, 3), "dec.weight": torch.ones(3, 3)}
    assert_same_error_as_torch(Tied, tensors, args=(torch.ones(1, 3),))


def test_tie_weights_false_aliases_independent():
    """Rule 2: with tie_weights=False each alias is its own slot."""
    m = ThreeAliases()
    own = m.w
    x, y = torch.zeros(2), torch.ones(2)
    out = reference.functional_call(m, {"a.w": x}, (X2,), tie_weights=False)
    assert out[0] is own and out[1] is x and out[2] is own
    out = reference.functional_call(m, {"w": x, "b.w": y}, (X2,), tie_weights=False)
    assert out[0] is x and out[1] is own and out[2] is y
    assert m.w is m.a.w is m.b.w is own


def test_tied_buffers_filled_together():
    """Rule 2: tied buffers are aliases too."""
    m = Tied()
    scale = torch.tensor([1.0, 1.0, 1.0])
    seen = {}
    m.register_forward_pre_hook(lambda mod, a: seen.update(enc=mod.enc.scale, dec=mod.dec.scale))
    reference.functional_call(m, {"dec.scale": scale}, (torch.ones(1, 3),))
    assert seen["enc"] is scale and seen["dec"] is scale


# ---------------------------------------------------------------------------
# Rule 4: strict


def _tied_full(tie_weights: bool) -> dict[str, torch.Tensor]:
    keys = ["enc.weight", "enc.bias", "dec.bias", "enc.scale"]
    if not tie_weights:
        keys += ["dec.weight", "dec.scale"]
    return {k: torch.ones(3, 3) if k.endswith("weight") else torch.ones(3) for k in keys}


@pytest.mark.parametrize(
    "tensors",
    [
        {"l1.weight": torch.zeros(2, 2)},
        {
            "l1.weight": torch.zeros(2, 2),
            "l1.bias": torch.zeros(2),
            "buffer": torch.zeros(2),
            "extra": torch.zeros(1),
        },
        {"zzz": torch.zeros(1), "aaa": torch.zeros(1), "l1.bias": torch.zeros(2)},
        {},
    ],
    ids=["missing", "unexpected", "both", "empty"],
)
def test_strict_message_matches_torch(tensors):
    """Rule 4: strict's RuntimeError equals torch's byte for byte, raised before anything changes."""
    assert_same_error_as_torch(Plain, tensors, strict=True)


@pytest.mark.parametrize(
    "tensors",
    [
        {"l2.weight": torch.zeros(2, 2), "l1.weight": torch.zeros(2, 2)},
        {"l1.weight": torch.zeros(2, 2), "foo": 3},
        {"l1.weight": torch.zeros(2, 2), "l1.": torch.zeros(2)},
    ],
    ids=["unknown-submodule", "non-tensor-value", "empty-name"],
)
def test_strict_key_error_comes_before_bad_input(tensors):
    """Rule 4: with strict=True the key check runs before the bad-input checks, as in torch."""
    assert_same_error_as_torch(Plain, tensors, strict=True)


def test_strict_with_all_keys_passes():
    """Rule 4: strict accepts exactly the parameter and buffer names."""
    m = Plain()
    tensors = {"l1.weight": torch.zeros(2, 2), "l1.bias": torch.ones(2), "buffer": torch.zeros(2)}
    out = reference.functional_call(m, tensors, (X2,), strict=True)
    assert torch.equal(out, torch.ones(1, 2))


def test_strict_counts_filled_aliases_with_tie_weights():
    """Rule 4: with tie_weights=True the filled aliases count as given (torch checks the untied map)."""
    m = Tied()
    out = reference.functional_call(m, _tied_full(True), (torch.ones(1, 3),), strict=True)
    expected = torch.func.functional_call(
        Tied(), _tied_full(True), (torch.ones(1, 3),), strict=True
    )
    assert torch.equal(out, expected)
    reference.functional_call(
        m, _tied_full(False), (torch.ones(1, 3),), strict=True, tie_weights=False
    )


def test_strict_without_tie_weights_requires_every_alias():
    """Rule 4: with tie_weights=False every alias name is a required key (torch's message)."""
    assert_same_error_as_torch(
        Tied, _tied_full(True), args=(torch.ones(1, 3),), strict=True, tie_weights=False
    )


# ---------------------------------------------------------------------------
# Rule 8: write-back


def test_rebound_buffer_written_back_into_callers_dict():
    """Rule 8: a buffer rebound in forward goes into the caller's dict; the module keeps its own."""
    m = RebindBuffer()
    own = m.count
    given = torch.tensor([10.0, 20.0])
    tensors = {"count": given}
    reference.functional_call(m, tensors, (X2,))
    assert tensors["count"] is not given
    assert torch.equal(tensors["count"], torch.tensor([11.0, 21.0]))
    assert torch.equal(given, torch.tensor([10.0, 20.0]))
    assert m.count is own
    assert torch.equal(own, torch.zeros(2))


def test_rebound_buffer_written_back_into_dict_it_came_from():
    """Rule 8: with a tuple of dicts the new object goes into the dict that supplied the key."""
    m = RebindBuffer()
    d_weight = {"weight": torch.full((2,), 2.0)}
    d_count = {"count": torch.tensor([1.0, 1.0])}
    reference.functional_call(m, (d_weight, d_count), (X2,))
    assert list(d_weight) == ["weight"]
    assert list(d_count) == ["count"]
    assert torch.equal(d_count["count"], torch.tensor([2.0, 2.0]))
    d_count2 = {"count": torch.tensor([5.0, 5.0])}
    reference.functional_call(m, [d_count2, {}], (X2,))
    assert torch.equal(d_count2["count"], torch.tensor([6.0, 6.0]))


def test_not_rebound_keys_untouched_in_callers_dict():
    """Rule 8: keys forward did not rebind keep the caller's objects."""
    m = RebindBuffer()
    w = torch.full((2,), 2.0)
    tensors = {"weight": w}
    reference.functional_call(m, tensors, (X2,))
    assert tensors == {"weight": w}
    assert tensors["weight"] is w


def test_inplace_update_lands_on_callers_tensor():
    """Rule 8: an in-place update in forward lands on the caller's tensor, not the module's."""
    m = InplaceBuffer()
    own = m.count
    given = torch.tensor([3.0, 4.0])
    tensors = {"count": given}
    reference.functional_call(m, tensors, (X2,))
    assert tensors["count"] is given
    assert torch.equal(given, torch.tensor([4.0, 5.0]))
    assert m.count is own
    assert torch.equal(own, torch.zeros(2))


# ---------------------------------------------------------------------------
# Rules 1 and 5: bad input


@pytest.mark.parametrize(
    "tensors",
    [
        {"l1.weight": 3},
        {"l1.weight": torch.zeros(2, 2), "l1.bias": [1.0, 2.0]},
        {"l1.weight": torch.zeros(2, 2), "l2.weight": torch.zeros(2, 2)},
        {"l1.weight": torch.zeros(2, 2), "l1.sub.weight": torch.zeros(2, 2)},
        {"l1.weight": torch.zeros(2, 2), "foo": torch.zeros(1)},
        {"l1.weight": torch.zeros(2, 2), "buffer.x": torch.zeros(1)},
        {"l1.weight.x": torch.zeros(1)},
        {"l1.weight": torch.zeros(2, 2), "l1.": torch.zeros(2)},
        {"l1.weight": torch.zeros(2, 2), "l1": torch.zeros(2)},
    ],
    ids=[
        "non-tensor",
        "non-tensor-list",
        "unknown-submodule",
        "unknown-nested-submodule",
        "non-tensor-attribute",
        "tensor-as-submodule",
        "nested-tensor-as-submodule",
        "empty-name",
        "module-as-tensor",
    ],
)
def test_bad_names_and_values_match_torch(tensors):
    """Rule 5: bad names/values raise torch's exact error before anything changes."""
    assert_same_error_as_torch(Plain, tensors)


@pytest.mark.parametrize(
    "tensors",
    [
        5,
        None,
        torch.zeros(2),
        ({"l1.weight": torch.zeros(2, 2)}, 3),
        [{"l1.weight": torch.zeros(2, 2)}, ["buffer"]],
        (
            {"l1.weight": torch.zeros(2, 2)},
            {"buffer": torch.zeros(2), "l1.weight": torch.ones(2, 2)},
        ),
        [{"buffer": torch.zeros(2)}, {"l1.bias": torch.zeros(2)}, {"buffer": torch.zeros(2)}],
    ],
    ids=[
        "int",
        "none",
        "tensor",
        "tuple-with-int",
        "list-with-list",
        "repeated-key",
        "repeated-key-non-adjacent",
    ],
)
def test_bad_input_forms_match_torch(tensors):
    """Rule 1: a non-mapping input, non-dict elements and repeated keys raise torch's ValueError."""
    assert_same_error_as_torch(Plain, tensors)


@jit_warning
def test_jitted_module_refused_like_torch():
    """Rule 1: a scripted module raises torch's RuntimeError."""
    assert_same_error_as_torch(lambda: torch.jit.script(Small()), {"l1.weight": torch.zeros(2, 2)})


def test_data_parallel_module_refused_like_torch():
    """Rule 1: ``nn.DataParallel`` is refused with torch's message (it wraps, even without GPUs)."""
    assert_same_error_as_torch(lambda: nn.DataParallel(Small()), {"l1.weight": torch.zeros(2, 2)})


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_call_while_tracing_refused_like_torch():
    """Rule 1: a call made while ``torch.jit.trace`` records is refused with torch's message."""
    errors = []
    for fc in (torch.func.functional_call, reference.functional_call):
        module = Small()

        def traced(x, fc=fc, module=module):
            return fc(module, {"l1.weight": torch.zeros(2, 2)}, (x,))
        with pytest.raises(RuntimeError) as info:
            torch.jit.trace(traced, (X2,))
        errors.append(str(info.value))
    assert errors[0] == errors[1] == "The stateless API can't be used with Jitted modules"


@jit_warning
def test_jitted_module_with_bad_input_form_matches_torch():
    """Rule 1: torch checks the input form before refusing a jitted module."""
    assert_same_error_as_torch(lambda: torch.jit.script(Small()), 5)


# ---------------------------------------------------------------------------
# Rule 1: args and kwargs


def test_args_none_means_no_arguments():
    """Rule 1: ``args=None`` calls forward with no positional arguments; ``kwargs=None`` with none."""
    assert reference.functional_call(Echo(), {}, None, None) == ((), {})
    assert reference.functional_call(Echo(), {}) == ((), {})


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (X2, (X2,)),
        (LIST, (LIST,)),
        (3, (3,)),
        ((X2, 3), (X2, 3)),
        ((), ()),
        (((1, 2),), ((1, 2),)),
    ],
    ids=["tensor", "list", "int", "tuple", "empty-tuple", "nested-tuple"],
)
def test_args_normalised(args, expected):
    """Rule 1: a non-tuple ``args`` is one argument; a tuple is unpacked."""
    got_args, got_kwargs = reference.functional_call(Echo(), {}, args)
    assert len(got_args) == len(expected)
    assert all(a is b for a, b in zip(got_args, expected, strict=True))
    assert got_kwargs == {}


def test_kwargs_passed_through():
    """Rule 1: ``kwargs`` are passed as keyword arguments."""
    got = reference.functional_call(Echo(), {}, (1,), {"scale": X2})
    assert got[0] == (1,)
    assert got[1].keys() == {"scale"} and got[1]["scale"] is X2


@pytest.mark.parametrize("given", [{"1.bias": None}, {"1.bias": torch.zeros(2)},
                                   {"1.weight": torch.zeros(2, 2), "1.bias": torch.zeros(2)}])
def test_a_value_for_a_lazy_modules_uninitialized_tensor_is_refused_before_anything_changes(given):
    module = nn.Sequential(nn.Linear(2, 2), nn.LazyLinear(2))
    weight, bias = module[1].weight, module[1].bias
    with pytest.raises(ValueError, match=r"'1\.(bias|weight)'"):
        reference.functional_call(module, given, (torch.ones(1, 2),))
    assert type(module[1]) is nn.LazyLinear and hasattr(module[1], "_initialize_hook")
    assert module[1].weight is weight and module[1].bias is bias
    assert isinstance(bias, nn.parameter.UninitializedParameter)
    module.state_dict()


def test_a_lazy_module_given_its_own_uninitialized_tensor_initializes_as_a_forward_does():
    module = nn.LazyLinear(2)
    out = reference.functional_call(module, {"bias": module.bias}, (torch.ones(1, 3),))
    assert out.shape == (1, 2) and type(module) is nn.Linear
    assert module.state_dict()["bias"].shape == (2,)


class _LazyScale(nn.modules.lazy.LazyModuleMixin, nn.Module):
    """A lazy module that keeps its class once initialized (``cls_to_become`` None)."""

    cls_to_become = None

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.parameter.UninitializedParameter()

    def initialize_parameters(self, x: torch.Tensor) -> None:
        with torch.no_grad():
            self.weight.materialize(x.shape[-1:])
            self.weight.fill_(2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def test_an_initialized_lazy_module_takes_a_value_for_an_uninitialized_tensor_it_gained_later():
    module = _LazyScale()
    module(torch.ones(1, 3))  # initialized: its hooks are gone, its class stays
    module.register_parameter("extra", nn.parameter.UninitializedParameter())
    out = reference.functional_call(module, {"extra": torch.ones(3)}, (torch.ones(1, 3),))
    assert torch.equal(out, torch.full((1, 3), 2.0))
    assert isinstance(module.extra, nn.parameter.UninitializedParameter)


@pytest.mark.parametrize("value", [None, torch.zeros(3)])
def test_a_value_for_a_lazy_modules_uninitialized_buffer_is_refused(value):
    module = nn.LazyBatchNorm1d()
    mean = module.running_mean
    with pytest.raises(ValueError, match="'running_mean'"):
        reference.functional_call(module, {"running_mean": value}, (torch.ones(2, 3),))
    assert module.running_mean is mean and type(module) is nn.LazyBatchNorm1d


def _rnn_with_stale_weight_refs() -> nn.RNN:
    """An RNN whose weight was rebound by ``setattr``: its ``_flat_weights`` follow, the weak
    references its forward compares (``_flat_weight_refs``) still point at the old weight."""
    rnn = nn.RNN(2, 2, bias=False)
    rnn.weight_hh_l0 = nn.Parameter(torch.ones(2, 2))
    return rnn


def _reads_its_parameters(rnn: nn.RNNBase) -> bool:
    """Each flat weight, and each weak reference to one, is the parameter of its name."""
    params = [getattr(rnn, n) for n in rnn._flat_weights_names]
    return (all(w is p for w, p in zip(rnn._flat_weights, params, strict=True))
            and all(r() is p for r, p in zip(rnn._flat_weight_refs, params, strict=True)))


def test_an_rnn_runs_on_a_none_weight_given_to_it():
    """``None`` for an RNN weight reaches its forward, which cannot run without it (torch's
    forward keeps the weight the call took out when no other weight changed)."""
    rnn, x = nn.RNN(2, 2, bias=False), torch.zeros(3, 2)
    entered = []
    rnn.register_forward_pre_hook(lambda m, a: entered.append(True))
    with pytest.raises(TypeError, match="NoneType"):
        reference.functional_call(rnn, {"weight_hh_l0": None}, (x,))
    assert entered, "the call raised before forward"
    assert _reads_its_parameters(rnn), "after the call the RNN does not read its own weights"


def test_an_rnn_runs_on_the_given_weight_and_reads_its_own_after():
    """Rule 6: forward runs on the given weight and the others; afterwards the RNN reads its
    own weights again, the references its forward compares included."""
    rnn, x = _rnn_with_stale_weight_refs(), torch.ones(3, 2)
    given = torch.zeros(2, 2)
    seen = []
    rnn.register_forward_pre_hook(lambda m, a: seen.append(list(m._flat_weights)))
    out = reference.functional_call(rnn, {"weight_ih_l0": given}, (x,))
    assert seen[0][0] is given and seen[0][1] is rnn.weight_hh_l0
    assert torch.equal(out[0], torch.zeros(3, 2)), "forward did not run on the given zero weight"
    assert _reads_its_parameters(rnn), "after the call the RNN does not read its own weights"


def test_every_rnn_a_call_fills_reads_its_own_weights_after():
    """Rule 6: each RNN the call reaches is re-read, not only one of them."""
    class TwoRNNs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = nn.RNN(2, 2), nn.RNN(2, 2)

        def forward(self, x):
            return self.second(self.first(x)[0])[0]

    module = TwoRNNs()
    given = {"first.weight_ih_l0": torch.zeros(2, 2), "second.weight_ih_l0": torch.zeros(2, 2)}
    reference.functional_call(module, given, (torch.ones(3, 2),))
    assert _reads_its_parameters(module.first) and _reads_its_parameters(module.second)


def test_an_rnn_without_one_of_its_weights_reads_none_for_it():
    """Rule 6: a flat weight the RNN no longer has (deleted) reads as ``None``, as torch's
    ``_init_flat_weights`` reads it, so forward raises torch's ``TypeError``."""
    rnn = nn.RNN(2, 2)
    del rnn.bias_hh_l0
    with pytest.raises(TypeError, match="NoneType"):
        reference.functional_call(rnn, {"weight_hh_l0": torch.zeros(2, 2)}, (torch.ones(3, 2),))
