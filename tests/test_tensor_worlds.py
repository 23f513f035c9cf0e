"""The tensor worlds of the builder (meta, fake, TwoTensor and DTensor parameters), and the
reference's rule for ``FakeTensor`` parameters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed.tensor import DTensor, Replicate
from torch.testing._internal.two_tensor import TwoTensor

from swapspec import reference
from swapspec.properties.harness.targets import torch_apply
from swapspec.strategies import call_inputs, dtensor_world, meta_built
from swapspec.strategies.trees import (
    ContainerSpec,
    LeafSpec,
    TensorSpec,
    TieSpec,
    TreeSpec,
    build_tree,
    move_to_world,
    tree_info,
)
from tests.helpers_modules import flag_settings

TIED = TreeSpec(
    root=ContainerSpec(children=(
        LeafSpec(tensors=(TensorSpec(name="p0"), TensorSpec(name="b0", buffer=True),
                          TensorSpec(name="b1", dtype="int64", buffer=True))),
        LeafSpec(tensors=(TensorSpec(name="p0"),)),
    )),
    ties=(TieSpec(slots=(("0", "p0"), ("1", "p0"))),),
)


def _world(world: str, spec: TreeSpec = TIED) -> nn.Module:
    return build_tree(TreeSpec(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__},
                                  "world": world}))


def test_meta_world_moves_every_tensor_and_keeps_ties():
    m = _world("meta")
    assert {t.device.type for t in [*m.parameters(), *m.buffers()]} == {"meta"}
    assert m[0].p0 is m[1].p0, "a tie must stay one object"
    assert isinstance(m[0].p0, nn.Parameter) and m[0].p0.requires_grad
    assert m[0].b1.dtype == torch.int64


def test_fake_world_makes_fake_tensors_of_one_mode():
    m = _world("fake")
    tensors = [*m.parameters(), *m.buffers()]
    assert all(isinstance(t, FakeTensor) for t in tensors)
    assert len({id(t.fake_mode) for t in tensors}) == 1
    assert m[0].p0 is m[1].p0


def test_two_tensor_world_wraps_floating_parameters_only():
    m = _world("two-tensor")
    assert type(m[0].p0) is TwoTensor and isinstance(m[0].p0, nn.Parameter)
    assert torch.equal(m[0].p0.a, m[0].p0.b)
    assert type(m[0].b0) is torch.Tensor, "buffers stay plain"
    assert m[0].p0 is m[1].p0


def test_world_build_is_deterministic():
    a, b = _world("two-tensor"), _world("two-tensor")
    assert torch.equal(a[0].p0.a, b[0].p0.a) and a[0].p0 is not b[0].p0


def test_plain_world_is_the_plain_build():
    assert torch.equal(_world("")[0].p0, build_tree(TIED)[0].p0)


def test_rnn_in_a_world_runs_on_its_new_weights():
    m = _world("meta", TreeSpec(root=LeafSpec(kind="catalogue", entry="nn.LSTM")))
    lstm = next(x for x in m.modules() if isinstance(x, nn.LSTM))
    assert all(w is p for w, p in zip(lstm._flat_weights, [getattr(lstm, n) for n in lstm._flat_weights_names], strict=True))


def _fake_linear() -> nn.Linear:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    m = nn.Linear(2, 3)
    for name, p in list(m._parameters.items()):
        m._parameters[name] = mode.from_tensor(p)
    return m


@settings(max_examples=10, deadline=None, database=None)
@given(data=st.data())
def test_a_meta_built_tree_gets_a_meta_forward_input(data):
    """call_inputs moves forward's input to meta where every registered tensor is a meta one."""
    world = data.draw(st.sampled_from(["", "meta", "two-tensor"]), label="world")
    module = _world(world)
    call = data.draw(call_inputs(module), label="call")
    assert meta_built(module) == (world == "meta")
    assert call.args[0].device.type == ("meta" if world == "meta" else "cpu")
    assert ("meta-input" in call.features) == (world == "meta")


@pytest.mark.parametrize("run", ["reference", "torch"])
def test_meta_built_module_runs_on_real_tensors_given_for_every_name(run):
    """functional_call converts nothing: a meta-built module given real values for every name
    runs on them, and keeps its meta tensors afterwards (reference.functional_call, rule 6)."""
    spec = TreeSpec(root=LeafSpec(kind="Linear"))
    real = build_tree(spec)
    meta = _world("meta", spec)
    given = {n: t.detach().clone() for n, t in [*real.named_parameters(), *real.named_buffers()]}
    call = reference.functional_call if run == "reference" else torch.func.functional_call
    x = torch.ones(2, 4)
    out = call(meta, given, (x,))
    assert out.device.type == "cpu" and torch.equal(out, real(x))
    assert {t.device.type for t in meta.parameters()} == {"meta"}, "the module's own tensors stay"


def test_fake_parameter_never_takes_set_data():
    fake = _fake_linear().weight
    assert reference.choose_path(fake, fake.double(), overwrite=False, swap=False) == "overwrite"
    plain = nn.Parameter(torch.ones(2))
    assert reference.choose_path(plain, plain.double(), overwrite=False, swap=False) == "set_data"


def test_fake_parameter_moved_by_overwrite_reports_its_new_device():
    m = _fake_linear()
    reference.apply(m, lambda t: t.to("meta"), overwrite=False, swap=False)
    assert isinstance(m.weight, FakeTensor) and isinstance(m.weight, nn.Parameter)
    assert m.weight.device.type == "meta", "the result's own fake device must win over the old one"


def test_parameter_attributes_survive_beside_a_subclass_result():
    p = nn.Parameter(torch.ones(2, 2))
    p.tag = "kept"
    m = nn.Module()
    m.w = p
    reference.apply(m, lambda t: TwoTensor(t + 1, t + 2), overwrite=False, swap=False)
    assert m.w.tag == "kept"
    assert torch.equal(m.w.a, torch.full((2, 2), 2.0)), "the subclass's own attributes win"


@pytest.fixture
def dtensor_group() -> Iterator[None]:
    """A test that builds the dtensor world closes its process group: none outlives the test."""
    assert not dist.is_initialized(), "a process group was left by an earlier test"
    yield
    dtensor_world.close()
    assert not dist.is_initialized() and not dtensor_world.started()


def test_dtensor_world_replicates_floating_parameters_only(dtensor_group):
    m = _world("dtensor")
    p = m[0].p0
    assert type(p) is DTensor and isinstance(p, nn.Parameter) and p.requires_grad
    assert p.placements == (Replicate(),) and p.device_mesh.mesh.tolist() == [0]
    assert torch.equal(p.to_local(), build_tree(TIED)[0].p0.detach())
    assert type(m[0].b0) is torch.Tensor and m[0].b1.dtype == torch.int64, "buffers stay plain"
    assert m[0].p0 is m[1].p0, "a tie must stay one object"


def test_dtensor_world_starts_one_group_per_process_and_closes_it(dtensor_group):
    first = dtensor_world.mesh()
    assert dtensor_world.mesh() is first and dist.get_world_size() == 1
    dtensor_world.close()
    assert not dist.is_initialized(), "close() must destroy the group it started"
    assert dtensor_world.mesh() is not first and dist.is_initialized(), "the next use restarts it"


def test_dtensor_world_refuses_a_group_of_several_ranks(dtensor_group, monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    with pytest.raises(RuntimeError, match="world size 2"):
        dtensor_world.mesh()
    assert not dtensor_world.started()


@pytest.mark.parametrize("convert", ["double", "half", "float"])
@flag_settings
def test_dtensor_parameters_convert_as_dtensors(convert, overwrite, swap, dtensor_group):
    """``double()``/``half()``/``float()`` keep a DTensor parameter a replicated DTensor of the new
    dtype, with its values, on every flag setting, in the reference and in torch's ``_apply``."""
    dtype = {"double": torch.float64, "half": torch.float16, "float": torch.float32}[convert]
    want = build_tree(TIED)[0].p0.detach().to(dtype)
    for run in ("reference", "torch"):
        m = _world("dtensor")
        fn = getattr(torch.Tensor, convert)
        if run == "reference":
            reference.apply(m, fn, overwrite=overwrite, swap=swap)
        else:
            torch_apply(m, fn, overwrite=overwrite, swap=swap)
        p = m[0].p0
        assert type(p) is DTensor and isinstance(p, nn.Parameter), run
        assert p.dtype == dtype and p.placements == (Replicate(),), run
        assert torch.equal(p.to_local(), want), run


@pytest.mark.parametrize("world", ["meta", "fake", "two-tensor", "dtensor"])
def test_standalone_repro_builds_the_same_world(world, dtensor_group):
    """The plain-torch builder of the repros replays the world: same classes, ties and values."""
    from tests.test_repro import _built_from_source, _same_tree

    module = _world(world)
    rebuilt = _built_from_source(module)
    _same_tree(rebuilt, build_tree(tree_info(module).spec))
    assert type(rebuilt[0].p0) is type(module[0].p0)


def test_meta_world_remakes_lazy_tensors_on_meta_so_forward_materializes_there():
    """A lazy module moved to the meta world holds uninitialized tensors on meta, as under
    ``torch.device('meta')``: one object per tie, ``requires_grad`` and ``persistent`` kept, and
    its first forward on a meta input materializes them on meta."""
    root = nn.Sequential(nn.LazyLinear(3), nn.LazyBatchNorm1d())
    root[1].register_buffer("alias", root[1].running_mean, persistent=False)
    move_to_world(root, "meta")
    linear, norm = root
    assert isinstance(linear.weight, nn.parameter.UninitializedParameter)
    assert linear.weight.device.type == "meta" and linear.weight.requires_grad
    assert isinstance(norm.running_mean, nn.parameter.UninitializedBuffer)
    assert norm.running_mean.device.type == "meta"
    assert getattr(norm.running_mean, "persistent", True), "torch 2.5+ keeps it on the buffer"
    assert norm.alias is norm.running_mean, "a tie must stay one object"
    out = root(torch.empty(2, 4, device="meta"))
    assert out.device.type == "meta"
    assert linear.weight.device.type == "meta" and tuple(linear.weight.shape) == (3, 4)


@pytest.mark.parametrize("world", ["fake", "two-tensor"])
def test_other_worlds_leave_lazy_tensors_as_they_are(world):
    root = nn.Sequential(nn.LazyLinear(3))
    weight = root[0].weight
    move_to_world(root, world)
    assert root[0].weight is weight


def test_standalone_repro_builds_a_lazy_leaf_on_meta():
    from tests.test_repro import _built_from_source

    module = build_tree(TreeSpec(root=ContainerSpec(children=(LeafSpec(kind="LazyLinear"),)),
                                 world="meta"))
    rebuilt = _built_from_source(module)
    weight = rebuilt[0].weight
    assert isinstance(weight, nn.parameter.UninitializedParameter) and weight.device.type == "meta"
    assert rebuilt(torch.empty(2, 4, device="meta")).device.type == "meta"
    assert rebuilt[0].weight.device.type == "meta"
