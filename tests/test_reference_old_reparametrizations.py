"""Unit tests for rule 5 of ``reference.overrides``: old-style reparametrizations
(``torch.nn.utils.weight_norm``, ``spectral_norm``, ``prune``) have their computed attribute
computed again after a conversion, and put back as it was when the conversion fails."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import prune
from torch.nn.utils.spectral_norm import SpectralNorm

from swapspec import reference
from tests.helpers_decorations import X, double, seeded
from tests.helpers_modules import (
    assert_unchanged,
    flag_settings,
    linear,
    snapshot,
)


class Refused(Exception):
    pass


def raising_on(k: int, fn: Callable[[torch.Tensor], torch.Tensor]):
    """``fn`` that raises ``Refused`` on its k-th call (0-based); ``calls`` counts the others."""
    calls = []

    def wrapped(t):
        if len(calls) == k:
            raise Refused(f"tensor {k}")
        calls.append(t)
        return fn(t)

    return wrapped, calls


def test_seeded_leaves_the_global_rng_alone():
    """(setup) building under ``seeded`` neither reads nor advances the global RNG."""
    state = torch.get_rng_state()
    seeded(lambda: torch.nn.utils.spectral_norm(nn.Linear(3, 4)))
    assert torch.equal(torch.get_rng_state(), state)


def old_weight_norm() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated for the parametrization
        return torch.nn.utils.weight_norm(linear(3, 4, seed=43))


def old_spectral_norm() -> nn.Module:
    return seeded(lambda: torch.nn.utils.spectral_norm(linear(3, 4, seed=44)))


def pruned() -> nn.Module:
    return prune.l1_unstructured(linear(3, 4, seed=45), "weight", amount=0.5)


def pruned_twice() -> nn.Module:
    """Two prunings of one tensor: a ``PruningContainer`` hook."""
    m = prune.l1_unstructured(pruned(), "weight", amount=0.25)
    assert isinstance(next(iter(m._forward_pre_hooks.values())), prune.PruningContainer)
    return m


OLD_STYLE = {
    "weight_norm": old_weight_norm,
    "spectral_norm": old_spectral_norm,
    "prune": pruned,
    "prune-twice": pruned_twice,
}


N_OLD_STYLE_TENSORS = {"weight_norm": 3, "spectral_norm": 4, "prune": 3, "prune-twice": 3}


def computed_weight(m: nn.Module) -> torch.Tensor:
    """What the module's forward pre-hook computes (without a power iteration), from scratch."""
    if "weight_g" in m._parameters:
        return torch._weight_norm(m.weight_v, m.weight_g, 0)
    if "weight_u" in m._buffers:
        return m.weight_orig / torch.dot(m.weight_u, torch.mv(m.weight_orig, m.weight_v))
    return m.weight_mask * m.weight_orig


@pytest.mark.parametrize("kind", OLD_STYLE)
def test_old_style_modules_hold_their_tensor_count(kind):
    """(setup) the distinct parameters and buffers, which the failure test below ranges over."""
    m = OLD_STYLE[kind]()
    assert len({id(t) for t in [*m.parameters(), *m.buffers()]}) == N_OLD_STYLE_TENSORS[kind]


@flag_settings
@pytest.mark.parametrize("kind", OLD_STYLE)
def test_old_style_attribute_is_computed_again_after_conversion(kind, overwrite, swap):
    """Rule 5: the computed attribute has the converted dtype, is what the hook computes from
    the converted tensors, and no power iteration ran; forward works."""
    m = OLD_STYLE[kind]()
    buffers = {name: b.clone() for name, b in m.named_buffers()}
    reference.apply(m, double, overwrite=overwrite, swap=swap)
    assert "weight" in m.__dict__
    assert m.weight.dtype == torch.float64
    assert m.weight.requires_grad
    assert torch.equal(m.weight, computed_weight(m))
    for name, b in buffers.items():  # the power-iteration vectors were not advanced
        assert torch.equal(m.get_buffer(name), b.double())
    out = m(X.double())
    assert torch.equal(out, F.linear(X.double(), m.weight, m.bias))
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())


@pytest.mark.parametrize("kind", OLD_STYLE)
def test_old_style_attribute_after_conversion_matches_the_hooks_own_computation(kind):
    """Rule 5: the attribute equals what the module's forward pre-hook itself computes."""
    m = OLD_STYLE[kind]()
    reference.apply(m, double)
    hook = next(iter(m._forward_pre_hooks.values()))
    if isinstance(hook, SpectralNorm):
        expected = hook.compute_weight(m, do_power_iteration=False)
    elif isinstance(hook, prune.BasePruningMethod):
        expected = hook.apply_mask(m)
    else:
        expected = hook.compute_weight(m)
    assert torch.equal(m.weight, expected)


@pytest.mark.parametrize("overwrite", [False, True])
def test_torch_refuses_old_weight_norm_on_the_swap_path(overwrite):
    """(torch) ``_apply`` with the swap flag raises on the old weight_norm; the reference converts it."""
    saved = (torch.__future__.get_overwrite_module_params_on_conversion(),
             torch.__future__.get_swap_module_params_on_conversion())
    m = old_weight_norm()
    try:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
        torch.__future__.set_swap_module_params_on_conversion(True)
        with pytest.raises(RuntimeError, match=r"^_apply\(\): Couldn't swap Linear\.weight_g$"):
            m.double()
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(saved[0])
        torch.__future__.set_swap_module_params_on_conversion(saved[1])
    twin = old_weight_norm()
    reference.apply(twin, double, overwrite=overwrite, swap=True)
    assert torch.equal(twin.weight, computed_weight(twin))


@flag_settings
def test_old_style_attribute_left_absent_when_it_cannot_be_computed(overwrite, swap):
    """Rule 5: a conversion to sparse tensors succeeds; the weight-norm attribute stays absent."""
    m = old_weight_norm()
    reference.apply(m, lambda t: t.to_sparse(), overwrite=overwrite, swap=swap)
    assert "weight" not in m.__dict__
    assert m.weight_g.layout == m.weight_v.layout == torch.sparse_coo


@flag_settings
def test_old_style_attribute_computed_again_after_it_was_left_absent(overwrite, swap):
    """Rule 5: an absent attribute is no obstacle: the next conversion computes it again."""
    m = old_weight_norm()
    reference.apply(m, lambda t: t.to_sparse(), overwrite=overwrite, swap=swap)
    reference.apply(m, lambda t: t.to_dense(), overwrite=overwrite, swap=swap)
    assert "weight" in m.__dict__
    assert torch.equal(m.weight, computed_weight(m))


@flag_settings
@pytest.mark.parametrize("forwarded", [False, True], ids=["fresh", "forwarded"])
@pytest.mark.parametrize(("kind", "k"), [(kind, k) for kind, n in N_OLD_STYLE_TENSORS.items()
                                         for k in range(n)])
def test_fn_raising_leaves_old_style_module_and_attribute_untouched(kind, k, forwarded, overwrite,
                                                                    swap):
    """Rules 4 and 5: ``fn`` raising on the k-th tensor leaves every slot as it was, and the
    computed attribute present with its value (fresh or computed by a forward)."""
    m = OLD_STYLE[kind]()
    if forwarded:
        m(X)
    value = m.weight.detach().clone()
    before = snapshot(m)
    fn, calls = raising_on(k, double)
    with pytest.raises(Refused):
        reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert len(calls) == k
    assert_unchanged(before, m)
    assert "weight" in m.__dict__
    assert m.weight.dtype == torch.float32
    assert torch.equal(m.weight, value)


@flag_settings
def test_fn_raising_puts_back_a_graphless_attribute_itself(overwrite, swap):
    """Rule 5: before its first forward, a spectral norm's attribute is the raw weight (no graph,
    not what the hook computes); a failed conversion puts back that very object."""
    m = old_spectral_norm()
    weight = m.weight
    assert weight.grad_fn is None  # (setup)
    assert not torch.equal(weight, computed_weight(m))  # (setup)
    fn, _ = raising_on(N_OLD_STYLE_TENSORS["spectral_norm"] - 1, double)
    with pytest.raises(Refused):
        reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert m.weight is weight


@flag_settings
def test_fn_raising_computes_a_graph_carrying_attribute_again(overwrite, swap):
    """Rule 5: an attribute that carries a graph (weight norm's) is not kept through a failed
    conversion (its graph would block the swap): it is computed again from the restored tensors."""
    m = old_weight_norm()
    weight = m.weight
    assert weight.grad_fn is not None  # (setup)
    fn, _ = raising_on(N_OLD_STYLE_TENSORS["weight_norm"] - 1, double)
    with pytest.raises(Refused):
        reference.apply(m, fn, overwrite=overwrite, swap=swap)
    assert m.weight is not weight
    assert torch.equal(m.weight, weight)
    assert m.weight.grad_fn is not None
