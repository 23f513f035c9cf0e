"""Unit tests of the properties' own oracle helpers on the shapes random runs caught them on:
given tensors that alias slots nobody gave, and forwards that update tensors in place."""

from __future__ import annotations

import weakref

import pytest
import torch

from swapspec import reference
from swapspec.properties.models.apply_state import (
    converted_like,
    refused_by_swap,
    swap_tensors_takes,
)
from swapspec.properties.models.call_state import (
    copy_outcome,
    loaded_copy,
    module_state,
    replaced_originals,
    runs_in_its_world,
)
from swapspec.properties.models.examples import named_tensors, same_values
from swapspec.properties.models.oracle import expand
from swapspec.properties.models.outcomes import attempt
from swapspec.properties.rules.clauses import got_rebound_object
from swapspec.strategies import CallInput, build_tree
from swapspec.strategies.trees import (
    ContainerSpec,
    LeafSpec,
    ShareSpec,
    TensorSpec,
    TieSpec,
    TreeSpec,
)

X = torch.linspace(-1, 1, 8).reshape(2, 4)


def tied_batch_norm() -> torch.nn.Module:
    """A BatchNorm1d whose ``running_mean`` and ``running_var`` are one tensor (training mode:
    forward updates both in place)."""
    return build_tree(TreeSpec(root=LeafSpec(kind="BatchNorm1d"),
                               ties=(TieSpec(slots=(("", "running_var"), ("", "running_mean"))),)))


def buffer_updated_by_a_sibling(*, tied: bool) -> torch.nn.Module:
    """Leaf ``0`` adds 1 to its buffer ``steps`` in forward; leaf ``1`` reads its buffer ``b1``,
    which (``tied``) is that very ``steps`` tensor."""
    ties = (TieSpec(slots=(("0", "steps"), ("1", "b1"))),) if tied else ()
    return build_tree(TreeSpec(root=ContainerSpec(children=(
        LeafSpec(behaviours=("inplace",)),
        LeafSpec(tensors=(TensorSpec(name="b1", shape=(1,), buffer=True),)),
    )), ties=ties))


def call(tensors: dict, *, tie_weights: bool = False) -> CallInput:
    return CallInput(tensors, (X.clone(),), {}, tie_weights=tie_weights)


def filled_of(module, c: CallInput) -> dict:
    return expand(module, c.tensors, c.tie_weights)


# ---- replaced_originals (FC-RESTORE, FC-GRADIENTS, TOGETHER-CONVERTED-CALL) -----------------


def test_an_original_an_unfilled_alias_still_shows_is_not_replaced():
    module = tied_batch_norm()
    shared = module.running_var
    c = call({"running_var": torch.ones(4)})
    assert id(shared) not in replaced_originals(module, filled_of(module, c))


def rebinding_leaf_shared_beside_an_updating_one() -> torch.nn.Module:
    """Leaf ``0`` rebinds its ``count`` (tied to its ``b0``) in forward and is shared as ``2``;
    leaf ``1`` adds 1 to its own ``steps`` in place."""
    return build_tree(TreeSpec(root=ContainerSpec(children=(
        LeafSpec(tensors=(TensorSpec(name="b0", shape=(), dtype="int64", buffer=True),),
                 behaviours=("rebind",)),
        LeafSpec(behaviours=("inplace",)),
    )), ties=(TieSpec(slots=(("0", "count"), ("0", "b0"))),),
        shares=(ShareSpec(source="0", parent="", name="2"),)))


def test_fc_restore_judges_values_by_the_call_before_forward_writes_back():
    from swapspec.properties.rules.test_functional_call import _expected as expected_before
    from swapspec.properties.rules.test_functional_call import _replaced

    module = rebinding_leaf_shared_beside_an_updating_one()
    count, steps = module[0].count, module[1].steps
    given = torch.tensor(1)
    c = call({"0.b0": given, "2.count": given}, tie_weights=True)
    replaced = _replaced(module, expected_before(module, c))
    reference.functional_call(module, c.tensors, c.args, c.kwargs, tie_weights=True)
    assert c.tensors["2.count"] is not given, "forward's rebinding was not written back"
    assert replaced is not None and id(count) in replaced
    assert id(steps) not in replaced, "an unfilled buffer forward updates in place was judged"
    # the mapping after the call names two values for one tie: judged then, it looked invalid
    assert _replaced(module, expected_before(module, c)) is None


def test_the_tied_batch_norm_call_changes_only_what_forward_can_reach():
    module = tied_batch_norm()
    shared = module.running_var
    before = module_state(module)
    c = call({"running_var": torch.ones(4)})
    replaced = replaced_originals(module, filled_of(module, c))
    reference.functional_call(module, c.tensors, c.args, tie_weights=False)
    assert not same_values(shared, before.values[id(shared)])  # the un-given alias was updated
    for key in replaced:
        tensor = next(t for t in before.slots.values() if id(t) == key)
        assert same_values(tensor, before.values[key])


def test_an_original_out_of_every_slot_is_replaced():
    module = build_tree(TreeSpec(root=LeafSpec(kind="BatchNorm1d")))
    original = module.running_var
    c = call({"running_var": torch.ones(4)})
    assert replaced_originals(module, filled_of(module, c)) == {id(original)}


def test_with_tie_weights_the_alias_is_filled_too_so_the_original_is_replaced():
    module = tied_batch_norm()
    shared = module.running_var
    c = call({"running_var": torch.ones(4)}, tie_weights=True)
    assert replaced_originals(module, filled_of(module, c)) == {id(shared)}


def two_buffers(*, sharing_memory: bool) -> torch.nn.Module:
    """Buffers ``a`` and ``b``: two objects, and (``sharing_memory``) one storage, the half-tie
    torch's conversion leaves of a tied buffer."""
    module = torch.nn.Module()
    module.register_buffer("a", torch.zeros(4))
    module.register_buffer("b", module.a.view(4) if sharing_memory else module.a.clone())
    return module


@pytest.mark.parametrize("sharing_memory", [False, True])
def test_an_original_sharing_memory_with_a_reachable_tensor_is_not_replaced(sharing_memory):
    module = two_buffers(sharing_memory=sharing_memory)
    c = call({"a": torch.ones(4)})
    replaced = replaced_originals(module, filled_of(module, c))
    assert (id(module.a) in replaced) == (not sharing_memory)


def test_an_original_given_back_under_its_own_name_is_not_replaced():
    module = buffer_updated_by_a_sibling(tied=True)
    c = call({"1.b1": module[1].b1})
    assert replaced_originals(module, filled_of(module, c)) == set()


# ---- loaded_copy (FC-ORACLE, FC-WRITE-BACK, the `raised` clause) -------------------------


def test_a_module_tensor_given_back_keeps_its_alias_in_the_copy():
    module = buffer_updated_by_a_sibling(tied=True)
    c = call({"1.b1": module[1].b1})
    copy, _ = loaded_copy(module, filled_of(module, c), c)
    assert copy[1].b1 is copy[0].steps
    assert copy[1].b1 is not module[1].b1


def test_the_copy_of_a_given_back_alias_matches_the_real_call():
    module = buffer_updated_by_a_sibling(tied=True)
    c = call({"1.b1": module[1].b1})
    want = copy_outcome(module, filled_of(module, c), c)
    got = reference.functional_call(module, c.tensors, c.args, tie_weights=False)
    assert want.error is None
    assert same_values(got, want.result)


def test_a_module_tensor_given_under_another_name_is_aliased_in_the_copy():
    module = buffer_updated_by_a_sibling(tied=False)
    c = call({"1.b1": module[0].steps})
    copy, _ = loaded_copy(module, filled_of(module, c), c)
    assert copy[1].b1 is copy[0].steps
    want = copy_outcome(module, filled_of(module, c), c)
    got = reference.functional_call(module, c.tensors, c.args, tie_weights=False)
    assert same_values(got, want.result)


def test_a_fresh_tensor_given_under_two_names_is_one_clone_in_the_copy():
    module = buffer_updated_by_a_sibling(tied=False)
    fresh = torch.full((1,), 0.5)
    c = call({"1.b1": fresh, "0.steps": fresh})
    copy, _ = loaded_copy(module, filled_of(module, c), c)
    assert copy[1].b1 is copy[0].steps
    assert copy[1].b1 is not fresh and same_values(copy[1].b1, fresh)


def test_the_copy_leaves_the_module_and_the_given_tensors_alone():
    module = buffer_updated_by_a_sibling(tied=True)
    fresh = torch.full((1,), 0.5)
    values = {n: t.clone() for n, t in named_tensors(module).items()}
    c = call({"0.steps": fresh})
    copy_outcome(module, filled_of(module, c), c)
    assert all(same_values(t, values[n]) for n, t in named_tensors(module).items())
    assert same_values(fresh, torch.full((1,), 0.5))


@pytest.mark.parametrize("given", ["none", "zeros"])
def test_an_rnn_of_the_copy_runs_on_what_was_loaded_into_its_slots(given):
    """The copy's RNN reads its flat weights from its slots after loading: ``None`` makes its
    forward raise, a zero recurrent weight is the weight it runs on (a fresh build's RNN
    would otherwise run on the weights it was built with)."""
    module = build_tree(TreeSpec(root=ContainerSpec(children=(
        LeafSpec(kind="catalogue", entry="nn.RNN"),))))
    value = None if given == "none" else torch.zeros_like(module[0].inner.weight_hh_l0)
    c = call({"0.inner.weight_hh_l0": value})
    copy, _ = loaded_copy(module, filled_of(module, c), c)
    rnn = copy[0].inner
    assert rnn._flat_weights[rnn._flat_weights_names.index("weight_hh_l0")] is rnn.weight_hh_l0
    want = copy_outcome(module, filled_of(module, c), c)
    assert (type(want.error) is TypeError) == (given == "none")


def test_the_copy_judges_own_tensors_by_the_module_before_the_call():
    """A target that left a given tensor in a slot (no restore) must not make it the module's
    own: with ``own`` the names the module held before, the copy gets a clone of it."""
    module = buffer_updated_by_a_sibling(tied=False)
    before = named_tensors(module)
    fresh = torch.full((1,), 0.5)
    module[1]._buffers["b1"] = fresh  # what an unrestored call leaves
    c = call({"1.b1": fresh})
    copy, _ = loaded_copy(module, filled_of(module, c), c, own=before)
    assert copy[1].b1 is not copy[0].steps and same_values(copy[1].b1, fresh)
    unjudged, _ = loaded_copy(module, filled_of(module, c), c)
    assert not same_values(unjudged[1].b1, fresh)  # judged by the module now: its own slot


def meta_transformer_encoder() -> torch.nn.Module:
    """A ``meta``-world tree whose forward calls ``.item()`` (``nn.TransformerEncoder`` in
    training mode), which no ``meta`` tensor allows."""
    return build_tree(TreeSpec(root=ContainerSpec(children=(
        LeafSpec(kind="catalogue", entry="nn.TransformerEncoder", variant=22),)),
        training=True, world="meta"))


def test_a_forward_the_tree_cannot_run_is_not_the_conversions_fault():
    from swapspec.properties.rules.test_apply_training import (
        _backward,
        fails_without_the_conversion,
    )

    module = meta_transformer_encoder()
    reference.apply(module, lambda t: t.float() if t.is_floating_point() else t)
    ran = _backward(module, X)
    assert ran.error is not None, "the meta-world encoder's forward was expected to raise"
    assert fails_without_the_conversion(module, X, ran), (
        f"a fresh build fails alike ({type(ran.error).__name__}), so the conversion is not to blame")


def test_a_forward_only_the_converted_module_fails_is_the_conversions_fault():
    from swapspec.properties.models.outcomes import Outcome
    from swapspec.properties.rules.test_apply_training import (
        _backward,
        fails_without_the_conversion,
    )

    module = build_tree(TreeSpec(root=LeafSpec(kind="Linear")))
    assert _backward(module, X).error is None
    assert not fails_without_the_conversion(module, X, Outcome())
    broken = Outcome(error=RuntimeError("the converted module lost its weight"))
    assert not fails_without_the_conversion(module, X, broken), (
        "a fresh build runs, so an error only the converted module raises is the conversion's")


def _node_orphaned_by_a_dtype_change(p: torch.nn.Parameter) -> list[object]:
    out = p * 2  # the graph holds p's AccumulateGrad node, which holds p's TensorImpl
    p.data = p.data.half()  # a new dtype: p gets a new node later, the old one still holds p
    return [out]


def _viewed_without_grad(p: torch.nn.Parameter) -> list[object]:
    with torch.no_grad():
        return [p[:1]]


# Ways a tensor's TensorImpl can be held, each returning what holds it.
SWAP_HOLDERS = {
    "nothing": lambda p: [],
    "a weakref": lambda p: [weakref.ref(p)],
    "its AccumulateGrad node": lambda p: [p * 2],
    "a view": lambda p: [p[:1]],
    "a saved tensor": lambda p: [p * p],
    "a view under no_grad": _viewed_without_grad,
    "a view of a frozen parameter": lambda p: [p.requires_grad_(False)[:1]],
    "an old AccumulateGrad node after a dtype change": _node_orphaned_by_a_dtype_change,
}


@pytest.mark.parametrize("holder", list(SWAP_HOLDERS))
def test_swap_tensors_takes_agrees_with_swap_tensors(holder):
    """``swap_tensors_takes`` (the APPLY properties' reading of which swaps torch allows)
    says, without swapping, what ``torch.utils.swap_tensors`` then does, for each holder of a
    parameter's TensorImpl."""
    p = torch.nn.Parameter(torch.linspace(-1, 1, 3))
    held = SWAP_HOLDERS[holder](p)
    predicted = swap_tensors_takes(p)
    try:
        torch.utils.swap_tensors(p, torch.nn.Parameter(p.detach().clone()))
        swapped = True
    except RuntimeError:
        swapped = False
    del held
    assert predicted == swapped


def test_refused_by_swap_reads_the_module_after_its_conversions():
    """A ``MultiheadAttention`` trained with ``backward(create_graph=True)`` whose parameters a
    ``.data``-path ``half()`` gave a new dtype: the grads' graphs hold the parameters' old
    AccumulateGrad nodes, so ``swap_tensors`` refuses them now, though a fresh build takes
    them (the case a soak run met on APPLY-FORWARD)."""
    spec = TreeSpec(root=LeafSpec(kind="catalogue", entry="nn.MultiheadAttention"),
                    trained="backward-create-graph")
    module = build_tree(spec)
    assert refused_by_swap(module) == set()
    reference.apply(module, lambda t: t.half(), overwrite=False, swap=False)
    assert "inner.out_proj.weight" in refused_by_swap(module)
    with pytest.raises(RuntimeError, match="Couldn't swap"):
        reference.apply(module, lambda t: t.float(), overwrite=False, swap=True)


def test_refused_by_swap_counts_a_parameter_whose_grad_is_held():
    """A parameter ``swap_tensors`` takes whose grad something else holds (here a view): the
    conversion swaps the grad too and is refused there, so the parameter counts as refused."""
    module = build_tree(TreeSpec(root=LeafSpec(kind="Linear"), trained="backward-create-graph"))
    assert refused_by_swap(module) == set()
    with torch.no_grad():
        held = module.weight.grad[:1]
    assert refused_by_swap(module) == {"weight"}
    with pytest.raises(RuntimeError, match=r"Couldn't swap .*\.weight\.grad"):
        reference.apply(module, lambda t: t.double(), overwrite=False, swap=True)
    del held


@pytest.mark.parametrize("form", ["dict", "tuple-disjoint"])
def test_fc_gradients_examples_carry_the_call_the_target_receives(form):
    """Rule: FC-GRADIENTS judges (declarations, repro) the call with its added grad leaves, in
    the form the target receives it, not the drawn call."""
    from swapspec.properties.rules.test_functional_call import _received, _with_grad_leaves

    module = torch.nn.Linear(2, 2)
    value = torch.zeros(2)
    tensors = {"bias": value} if form == "dict" else ({"bias": value}, {})
    drawn = CallInput(tensors=tensors, args=(torch.ones(1, 2),), kwargs={}, form=form)
    params = {n for n, _ in module.named_parameters()}
    call = _received(drawn, _with_grad_leaves(module, drawn, params))
    given = call.merged()
    assert given["bias"].requires_grad and given["bias"] is not value
    assert (call.form, type(call.tensors)) == (("dict", dict) if form == "dict"
                                                else ("tuple-single", tuple))


def test_a_tree_that_cannot_run_in_its_world_is_told_from_one_that_can():
    """``runs_in_its_world``: a fresh build of a meta TransformerEncoder cannot run its forward
    (it reads a value with ``.item()``), a fresh build of a Linear can; FC-PARAMETRIZED draws
    only trees that can, so no error of the call is excused for looking like the tree's own."""
    module, x = meta_transformer_encoder(), torch.zeros(2, 4, device="meta")
    assert isinstance(attempt(lambda: module(x)).error, RuntimeError), \
        "the tree must be one that cannot run on meta"
    assert not runs_in_its_world(module, (x,))
    runs = build_tree(TreeSpec(root=LeafSpec(kind="Linear")))
    assert runs_in_its_world(runs, (X,))
    assert not runs_in_its_world(runs, (X, X)), "a forward that raises on its arguments"


class _Counter(torch.nn.Module):
    """A leaf whose forward rebinds its ``count`` buffer to ``count + 1``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.tensor(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count = self.count + 1
        return x


def test_a_rebind_written_back_as_a_tensor_held_before_is_lost_even_with_equal_values():
    leaf = _Counter()
    module = torch.nn.Sequential(leaf, leaf)  # one slot under two names, run twice
    own = leaf.count
    given = torch.tensor(-2)  # -2, rebound twice: 0, the value of the module's own tensor
    tensors = {"0.count": given, "1.count": given}
    held_before = {id(own), id(given)}
    torch.func.functional_call(module, tensors, (X,))
    rebound = torch.tensor(0)  # what the model's copy holds after its forward: a new object
    assert tensors["1.count"] is own and same_values(tensors["1.count"], rebound), \
        "torch writes the module's own tensor back under the second name, equal by chance"
    assert not got_rebound_object(tensors["1.count"], given, rebound, set(), held_before)
    assert got_rebound_object(tensors["0.count"], given, rebound, set(), held_before)
    assert got_rebound_object(own, given, own, {id(own)}, held_before), \
        "a forward that rebinds the slot to a tensor held before is followed"


def test_a_converted_wrapper_subclass_tensor_is_judged_by_its_values():
    """Rule: ``APPLY-VALUES`` and ``APPLY-GRADS`` compare a ``TwoTensor``'s values with fn's
    result through ``same_values``, as they do a plain tensor's; a conversion that does not
    preserve values is judged by metadata only."""
    from torch.testing._internal.two_tensor import TwoTensor

    t = torch.zeros(3)
    once, twice = TwoTensor(t + 1, t + 1), TwoTensor(t + 2, t + 2)
    assert converted_like(once, TwoTensor(t + 1, t.clone() + 1), values=True)
    assert not converted_like(twice, once, values=True)
    assert converted_like(twice, once, values=False)


# ---- FC-VISIBLE's accessors clause ---------------------------------------------------------------

class _Clauses:
    """A checker stand-in that records the clauses it is told do not hold."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def that(self, holds: bool, clause: str, message: str, code: str | None = None) -> bool:
        if not holds:
            self.failed.append(clause)
        return bool(holds)


def _accessor_clauses(functional_call) -> list[str]:
    """The accessors clauses broken when ``functional_call`` gives a Linear inside a Sequential a
    Parameter for its weight, a plain tensor for its bias, and a fresh tensor for a buffer."""
    from swapspec.properties.models.call_state import watch_forward
    from swapspec.properties.models.oracle import owner_of
    from swapspec.properties.rules.test_functional_call import _check_accessors

    module = torch.nn.Sequential(torch.nn.Linear(2, 2))
    module[0].register_buffer("steps", torch.zeros(2))
    given = {"0.weight": torch.nn.Parameter(torch.ones(2, 2)), "0.bias": torch.zeros(2),
             "0.steps": torch.ones(2)}
    values = dict(given)  # the call may write rebound slots back into ``given``
    view, handle = watch_forward(module, {n: owner_of(module, n) for n in given})
    try:
        functional_call(module, given, (torch.ones(1, 2),))
    finally:
        handle.remove()
    check = _Clauses()
    for name, value in values.items():
        _check_accessors(check, view, name, value)
    assert set(view.accessed) == set(values)
    return check.failed


def test_the_accessors_clause_holds_for_the_reference():
    assert _accessor_clauses(reference.functional_call) == []


def test_the_accessors_clause_catches_a_buffer_given_as_a_plain_attribute():
    """``delattr`` then ``setattr`` (functorch's ``make_functional``) leaves a given buffer a
    plain attribute: ``get_buffer`` refuses it."""
    from tests.zoo import make_functional

    assert _accessor_clauses(make_functional.functional_call) == ["accessors"]


# ---- APPLY-OPTIMIZER's optimizer-state clause ----------------------------------------------------

def _stepped_adam() -> tuple[torch.nn.Linear, torch.optim.Adam]:
    module = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(module.parameters(), lr=0.1)
    module(torch.ones(1, 2)).sum().backward()
    opt.step()
    return module, opt


def _state_clauses(change) -> list[str]:
    from swapspec.properties.rules.test_apply_training import (
        _check_optimizer_state,
        optimizer_state,
    )

    module, opt = _stepped_adam()
    before = optimizer_state(opt)
    change(module, opt)
    check = _Clauses()
    _check_optimizer_state(check, before, opt, {id(p): n for n, p in module.named_parameters()})
    return check.failed


def test_the_optimizer_state_clause_holds_across_a_conversion_of_the_module():
    assert _state_clauses(lambda module, opt: module.double()) == []


@pytest.mark.parametrize("change", [
    lambda module, opt: opt.state[module.weight]["exp_avg"].add_(1),  # a value changed
    lambda module, opt: opt.state[module.weight].update(exp_avg=torch.zeros(2, 2)),  # replaced
    lambda module, opt: opt.state.pop(module.bias),  # an entry dropped
], ids=["value", "object", "entry"])
def test_the_optimizer_state_clause_catches_a_changed_state(change):
    assert "optimizer-state" in _state_clauses(change)


@pytest.mark.parametrize("form", ["module pre-hook", "global pre-hook"])
def test_a_watched_call_records_the_roots_view_and_removes_its_hook(form):
    """Rule: either watch form records what the root's first forward sees (the given weight,
    not a submodule's later call) and leaves no hook behind once its handle is removed."""
    import torch.nn.modules.module as module_globals

    from swapspec.properties.models.call_state import watch_forward
    from swapspec.properties.models.oracle import owner_of

    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    weight = torch.nn.Parameter(torch.ones(2, 2))
    view, handle = watch_forward(module, {"1.weight": owner_of(module, "1.weight")}, form)
    try:
        reference.functional_call(module, {"1.weight": weight}, (torch.ones(1, 2),))
    finally:
        handle.remove()
    assert view.seen and view.named["1.weight"] is weight and view.attributes["1.weight"] is weight
    assert "0.weight" in view.named  # the root's view: every name, not the first child's
    assert not module._forward_pre_hooks and not module_globals._global_forward_pre_hooks


def test_module_state_reads_a_traced_module() -> None:
    """A ``ScriptModule``'s registries are not dicts (iterating one by index fails); the state a
    functional call must leave alone is read from their keys, as for any module."""
    import torch
    from torch import nn

    from swapspec.properties.models.call_state import module_state

    traced = torch.jit.trace(nn.Linear(2, 2), torch.ones(1, 2))
    state = module_state(traced)
    assert state.layout[""][2:] == (("weight", "bias"), ())
    assert set(state.slots) == {"weight", "bias"}
