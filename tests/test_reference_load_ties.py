"""Unit tests for ties in ``reference.load_state_dict`` (rule 6): tied names and shared submodules
keep one object, one alias given fills every alias, own data yields to a changed alias, different
values are an error; and ``same_value``, the comparison that decides it."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.testing._internal.two_tensor import TwoTensor

from swapspec import reference
from swapspec.reference.load_state_dict import same_value
from tests.helpers_load import (
    error_of,
    load,
    paths,
    restore_swap_flags,  # noqa: F401  (autouse: the swap flags restored)
    shifted,
)
from tests.helpers_modules import (
    Holder,
    Shared,
    ThreeAliases,
    Tied,
    assert_unchanged,
    linear,
    snapshot,
)


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


def test_same_value_tells_infinity_from_the_largest_finite_and_matches_complex_nan():
    big = torch.finfo(torch.float32).max
    assert not same_value(torch.tensor([float("inf")]), torch.tensor([big]))
    z = torch.tensor([complex(float("nan"), 1.0), 2j])
    assert same_value(z, z.clone()) and not same_value(z, z + 1)
    assert same_value(torch.tensor([True]), torch.tensor([True]))
    assert not same_value(torch.tensor([True]), torch.tensor([False]))


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


@paths
@pytest.mark.parametrize("hooked", [False, True])
def test_rule6_own_data_after_a_changed_alias_yields_to_it(swap, assign, hooked):
    """Own data, a changed alias, own data again (``w``, ``a.w``, ``b.w``): the changed value
    loads, and the later own data yields to it as the first did (also when a post hook on
    ``a`` has made the write before ``b.w`` is reached)."""
    module = ThreeAliases()
    if hooked:
        module.a.register_load_state_dict_post_hook(lambda m, keys: None)
    given = module.state_dict()
    given["a.w"] = torch.tensor([5.0, 6.0])
    assert load(module, given, swap=swap, assign=assign) == ([], [])
    assert module.w is module.a.w is module.b.w
    assert torch.equal(module.w.detach(), torch.tensor([5.0, 6.0]))


@paths
def test_rule6_every_alias_that_differs_from_the_first_is_reported(swap, assign):
    """``w`` changed, then ``a.w`` and ``b.w`` equal to each other but not to ``w``: each of the
    later keys is an error against the first, and the module is left as it was."""
    module = ThreeAliases()
    given = {"w": torch.tensor([3.0, 4.0]), "a.w": torch.tensor([5.0, 6.0]),
             "b.w": torch.tensor([5.0, 6.0])}
    before = snapshot(module)
    text = error_of(lambda: load(module, given, swap=swap, assign=assign))
    assert 'While loading the tied names "w" and "a.w"' in text
    assert 'While loading the tied names "w" and "b.w"' in text
    assert_unchanged(before, module)


class _AliasOfAnother(nn.Module):
    """``first.p`` (its module has a post hook, so its write is made before ``b`` is reached)
    and one parameter tied as ``a.t`` and ``b.t``."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Holder()
        self.first.p = nn.Parameter(torch.tensor([1.0, 2.0]))
        self.first.register_load_state_dict_post_hook(lambda m, keys: None)
        self.a, self.b = Holder(), Holder()
        self.a.t = nn.Parameter(torch.zeros(2))
        self.b.t = self.a.t


def test_rule6_tied_values_are_compared_as_given_not_as_written_since():
    """``b.t`` is given an alias of ``first.p``'s data: compared with ``a.t``'s value as it was
    given (equal), not as the write of ``first.p`` made it meanwhile (copy path)."""
    module = _AliasOfAnother()
    given = {"first.p": torch.tensor([7.0, 8.0]), "a.t": torch.tensor([1.0, 2.0]),
             "b.t": module.first.p.detach()}
    assert load(module, given) == ([], [])
    assert torch.equal(module.a.t.detach(), torch.tensor([1.0, 2.0]))
    assert module.a.t is module.b.t and torch.equal(module.first.p.detach(), given["first.p"])


@pytest.mark.parametrize("holders", ["parameter-and-buffer", "buffer-only"])
def test_rule4_assign_wraps_a_parameter_object_only_where_a_parameter_slot_holds_it(holders):
    """Rule 4's assign: a Parameter object that a parameter slot holds (tied into a buffer slot
    too) is given back as a Parameter in every slot; one that only a buffer slot holds (its
    parameter slot re-pointed since) is a buffer: the slot gets the value itself, as a buffer."""
    m = nn.Module()
    m.p = nn.Parameter(torch.ones(2))
    m.register_buffer("b", m.p)
    if holders == "buffer-only":
        m.p = nn.Parameter(torch.zeros(2))
    value = torch.full((2,), 3.0)
    reference.load_state_dict(m, {"p": torch.full((2,), 3.0), "b": value}, assign=True)
    assert "b" in m._buffers and "b" not in m._parameters
    if holders == "buffer-only":
        assert m.b is value and type(m.b) is torch.Tensor
    else:
        assert m.b is m.p and type(m.p) is nn.Parameter and m.p.requires_grad
