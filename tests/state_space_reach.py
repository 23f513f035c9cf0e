"""Reach of the states and operations listed in ``docs/state-space.md``, on fixed-seed samples.

The tree samples are read twice: the strategy's own feature tags (``tree_info(m).features``) and
torch-level tags this script computes from the built module itself (:func:`state_features`: what
torch's code would see: ``None`` slots, ``Parameter`` subclasses, wrapper subclasses, meta
tensors, views, shared storage, hooks by kind, ``_apply`` overrides, ``_flat_weights`` ...), so a
state's reach does not depend on the strategy naming it.

Commands (repository root, the venv's python)::

    .venv/bin/python tests/state_space_reach.py [N]          # every sample/tag share, N draws each
    .venv/bin/python tests/state_space_reach.py --check [N]  # the doc's figures against their floors

``N`` defaults to :data:`DEFAULT_N`. The samples (each derandomized, generate phase only, no database;
the ``seq`` sample draws fewer, see :data:`SAMPLES`):

* ``tree``: ``module_trees()`` (defaults: what most properties draw).
* ``life``: ``module_trees(**LIFE_OPTIONS)``: decorations and training in every tree, wrappers in half.
* ``world``: ``module_trees(**WORLD_OPTIONS)``: the tensor worlds as the APPLY/FC/TOGETHER properties draw them.
* ``catalogue``: ``module_trees(catalogue_chance=CATALOGUE_REACH_CHANCE)``: trees rich in torch's own modules.
* ``conversion``, ``method``, ``call``, ``load``: ``strategies.reach``'s ``conversion_reach``,
  ``method_reach`` (public method calls as APPLY-METHOD-ARGS draws them), ``call_reach``,
  ``load_reach``.
* ``oldstyle``: ``strategies.old_style.old_styles(2)``: the reparametrizations OLD-STYLE-REMOVE
  puts on a matrix.
* ``convformat``: ``strategies.memory_formats.conv_formats()``: the layout conversions
  APPLY-CONV-MEMORY-FORMAT makes (function and format).
* ``ensemble``: ``strategies.ensembles.ensembles(unlike=True)`` and ``ensembles()``, half each:
  the ensembles STACK-MODULE-STATE-REFUSED and the alike properties draw.
* ``construction``: ``strategies.constructions.constructions()`` and ``constructions(refused=True)``,
  three to one: the builds APPLY-SKIP-INIT and APPLY-SKIP-INIT-REFUSED draw.
* ``seq``: the steps of derandomized sequences of the sequence machine on the reference
  (``properties.rules.sequence_reach``).

A doc figure is written ``` `sample/tag` 12.5% (>= 2%) ```: the share measured with the command above
and the floor a fixed-seed recomputation must meet (``tests/test_state_space.py``).

A derandomized sample is fixed by the Hypothesis version and by the local modules loaded when it
is drawn: Hypothesis draws some integers and floats from the constants in the source of every
loaded module outside site-packages and outside test folders. So the figures are measured by this
script alone in a fresh process (the test runs it in a subprocess), never inside a test session,
whose loaded modules depend on what was collected and what ran before; and :func:`measure`
first imports every swapspec module (``tests/fresh_sample.py``), so one sample's share does not
depend on the samples drawn before it.
"""

from __future__ import annotations

import re
import sys
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_N = 200
ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "state-space.md"
if str(ROOT) not in sys.path:  # run as a script: tests.fresh_sample
    sys.path.insert(0, str(ROOT))

# `sample/tag` 12.5% (>= 2%)
FIGURE = re.compile(r"`(?P<sample>[a-z]+)/(?P<tag>[^`]+)`\s+(?P<share>\d+(?:\.\d+)?)%\s+"
                    r"\(>=\s*(?P<floor>\d+(?:\.\d+)?)%\)")


# ---- torch-level tags of a built module ----------------------------------------------------------

def _tensor_tags(t: Any, where: str) -> set[str]:
    import torch
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    tags: set[str] = set()
    if is_traceable_wrapper_subclass(t):
        tags.add("tensor: traceable wrapper subclass")
        tags.add(f"tensor: {type(t).__name__}")
    if type(t).__name__ == "FakeTensor":
        tags.add("tensor: FakeTensor")
    if isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
        tags.add(f"{where}: uninitialized")
        return tags
    if t.is_meta:
        tags.add("tensor: meta")
    if t.layout != torch.strided:
        tags.add("tensor: sparse or other layout")
    if t.is_quantized:
        tags.add("tensor: quantized")
    if t.is_complex():
        tags.add("tensor: complex")
    elif t.dtype == torch.bool:
        tags.add("tensor: bool")
    elif not t.is_floating_point():
        tags.add("tensor: integer")
    elif t.dtype in (torch.float16, torch.bfloat16):
        tags.add("tensor: 16-bit floating")
    elif t.dtype == torch.float64:
        tags.add("tensor: float64")
    if t.dim() == 0:
        tags.add("tensor: 0-d")
    if t.layout == torch.strided and not is_traceable_wrapper_subclass(t):
        if not t.is_contiguous():
            tags.add("tensor: non-contiguous")
        if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
            tags.add("tensor: channels_last")
        if t._base is not None:
            tags.add("tensor: view")
        if not t.is_meta and t.is_shared():
            tags.add("tensor: in shared memory")
    if weakref.getweakrefs(t):
        tags.add("tensor: weakly referenced")
    if t._backward_hooks:
        tags.add("hook: tensor (register_hook)")
    if getattr(t, "_post_accumulate_grad_hooks", None):
        tags.add("hook: tensor post-accumulate-grad")
    return tags


def state_features(root: Any) -> set[str]:
    """Torch-level tags of the module ``root`` as it stands (see the module docstring)."""
    from torch import nn
    from torch._dynamo.eval_frame import OptimizedModule
    from torch.nn.modules.lazy import LazyModuleMixin
    from torch.nn.utils import parametrize

    tags: set[str] = set()
    base = nn.Module
    seen_paths: dict[int, int] = {}
    storages: dict[int, set[int]] = {}
    for path, m in root.named_modules(remove_duplicate=False):
        seen_paths[id(m)] = seen_paths.get(id(m), 0) + 1
        if path.count(".") >= 2:
            tags.add("module: depth >= 3")
    if any(c > 1 for c in seen_paths.values()):
        tags.add("module: shared submodule")
    names: dict[int, list[str]] = {}
    for kind, named in (("param", root.named_parameters(remove_duplicate=False)),
                        ("buffer", root.named_buffers(remove_duplicate=False))):
        for name, t in named:
            names.setdefault(id(t), []).append(f"{kind}:{name}")
    for keys in names.values():
        kinds = {k.split(":", 1)[0] for k in keys}
        if len(keys) > 1:
            tags.add("tie: " + ("parameter" if kinds == {"param"} else "buffer" if kinds == {"buffer"}
                                else "parameter and buffer"))
    for m in root.modules():
        cls = type(m)
        if isinstance(m, OptimizedModule):
            tags.add("module: OptimizedModule (torch.compile)")
        if isinstance(m, nn.DataParallel):
            tags.add("module: DataParallel")
        if isinstance(m, nn.RNNBase):
            tags.add("module: RNNBase (_flat_weights)")
        if isinstance(m, LazyModuleMixin):
            tags.add("module: lazy")
            if m.has_uninitialized_params():
                tags.add("module: lazy, uninitialized")
        if parametrize.is_parametrized(m):
            tags.add("module: parametrized")
        if cls._apply is not base._apply:
            tags.add("module: _apply override")
        if cls._load_from_state_dict is not base._load_from_state_dict:
            tags.add("module: _load_from_state_dict override")
        if cls._save_to_state_dict is not base._save_to_state_dict:
            tags.add("module: _save_to_state_dict override")
        if cls.get_extra_state is not base.get_extra_state:
            tags.add("module: extra state")
        if cls.__setattr__ is not base.__setattr__:
            tags.add("module: __setattr__ override")
        if not m.training:
            tags.add("module: eval mode")
        if m._non_persistent_buffers_set:
            tags.add("module: non-persistent buffer")
        if any(isinstance(v, __import__("torch").Tensor) for k, v in vars(m).items()
               if not k.startswith("_")):
            tags.add("module: tensor attribute outside the slots")
        for attr, tag in (("_forward_pre_hooks", "hook: module forward pre"),
                          ("_forward_hooks", "hook: module forward"),
                          ("_forward_hooks_with_kwargs", "hook: module forward with kwargs"),
                          ("_forward_hooks_always_called", "hook: module forward always_called"),
                          ("_backward_pre_hooks", "hook: module backward pre"),
                          ("_backward_hooks", "hook: module backward"),
                          ("_state_dict_pre_hooks", "hook: state_dict pre"),
                          ("_state_dict_hooks", "hook: state_dict post"),
                          ("_load_state_dict_pre_hooks", "hook: load_state_dict pre"),
                          ("_load_state_dict_post_hooks", "hook: load_state_dict post")):
            if getattr(m, attr, None):
                tags.add(tag)
        if m._backward_hooks and m._is_full_backward_hook is False:
            tags.add("hook: module backward (non-full)")
        for p in m._parameters.values():
            if p is None:
                tags.add("param: None")
                continue
            if not isinstance(p, nn.Parameter):
                tags.add("param: plain tensor in _parameters")
            elif type(p) is not nn.Parameter and not isinstance(p, nn.parameter.UninitializedParameter):
                tags.add("param: Parameter subclass")
            if not p.requires_grad:
                tags.add("param: requires_grad=False")
            tags |= _tensor_tags(p, "param")
            g = p.grad if not isinstance(p, nn.parameter.UninitializedParameter) else None
            if g is not None:
                tags.add("grad: present")
                if g.layout != __import__("torch").strided:
                    tags.add("grad: sparse")
                if g.requires_grad:
                    tags.add("grad: requires_grad (create_graph)")
        for b in m._buffers.values():
            if b is None:
                tags.add("buffer: None")
                continue
            tags |= _tensor_tags(b, "buffer")
        for t in (*m._parameters.values(), *m._buffers.values()):
            if t is None or isinstance(t, nn.parameter.UninitializedTensorMixin) or t.is_meta:
                continue
            if t.layout == __import__("torch").strided and not hasattr(t, "__tensor_flatten__"):
                try:
                    ptr = t.untyped_storage().data_ptr()
                except Exception:
                    continue
                if ptr:
                    storages.setdefault(ptr, set()).add(id(t))
    if any(len(ids) > 1 for ids in storages.values()):
        tags.add("tensor: storage shared by two slot objects")
    return tags


# ---- the samples --------------------------------------------------------------------------------

def _tree_sample(**options: Any) -> Callable[[int], list[frozenset[str]]]:
    def run(n: int) -> list[frozenset[str]]:
        from swapspec.strategies.reach import sample
        from swapspec.strategies.tree_draws import module_trees
        from swapspec.strategies.trees import tree_info

        return sample(module_trees(**options), n,
                      lambda m: set(tree_info(m).features) | state_features(m))
    return run


def _life(n: int) -> list[frozenset[str]]:
    from swapspec.strategies.reach import LIFE_OPTIONS
    return _tree_sample(**LIFE_OPTIONS)(n)


def _world(n: int) -> list[frozenset[str]]:
    from swapspec.strategies.reach import WORLD_OPTIONS
    return _tree_sample(**WORLD_OPTIONS)(n)


def _catalogue(n: int) -> list[frozenset[str]]:
    from swapspec.strategies.reach import CATALOGUE_REACH_CHANCE
    return _tree_sample(catalogue_chance=CATALOGUE_REACH_CHANCE)(n)


def _conversion(n: int) -> list[frozenset[str]]:
    from swapspec.strategies.reach import conversion_reach
    return conversion_reach(n)


def _method(n: int) -> list[frozenset[str]]:
    from swapspec.strategies.reach import method_reach
    return method_reach(n)


def _call(n: int) -> list[frozenset[str]]:
    from swapspec.strategies.reach import call_reach
    return call_reach(n)


def _load(n: int) -> list[frozenset[str]]:
    from swapspec.strategies.reach import load_reach
    return load_reach(n)


def _oldstyle(n: int) -> list[frozenset[str]]:
    from swapspec.strategies.old_style import old_styles
    from swapspec.strategies.reach import sample
    return sample(old_styles(2), n, lambda o: o.features)


def _convformat(n: int) -> list[frozenset[str]]:
    from swapspec.strategies.memory_formats import conv_formats
    from swapspec.strategies.reach import sample
    return sample(conv_formats(), n, lambda c: c.features)


def _ensemble(n: int) -> list[frozenset[str]]:
    from swapspec.strategies.ensembles import ensembles
    from swapspec.strategies.reach import sample
    return [*sample(ensembles(unlike=True), n // 2, lambda e: e.features),
            *sample(ensembles(), n - n // 2, lambda e: e.features)]


def _construction(n: int) -> list[frozenset[str]]:
    from swapspec.strategies.constructions import constructions
    from swapspec.strategies.reach import sample
    return [*sample(constructions(), n - n // 4, lambda c: c.features),
            *sample(constructions(refused=True), n // 4, lambda c: c.features)]


def _seq(n: int) -> list[frozenset[str]]:
    from swapspec.properties.rules.sequence_reach import sequence_reach
    return sequence_reach(n)[0]


# name -> (sampler, divisor): the sample draws N // divisor examples (sequences: up to 15 steps).
SAMPLES: dict[str, tuple[Callable[[int], list[frozenset[str]]], int]] = {
    "tree": (_tree_sample(), 1),
    "life": (_life, 1),
    "world": (_world, 1),
    "catalogue": (_catalogue, 1),
    "conversion": (_conversion, 1),
    "method": (_method, 1),
    "call": (_call, 1),
    "load": (_load, 1),
    "oldstyle": (_oldstyle, 1),
    "convformat": (_convformat, 1),
    "ensemble": (_ensemble, 1),
    "construction": (_construction, 1),
    "seq": (_seq, 3),
}


def measure(n: int = DEFAULT_N, names: Iterable[str] | None = None) -> dict[str, dict[str, float]]:
    """``{sample: {tag: share}}`` for the named samples (default: all), ``n // divisor`` draws each."""
    import warnings

    from swapspec.strategies.reach import frequencies
    from tests.fresh_sample import load_every_swapspec_module

    load_every_swapspec_module()
    out: dict[str, dict[str, float]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in (SAMPLES if names is None else names):
            sampler, divisor = SAMPLES[name]
            out[name] = frequencies(sampler(max(1, n // divisor)))
    return out


@dataclass(frozen=True)
class Figure:
    sample: str
    tag: str
    share: float  # percent, as stated
    floor: float  # percent


def doc_figures(text: str) -> list[Figure]:
    """Every ``` `sample/tag` 12.5% (>= 2%) ``` figure in the text."""
    return [Figure(m["sample"], m["tag"], float(m["share"]), float(m["floor"]))
            for m in FIGURE.finditer(text)]


def check_figures(figures: Iterable[Figure], measured: dict[str, dict[str, float]]) -> list[str]:
    """The figures whose measured share is under their floor (or whose sample is unknown)."""
    problems = []
    for f in figures:
        if f.sample not in SAMPLES:
            problems.append(f"`{f.sample}/{f.tag}`: no sample called {f.sample!r}")
            continue
        got = 100 * measured.get(f.sample, {}).get(f.tag, 0.0)
        if got < f.floor:
            problems.append(f"`{f.sample}/{f.tag}`: {got:.1f}% < floor {f.floor:g}% (doc says {f.share:g}%)")
    return problems


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    n = int(args[0]) if args else DEFAULT_N
    start = time.perf_counter()
    if check:
        figures = doc_figures(DOC.read_text())
        measured = measure(n, sorted({f.sample for f in figures if f.sample in SAMPLES}))
        problems = check_figures(figures, measured)
        print("\n".join(problems) or f"all {len(figures)} figures meet their floors")
    else:
        measured = measure(n)
        for name, freqs in measured.items():
            _, divisor = SAMPLES[name]
            print(f"## {name} ({max(1, n // divisor)} draws)\n")
            for tag, share in freqs.items():
                print(f"`{name}/{tag}` {100 * share:.1f}%")
            print()
        problems = []
    print(f"({time.perf_counter() - start:.1f} s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
