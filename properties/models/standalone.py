"""Plain-torch source for repros: a drawn tree's constructor code and the definitions it needs.

Rules:

* ``build_source(module)`` gives the lines of a ``build_module()`` function that builds a fresh copy
  of a tree made by ``swapspec.strategies.build_tree`` in the order the builder follows: the
  nominal tree (each tensor written out as a literal, grads included), its ties and shares,
  its decorations (torch's own calls, after ``torch.manual_seed`` of the tree's seed, as the
  builder does), ``train(False)`` for an eval-mode tree, one training step, the wrapper.
* A catalogue leaf is rebuilt from torch's own ``module_db`` with the build seed.
* ``definitions(names)`` gives the source of the named classes and functions of swapspec's
  strategies and everything they use, with docstrings left out, so the script imports nothing
  from swapspec. ``IMPORTS`` are the imports that source needs.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from functools import cache

import torch
from torch import Tensor, nn
from torch.nn.parameter import UninitializedTensorMixin

from swapspec.properties.models.examples import is_fake, is_wrapper
from swapspec.strategies import trees
from swapspec.strategies.host_leaves import HostModule, registered
from swapspec.strategies.trees import ContainerSpec, LeafSpec, TreeSpec

IMPORTS = [
    "from __future__ import annotations",
    "",
    "import contextlib",
    "import copy",
    "import functools",
    "import importlib",
    "import random",
    "import warnings",
    "from collections import Counter",
    "from typing import Any, Callable, NamedTuple",
    "",
    "import torch",
    "import torch.nn.functional as F",
    "import torch.nn.utils.prune",
    "from torch import Tensor, nn",
    "from torch.nn.utils import parametrize",
]

SOURCES = ("modules", "decorations", "torch_modules", "conversions", "devices", "host_leaves",
           "tree_storage")

CATALOGUE_LEAF = '''
def catalogue_leaf(entry, variant, seed):
    """torch's module_db entry `entry`, variant `variant`, built with `seed` as swapspec does."""
    from torch.testing._internal.common_modules import module_db
    info = next(i for i in module_db if i.name == entry)
    with seeded(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = list(info.module_inputs_func(info, device="cpu", dtype=torch.float32,
                                            requires_grad=False, training=True))
    ctor, fwd = made[variant].constructor_input, made[variant].forward_input
    ctor_args, ctor_kwargs, args, kwargs = copy.deepcopy((ctor.args, ctor.kwargs, fwd.args, fwd.kwargs))
    with seeded(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inner = info.module_cls(*ctor_args, **ctor_kwargs)
    return CatalogueLeaf(entry, variant, seed, inner, args, kwargs)
'''.strip("\n").splitlines()

_REAL = {
    "Linear": "SwLinear(4, 4, bias={bias})",
    "Conv1d": "SwConv1d(1, 1, 3, padding=1, bias={bias})",
    "Conv2d": "SwConv2d(2, 2, (1, 3), padding='same', bias={bias})",
    "BatchNorm1d": "SwBatchNorm1d(4, affine={bias})",
    "LayerNorm": "SwLayerNorm(4, bias={bias})",
    "Embedding": "SwEmbedding(5, 4)",
    "SparseEmbedding": "SwEmbedding(5, 4, sparse=True)",
}
_CONTAINERS = {"Sequential": "SwSequential", "ModuleList": "SwModuleList",
               "ModuleDict": "SwModuleDict", "Block": "Block"}
_DECORATIONS = {
    "weight_norm": "torch.nn.utils.parametrizations.weight_norm({owner}, {name!r}, dim=0)",
    "spectral_norm": "torch.nn.utils.parametrizations.spectral_norm({owner}, {name!r}, dim=0)",
    "orthogonal": "torch.nn.utils.parametrizations.orthogonal({owner}, {name!r})",
    "custom": "parametrize.register_parametrization({owner}, {name!r}, Double())",
    "custom-inverse": "parametrize.register_parametrization({owner}, {name!r}, Negate())",
    "old-weight-norm": "torch.nn.utils.weight_norm({owner}, {name!r}, dim=0)",
    "old-spectral-norm": "torch.nn.utils.spectral_norm({owner}, {name!r}, dim=0)",
    "prune": "torch.nn.utils.prune.l1_unstructured({owner}, {name!r}, amount=0.5)",
}


# ---------------------------------------------------------------- definitions


@cache
def _top_level() -> dict[str, tuple[int, str, frozenset[str]]]:
    """``{name: (order, source without docstrings, names it uses)}`` over ``SOURCES``; the first
    module that defines a name wins."""
    found: dict[str, tuple[int, str, frozenset[str]]] = {}
    for i, module_name in enumerate(SOURCES):
        module = importlib.import_module(f"swapspec.strategies.{module_name}")
        found = {**_parsed(inspect.getsource(module), _BLOCK * i, docstrings=False), **found}
    return found


_BLOCK = 100_000  # order numbers of one source's definitions: source index * _BLOCK + position


@cache
def _parsed(source: str, first: int = 0, *, docstrings: bool = True) -> dict[str, tuple[int, str, frozenset[str]]]:
    """The top-level definitions of ``source`` as ``_top_level`` gives them, numbered from ``first``."""
    found: dict[str, tuple[int, str, frozenset[str]]] = {}
    for node in ast.parse(source).body:
        name = _defined_name(node)
        if name is None or name in found:
            continue
        if not docstrings:
            _drop_docstrings(node)
        found[name] = (first + len(found), ast.unparse(node), _free_names(node) - {name})
    return found


def _free_names(node: ast.AST) -> frozenset[str]:
    """Names a definition reads that it does not bind itself (assignments, arguments)."""
    loaded = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    return frozenset(loaded - bound)


def _defined_name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return node.target.id
    return None


def _drop_docstrings(node: ast.AST) -> None:
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if (isinstance(n, ast.FunctionDef | ast.ClassDef) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            n.body = body[1:] or [ast.Pass()]


def definitions(names: set[str], helpers: str = "") -> list[str]:
    """Source lines of the named definitions and of every definition they use, in source order:
    from swapspec's strategies (docstrings left out), then from ``helpers`` (source text)."""
    table = {**_top_level(), **_parsed(helpers, _BLOCK * len(SOURCES))}
    wanted: set[str] = set()
    todo = [n for n in names if n in table]
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += [u for u in table[name][2] if u in table]
    lines: list[str] = []
    for name in sorted(wanted, key=lambda n: table[n][0]):
        lines += [*table[name][1].splitlines(), ""]
    return lines


def names_used(code: list[str]) -> set[str]:
    """The bare names the lines use (each line parsed on its own when the whole does not parse)."""
    try:
        tree = ast.parse("\n".join(code))
    except SyntaxError:
        return {n for line in code for n in names_used([line.strip()])} if len(code) > 1 else set()
    return set(_free_names(tree))


# ---------------------------------------------------------------- the tree


def build_source(module: nn.Module) -> list[str]:
    """Lines of ``def build_module():`` returning a fresh copy of ``module``'s drawn tree, as it
    was before anything touched it (see the module docstring)."""
    spec = trees.tree_info(module).spec
    # the nominal tree alone: its slots hold their own tensors (ties and shares come after)
    plain = trees.build_tree(dataclasses.replace(spec, decorations=(), trained="", wrapper="", world="",
                                                 storage="", ties=(), shares=()))
    body = ["m = {}  # the tree's modules by path ('' is the root)"]
    if any(isinstance(n, LeafSpec) and "own-apply" in n.behaviours for _, _, n in trees.walk(spec.root)):
        body.append("known_to_reference(OwnApplyLeaf)  # the reference runs its _apply work only so")
    for path, _, node in trees.walk(spec.root):
        body += _node_lines(node, path, plain.get_submodule(path) if path else plain)
        if path:
            parent, _, name = path.rpartition(".")
            body.append(f"m[{parent!r}].add_module({name!r}, m[{path!r}])")
    body += _tie_lines(spec) + _share_lines(spec)
    body.append("root = m['']")
    body += world_lines(spec.world)
    if spec.storage:
        body.append(f"share_storage(root, {spec.storage!r})  # slots laid out in shared storage")
    body += _decoration_lines(spec)
    if not spec.training:
        body.append("root.train(False)")
    body += _training_lines(spec)
    body += _wrapper_lines(spec.wrapper)
    body.append("return root")
    return ["def build_module():", *(f"    {line}" for line in body)]


def _node_lines(node: LeafSpec | ContainerSpec, path: str, built: nn.Module) -> list[str]:
    here = f"m[{path!r}]"
    if isinstance(node, ContainerSpec):
        return [f"{here} = {_CONTAINERS[node.kind]}()"]
    if node.kind == "catalogue":
        return _catalogue_lines(node, path, built)
    if node.kind == "host":
        return [*_host_build(registered(node.entry)).splitlines(),
                f"{here} = HostLeaf({node.entry!r}, inner, {_inputs_code(registered(node.entry))})"]
    if node.kind == "LazyLinear":
        lines = [f"{here} = SwLazyLinear(4)", f"{here}.sw_seed = {built.sw_seed}"]
        return lines + ([f"{here}(torch.zeros(2, 4))  # materializes it"] if node.initialized else [])
    leaf_class = "OwnApplyLeaf" if "own-apply" in node.behaviours else "GenericLeaf"
    ctor = (f"{leaf_class}({node.behaviours!r})" if node.kind == "generic"
            else _REAL[node.kind].format(bias=node.bias))
    return [f"{here} = {ctor}", *_slot_lines(here, built)]


def _slot_lines(here: str, built: nn.Module) -> list[str]:
    """Register every own slot of ``built`` again, in its order, with a literal of its tensor."""
    lines = []
    for key, value in built._parameters.items():
        if value is None:
            lines.append(f"{here}.register_parameter({key!r}, None)")
            continue
        lines.append(f"p = {parameter_code(value)}")
        if value.grad is not None:
            lines += grad_lines("p", value)
        lines.append(f"{here}.register_parameter({key!r}, p)")
    for key, value in built._buffers.items():
        persistent = "" if key not in built._non_persistent_buffers_set else ", persistent=False"
        code = "None" if value is None else tensor_code(value)
        lines.append(f"{here}.register_buffer({key!r}, {code}{persistent})")
    return lines


class NoHostSource(ValueError):
    """A host module that a standalone script cannot build (see ``HostModule.source``)."""


def _host_source(host: HostModule) -> list[str]:
    source = host.source("inner")
    if source is None:
        raise NoHostSource(f"host module {host.name!r}: its build is no importable class or "
                           "function (or a functools.partial of one with literal arguments), so "
                           "a standalone script cannot build it")
    return source.splitlines()


def _host_build(host: HostModule) -> str:
    """The line that builds the host's module into ``inner`` (its import heads the script)."""
    return _host_source(host)[-1]


def _inputs_code(host: HostModule) -> str:
    """The host leaf's ``inputs``: ``_as_args`` (the default), or the host's importable function."""
    inputs = host.inputs
    if inputs is HostModule.__dataclass_fields__["inputs"].default:
        return "_as_args"
    module, name = getattr(inputs, "__module__", None), getattr(inputs, "__qualname__", "")
    if module is None or not name.isidentifier():
        raise NoHostSource(f"host module {host.name!r}: its inputs is no importable function, so "
                           "a standalone script cannot call it")
    return f"importlib.import_module({module!r}).{name}"


def host_imports(module: nn.Module) -> list[str]:
    """The import lines of the host modules in ``module``'s drawn tree (they head a repro)."""
    spec = trees.tree_info(module).spec
    hosts = [registered(node.entry) for _, _, node in trees.walk(spec.root)
             if isinstance(node, LeafSpec) and node.kind == "host"]
    return list(dict.fromkeys(line for host in hosts for line in _host_source(host)[:-1]))


def _catalogue_lines(node: LeafSpec, path: str, built: nn.Module) -> list[str]:
    prefix = f"{path}." if path else ""
    here = f"m[{path!r}]"
    lines = [f"{here} = catalogue_leaf({node.entry!r}, {node.variant}, {built.sw_seed})",
             f"m.update({{{prefix!r} + sub: s for sub, s in {here}.named_modules() if sub}})"]
    params = [p for p in built.parameters() if not isinstance(p, UninitializedTensorMixin)]
    if not (node.frozen or node.grad) or not params:
        return lines
    lines.append(f"params = [p for p in {here}.parameters() "
                 "if not isinstance(p, nn.parameter.UninitializedTensorMixin)]")
    if node.frozen:
        lines += ["for p in params:", "    p.requires_grad_(False)"]
    for i, p in enumerate(params):
        if p.grad is not None:
            lines += grad_lines(f"params[{i}]", p)
    return lines


def grad_lines(expr: str, param: Tensor) -> list[str]:
    """Lines that give the parameter ``expr`` the grad ``param`` has; one of another dtype,
    device or shape (``param.data = ...`` makes that state, which the ``.grad`` setter refuses
    to make again) is set while the parameter shows the grad's metadata."""
    grad = param.grad
    if (grad.dtype, grad.device, grad.shape) == (param.dtype, param.device, param.shape):
        return [f"{expr}.grad = {tensor_code(grad)}"]
    return [f"g = {tensor_code(grad)}  # a grad of another dtype than its parameter's",
            f"d = {expr}.data", f"{expr}.data = torch.empty_like(g)", f"{expr}.grad = g",
            f"{expr}.data = d"]


def _tie_lines(spec: TreeSpec) -> list[str]:
    lines = []
    for tie in spec.ties:
        (src_path, src_name), *others = tie.slots
        source = f"m[{src_path!r}].{_registry(spec, src_path, src_name)}[{src_name!r}]"
        for path, name in others:
            lines.append(f"m[{path!r}].{_registry(spec, path, name)}[{name!r}] = {source}"
                         "  # a tie")
    return lines


def _registry(spec: TreeSpec, path: str, name: str) -> str:
    slot = next(s for s in trees.tree_slots(spec.root) if (s.path, s.name) == (path, name))
    return "_buffers" if slot.buffer else "_parameters"


def _share_lines(spec: TreeSpec) -> list[str]:
    return [f"m[{s.parent!r}].add_module({s.name!r}, m[{s.source!r}])  # a shared submodule"
            for s in spec.shares]


_WORLD_CONVERTERS = {
    "meta": ["convert = lambda t, is_param: torch.empty_like(t, device='meta')"],
    "fake": ["from torch._subclasses.fake_tensor import FakeTensorMode",
             "fake_mode = FakeTensorMode(allow_non_fake_inputs=True)",
             "convert = lambda t, is_param: fake_mode.from_tensor(t)"],
    "two-tensor": ["from torch.testing._internal.two_tensor import TwoTensor",
                   "convert = lambda t, is_param: (TwoTensor(t, t.clone())"
                   " if is_param and t.is_floating_point() else None)"],
    "dtensor": ["import torch.distributed as dist",
                "from torch.distributed.device_mesh import DeviceMesh",
                "from torch.distributed.tensor import Replicate, distribute_tensor",
                "if not dist.is_initialized():  # one rank, gloo, an in-process store",
                "    dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)",
                "mesh = DeviceMesh('cpu', [0])",
                "convert = lambda t, is_param: (distribute_tensor(t, mesh, [Replicate()])"
                " if is_param and t.is_floating_point() else None)"],
}


def world_lines(world: str) -> list[str]:
    """Plain-torch lines that do what ``strategies.tree_worlds.move_to_world`` does."""
    if not world:
        return []
    return [f"# built in the {world!r} world: every slot rebound, one object per tie, RNNs re-flattened",
            *_WORLD_CONVERTERS[world],
            "moved = {}",
            "for mod in root.modules():",
            "    for table in (mod._parameters, mod._buffers):",
            "        for key, t in table.items():",
            *(_META_LAZY_LINES if world == "meta" else _SKIP_LAZY_LINES),
            "            if id(t) not in moved:",
            "                data = convert(t.detach(), isinstance(t, nn.Parameter))",
            "                if data is not None and isinstance(t, nn.Parameter) and not isinstance(data, nn.Parameter):",
            "                    data = nn.Parameter(data, requires_grad=t.requires_grad)",
            "                moved[id(t)] = (t, t if data is None else data)",
            "            table[key] = moved[id(t)][1]",
            "    if isinstance(mod, nn.RNNBase):",
            "        mod._init_flat_weights()"]


# a lazy module's uninitialized tensors: left as they are, or (meta world) made again on meta
_SKIP_LAZY_LINES = [
    "            if t is None or isinstance(t, nn.parameter.UninitializedTensorMixin):",
    "                continue"]
_META_LAZY_LINES = [
    "            if t is None:",
    "                continue",
    "            if isinstance(t, nn.parameter.UninitializedParameter) and id(t) not in moved:",
    "                moved[id(t)] = (t, nn.parameter.UninitializedParameter(t.requires_grad, device='meta', dtype=t.dtype))",
    "            elif isinstance(t, nn.parameter.UninitializedBuffer) and id(t) not in moved:",
    "                persistent = {'persistent': t.persistent} if hasattr(t, 'persistent') else {}",
    "                moved[id(t)] = (t, nn.parameter.UninitializedBuffer(t.requires_grad, device='meta', dtype=t.dtype, **persistent))"]


# what each module-hook decoration registers (``strategies.decorations``), after ``module.``
_MODULE_HOOK_LINES = {
    "module-hooks": ("register_forward_pre_hook(ModuleHook('forward-pre-hook:{path}'))",
                     "register_forward_hook(ModuleHook('forward-hook:{path}'))"),
    "backward-hooks": ("register_full_backward_pre_hook(ModuleHook('backward-pre-hook:{path}'))",
                       "register_full_backward_hook(ModuleHook('backward-hook:{path}'))"),
    "old-backward-hook": ("register_backward_hook(ModuleHook('old-backward-hook:{path}'))",),
    "forward-kwargs-hooks": (
        "register_forward_pre_hook(ModuleHook('forward-pre-hook-kwargs:{path}'), with_kwargs=True)",
        "register_forward_hook(ModuleHook('forward-hook-kwargs:{path}'), with_kwargs=True, "
        "always_call=True)"),
}


def _decoration_lines(spec: TreeSpec) -> list[str]:
    if not spec.decorations:
        return []
    lines = [f"torch.manual_seed({spec.seed})  # what decorations draw (power iteration vectors)",
             "with warnings.catch_warnings():",
             "    warnings.simplefilter('ignore', FutureWarning)"]
    for d in spec.decorations:
        owner = f"m[{d.path!r}]"
        if d.kind == "tensor-hooks":
            lines += [f"    {owner}.__dict__.setdefault('sw_hook_counts', Counter())",
                      f"    {owner}.{d.name}.register_hook(GradHook({owner}.sw_hook_counts, "
                      f"'tensor-hook:{d.key}'))",
                      f"    {owner}.{d.name}.register_post_accumulate_grad_hook(GradHook("
                      f"{owner}.sw_hook_counts, 'post-accumulate-hook:{d.key}'))"]
        elif d.kind in _MODULE_HOOK_LINES:
            lines += [f"    {owner}.__dict__.setdefault('sw_hook_counts', Counter())",
                      *(f"    {owner}.{line.format(path=d.path)}"
                        for line in _MODULE_HOOK_LINES[d.kind])]
        else:
            lines.append("    " + _DECORATIONS[d.kind].format(owner=owner, name=d.name))
    return lines


def _training_lines(spec: TreeSpec) -> list[str]:
    if not spec.trained:
        return []
    x = trees.training_input(spec)
    create_graph = spec.trained == "backward-create-graph"
    return [f"x = {tensor_code(x)}  # one training step",
            "with torch.enable_grad(), warnings.catch_warnings():",
            "    warnings.simplefilter('ignore', UserWarning)",
            "    loss = root(x).sum()",
            "    if loss.requires_grad:",
            f"        loss.backward(create_graph={create_graph})"]


def _wrapper_lines(wrapper: str) -> list[str]:
    if wrapper == "compiled":
        return ["from torch._dynamo.eval_frame import DisableContext, OptimizedModule",
                "root = OptimizedModule(root, DisableContext())  # torch.compile's wrapper, eager"]
    if wrapper == "data-parallel":
        return ["root = nn.DataParallel(root)"]
    return []


# ---------------------------------------------------------------- values


def tensor_code(t: Tensor) -> str:
    """Python source that rebuilds ``t``'s class (Parameter, TaggedParameter), values, dtype and
    ``requires_grad`` (meta tensors: shape and dtype)."""
    if isinstance(t, nn.Parameter):
        return parameter_code(t)
    data = t.detach()
    if type(data).__name__ == "TwoTensor":
        code = f"TwoTensor({tensor_code(data.a)}, {tensor_code(data.b)})"
    elif rebuilt_by_parts(data):
        code = wrapper_code(data)
    elif data.device.type == "meta" or type(data).__name__ == "FakeTensor":  # a fake one: its metadata
        code = f"torch.empty({list(data.shape)}, dtype={data.dtype}, device='meta')"
    elif data.layout != torch.strided:
        code = f"{tensor_code(data.to_dense())}.to_sparse()"
    else:
        code = f"torch.tensor({literal(data.cpu().tolist())}, dtype={data.dtype})"
    return f"{code}.requires_grad_()" if t.requires_grad else code


def rebuilt_by_parts(t: Tensor) -> bool:
    """A traceable wrapper subclass of an importable class whose flatten context is a literal:
    ``wrapper_code`` writes it (other subclasses, ``DTensor`` among them, are written by value)."""
    if not is_wrapper(t) or is_fake(t) or "<" in type(t).__qualname__:
        return False
    _, ctx = t.__tensor_flatten__()
    try:
        return ast.literal_eval(repr(ctx)) == ctx
    except (ValueError, SyntaxError):
        return False


def wrapper_code(t: Tensor) -> str:
    """Python source that rebuilds a traceable wrapper subclass tensor from its parts:
    ``<its class>.__tensor_unflatten__({inner name: inner tensor}, context, size, stride)``, the
    class imported by its module's name (the script imports nothing else of the host)."""
    names, ctx = t.__tensor_flatten__()
    cls = type(t)
    inner = ", ".join(f"{n!r}: {tensor_code(getattr(t, n))}" for n in names)
    return (f"importlib.import_module({cls.__module__!r}).{cls.__qualname__}.__tensor_unflatten__("
            f"{{{inner}}}, {ctx!r}, {list(t.shape)}, {tuple(t.stride())})")


def parameter_code(p: nn.Parameter) -> str:
    data = tensor_code(p.detach())
    if type(p).__name__ in ("TaggedParameter", "SelfLoadingParameter"):
        return f"{type(p).__name__}({data}, {p.requires_grad}, {p.tag!r})"
    return f"nn.Parameter({data}, requires_grad={p.requires_grad})"


def literal(value: object) -> str:
    """``repr(value)`` with ``nan`` and ``inf`` written as Python can read them back."""
    return re.sub(r"\b(nan|inf)\b", r"float('\1')", repr(value))
