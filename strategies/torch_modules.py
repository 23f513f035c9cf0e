"""Real modules from torch's own catalogue, ``torch.testing._internal.common_modules.module_db``.

Rules:

* An entry is a ``ModuleInfo`` named by its ``name`` (``'nn.Linear'``). Its variant ``k`` is the ``k``-th
  ``ModuleInput`` of ``module_inputs_func(info, device='cpu', dtype=torch.float32, requires_grad=False,
  training=True)``: constructor arguments plus a forward input.
* :func:`survey` computes the catalogue: in shrinking order (simplest family first, see
  :data:`FAMILY_ORDER`), every entry not in :data:`ENTRY_EXCLUSIONS` with the variants that pass
  :func:`variant_problem`: up to :data:`MAX_VARIANTS` evenly spaced candidates per entry, each kept when it
  constructs, has at least one parameter or buffer, and runs one forward in train mode and one in eval mode.
  Entries with no kept variant are left out with the reason.
* :data:`CATALOGUE` (entries by name) and :data:`EXCLUDED` (reasons by name) are made on first use and
  cached: from ``catalogue_snapshot.py`` (the survey's result, checked by a test) when it was made for the
  installed torch release, else from a fresh survey (seconds: every candidate is built and run).
* Building is a pure function of ``(entry, variant, seed)``: inputs and module are made inside
  :func:`seeded` (a forked CPU RNG seeded with ``seed``, Python's ``random`` saved and restored), so the same
  arguments give byte-identical tensors and torch's and Python's global RNG never move.
* :class:`CatalogueLeaf` wraps the real module (child ``inner``) in the forward contract of
  :mod:`swapspec.strategies.modules`.

``python -m swapspec.strategies.torch_modules --table`` prints, per family and flag setting, how many
entries ``double()`` converts with forward still working, for ``reference.apply`` and torch's ``_apply``;
``--entries`` prints the kept and excluded entries.
"""

from __future__ import annotations

import contextlib
import copy
import random
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any
from unittest import mock

import torch
from torch import Tensor, nn

from swapspec.strategies import catalogue_snapshot
from swapspec.strategies.modules import BATCH, FEATURES, pattern

MAX_VARIANTS = 8
FAMILY_ORDER = (
    "Linear", "Activation", "Embedding", "Norm", "Conv", "Pooling", "Loss", "Attention", "RNN",
    "Transformer", "Other",
)
# Ordered: the first rule whose substring occurs in the entry name gives the family; none: "Other".
FAMILY_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Loss", ("Loss",)),
    ("Attention", ("Attention",)),
    ("Transformer", ("Transformer",)),
    ("RNN", ("RNN", "GRU", "LSTM")),
    ("Conv", ("Conv",)),
    ("Norm", ("Norm",)),
    ("Pooling", ("Pool",)),
    ("Embedding", ("Embedding",)),
    ("Linear", ("Linear", "Bilinear")),
    ("Activation", ("ReLU", "ELU", "GLU", "Sigmoid", "SiLU", "Softm", "Softplus", "Shrink", "shrink",
                    "Softsign", "Tanh", "Hard", "Mish", "Threshold")),
)
# Entries left out whatever their variants do, with the reason. Empty on torch 2.13.0 (CPU): every entry
# builds deterministically under `seeded`, and fresh inputs plus build plus forward take at most ~26 ms of
# CPU (nn.TransformerEncoder; tests/test_strategies_catalogue.py checks 50 ms); the survey's rules leave
# out the others.
ENTRY_EXCLUSIONS: dict[str, str] = {}


def family(entry: str) -> str:
    """The family of an entry name, by :data:`FAMILY_RULES`."""
    for name, needles in FAMILY_RULES:
        if any(n in entry for n in needles):
            return name
    return "Other"


# ---------------------------------------------------------------- seeding and torch's catalogue


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with torch's CPU RNG forked and seeded with ``seed`` and Python's ``random`` seeded
    with ``seed``; both global states are restored on exit."""
    py_state = random.getstate()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            random.seed(seed)
            yield
    finally:
        random.setstate(py_state)


class _NoProfiles:
    """Stands in for ``hypothesis.settings`` while torch's test utilities import: it builds settings
    objects but registers and loads no profile."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import hypothesis._settings

        return hypothesis._settings.settings(*args, **kwargs)

    def register_profile(self, *args: Any, **kwargs: Any) -> None:
        """Registers nothing."""

    def load_profile(self, *args: Any, **kwargs: Any) -> None:
        """Loads nothing."""


@cache
def module_db() -> tuple[Any, ...]:
    """torch's ``module_db``, imported without the import's side effects on global state.

    ``torch.testing._internal.common_utils`` registers and loads Hypothesis profiles (``dev`` would replace
    the running profile), freezes ``torch.backends``' flags, wraps ``ScriptFunction.__call__`` /
    ``ScriptMethod.__call__`` and adds warning filters; all of that is prevented or undone here.
    """
    import hypothesis

    frozen = torch.backends.flags_frozen()
    script_calls = (torch._C.ScriptFunction.__call__, torch._C.ScriptMethod.__call__)
    with warnings.catch_warnings(), mock.patch.object(hypothesis, "settings", _NoProfiles()):
        from torch.testing._internal.common_modules import module_db as db
    torch._C.ScriptFunction.__call__, torch._C.ScriptMethod.__call__ = script_calls
    if not frozen:
        torch.backends.disable_global_flags.__globals__["__allow_nonbracketed_mutation_flag"] = True
    return tuple(db)


@cache
def _infos() -> dict[str, Any]:
    return {info.name: info for info in module_db()}


def info(entry: str) -> Any:
    """The ``ModuleInfo`` called ``entry``."""
    return _infos()[entry]


@lru_cache(maxsize=64)
def _inputs(entry: str, seed: int) -> tuple[Any, ...]:
    """Every ``ModuleInput`` of ``entry`` made under :func:`seeded` (shared: copy before use)."""
    i = info(entry)
    with seeded(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(i.module_inputs_func(i, device="cpu", dtype=torch.float32, requires_grad=False,
                                          training=True))


def copied_inputs(entry: str, variant: int, seed: int) -> tuple[tuple, dict, tuple, dict]:
    """Fresh copies of one variant's ``(constructor args, kwargs, forward args, kwargs)``."""
    mi = _inputs(entry, seed)[variant]
    ctor, fwd = mi.constructor_input, mi.forward_input
    return copy.deepcopy((ctor.args, ctor.kwargs, fwd.args, fwd.kwargs))


def build_inner(entry: str, variant: int, seed: int) -> tuple[nn.Module, tuple, dict]:
    """``(module, forward args, forward kwargs)`` of one variant, every tensor fresh; pure in its arguments."""
    ctor_args, ctor_kwargs, args, kwargs = copied_inputs(entry, variant, seed)
    with seeded(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = info(entry).module_cls(*ctor_args, **ctor_kwargs)
    return module, args, kwargs


# ---------------------------------------------------------------- the adapter leaf


def reference_tensor(module: nn.Module) -> Tensor | None:
    """The first floating-point or complex parameter or buffer of ``module`` (``None`` if there is none)."""
    for t in (*module.parameters(), *module.buffers()):
        if t.is_floating_point() or t.is_complex():
            return t
    return None


def map_tensors(value: Any, fn: Callable[[Tensor], Any]) -> Any:
    """``value`` with ``fn`` applied to every tensor inside tuples (named ones too), lists and dicts."""
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(map_tensors(v, fn) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def cast_inputs(value: Any, like: Tensor | None) -> Any:
    """Fresh copies of the tensors in ``value``: floating/complex ones get ``like``'s dtype and device,
    others (integer, bool) only its device. ``like=None``: plain copies."""

    def cast(t: Tensor) -> Tensor:
        if like is None:
            return t.clone()
        if t.is_floating_point() or t.is_complex():
            return t.to(device=like.device, dtype=like.dtype, copy=True)
        return t.to(device=like.device, copy=True)

    return map_tensors(value, cast)


def fold_weights(n: int, device: torch.device) -> Tensor:
    """``1 + 0.5 * sin(k)`` for ``k < n``, float64: fixed, never zero, different across elements."""
    return torch.arange(n, dtype=torch.float64, device=device).sin() * 0.5 + 1


def fold(value: Any, device: torch.device) -> Tensor:
    """A float64 0-d tensor on ``device``: over every floating/complex tensor in ``value`` (nested tuples,
    lists, dicts, ``PackedSequence``), the sum of its real part's elements times :func:`fold_weights`;
    integer and bool tensors add nothing.

    The weights make the result see parameters that a plain sum cancels: the sum of a normalization's
    output ``w * x_hat + b`` over the normalized elements does not depend on ``w``.
    """
    parts: list[Tensor] = []

    def add(t: Tensor) -> None:
        if t.is_floating_point() or t.is_complex():
            flat = (t.real if t.is_complex() else t).to(torch.float64).reshape(-1)
            parts.append((flat * fold_weights(flat.numel(), flat.device)).sum())

    map_tensors(value, add)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for p in parts:
        total = total + p.to(device)
    return total


class CatalogueLeaf(nn.Module):
    """A catalogue module (child ``inner``) with the swapspec forward contract.

    ``forward(x, **kwargs)`` runs ``inner(*inputs_args, **inputs_kwargs)`` on fresh copies of the stored
    inputs (plain attributes, not registered), cast by :func:`cast_inputs` to ``inner``'s first
    floating/complex tensor, under :func:`seeded` with the build seed (dropout and the like are
    deterministic). Every output is folded by :func:`fold` (a weighted sum) into ``s``, made finite by
    ``nan_to_num``, and the leaf returns ``x + (s * 0.01) * pattern(x)`` in ``x``'s dtype. ``kwargs`` are
    not passed on.
    """

    def __init__(self, entry: str, variant: int, seed: int, inner: nn.Module, args: tuple,
                 kwargs: dict) -> None:
        super().__init__()
        self.entry, self.variant, self.sw_seed = entry, variant, seed
        self.inner = inner
        self.inputs_args = tuple(args)
        self.inputs_kwargs = dict(kwargs)

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        like = reference_tensor(self.inner)
        args, kw = cast_inputs((self.inputs_args, self.inputs_kwargs), like)
        with seeded(self.sw_seed):
            out = self.inner(*args, **kw)
        s = fold(out, like.device if like is not None else x.device)
        s = torch.nan_to_num(s, nan=0.0, posinf=1e6, neginf=-1e6).to(x.device)
        return x + (s * 0.01).to(x.dtype) * pattern(x)

    def extra_repr(self) -> str:
        return f"entry={self.entry!r}, variant={self.variant}"


def build_leaf(entry: str, variant: int, seed: int) -> CatalogueLeaf:
    """A :class:`CatalogueLeaf` for one variant; pure in its arguments."""
    return CatalogueLeaf(entry, variant, seed, *build_inner(entry, variant, seed))


# ---------------------------------------------------------------- the catalogue


@dataclass(frozen=True)
class Entry:
    """One kept catalogue entry: its name, family, whether it is lazy, and its kept variant indices."""

    name: str
    family: str
    lazy: bool
    variants: tuple[int, ...]

    @property
    def info(self) -> Any:
        """The entry's ``ModuleInfo``."""
        return info(self.name)

    def module_inputs(self, seed: int = 0) -> tuple[Any, ...]:
        """The kept ``ModuleInput`` s (constructor input and forward input) made with ``seed``."""
        made = _inputs(self.name, seed)
        return tuple(made[k] for k in self.variants)


def is_lazy(entry: str) -> bool:
    """Whether an entry is a lazy module (its name starts with ``nn.Lazy``)."""
    return entry.startswith("nn.Lazy")


def candidate_variants(n: int) -> list[int]:
    """Up to :data:`MAX_VARIANTS` indices spread evenly over ``range(n)``, the first and last included."""
    if n <= MAX_VARIANTS:
        return list(range(n))
    return sorted({round(i * (n - 1) / (MAX_VARIANTS - 1)) for i in range(MAX_VARIANTS)})


def variant_problem(entry: str, variant: int) -> str | None:
    """Why a variant is left out (``None``: kept): no forward input, construction or a forward (train,
    then eval) raising, or no parameter or buffer."""
    if _inputs(entry, 0)[variant].forward_input is None:
        return "no forward input"
    try:
        leaf = build_leaf(entry, variant, 0)
    except Exception as e:
        return f"construction raises {type(e).__name__}"
    if not [*leaf.inner.parameters(), *leaf.inner.buffers()]:
        return "no parameters or buffers"
    x = torch.zeros(BATCH, FEATURES)
    for training in (True, False):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                leaf.train(training)(x)
        except Exception as e:
            return f"forward ({'train' if training else 'eval'}) raises {type(e).__name__}"
    return None


@cache
def survey() -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Compute ``(kept variants by entry, in shrinking order; excluded entries with reasons)`` from the
    installed torch by the rules of the module docstring (seconds: every candidate is built and run)."""
    kept: dict[str, tuple[int, ...]] = {}
    excluded: dict[str, str] = {}
    for i in module_db():
        if i.name in ENTRY_EXCLUSIONS:
            excluded[i.name] = ENTRY_EXCLUSIONS[i.name]
            continue
        try:
            n = len(_inputs(i.name, 0))
        except Exception as e:
            excluded[i.name] = f"module_inputs_func raises {type(e).__name__}"
            continue
        problems = {k: variant_problem(i.name, k) for k in candidate_variants(n)}
        good = tuple(k for k, p in problems.items() if p is None)
        if good:
            kept[i.name] = good
        else:
            excluded[i.name] = "; ".join(sorted(set(filter(None, problems.values())))) or "no inputs"
    ordered = sorted(kept, key=lambda name: FAMILY_ORDER.index(family(name)))  # stable: db order
    return {name: kept[name] for name in ordered}, excluded


def torch_release() -> str:
    """The installed torch's version without its local part (``'2.13.0'``)."""
    return torch.__version__.split("+")[0]


@cache
def _kept_and_excluded() -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """The snapshot when it was made for the installed torch release, else a fresh :func:`survey`."""
    if torch_release() == catalogue_snapshot.TORCH_RELEASE:
        return dict(catalogue_snapshot.KEPT), dict(catalogue_snapshot.EXCLUDED)
    return survey()


@cache
def catalogue() -> dict[str, Entry]:
    """The kept entries by name, in shrinking order (see the module docstring)."""
    kept, _ = _kept_and_excluded()
    return {name: Entry(name, family(name), is_lazy(name), variants) for name, variants in kept.items()}


def excluded() -> dict[str, str]:
    """Every ``module_db`` entry left out, with its reason."""
    return dict(_kept_and_excluded()[1])


def entry_names() -> list[str]:
    """Names of the kept entries, in shrinking order."""
    return list(catalogue())


def snapshot_source() -> str:
    """The text of ``catalogue_snapshot.py`` for the installed torch (from a fresh :func:`survey`)."""
    kept, left_out = survey()
    lines = [
        '"""The catalogue as :func:`swapspec.strategies.torch_modules.survey` computes it for one torch release.',
        "",
        "Generated by ``python -m swapspec.strategies.torch_modules --snapshot``; do not edit by hand.",
        "``tests/test_strategies_catalogue.py`` checks it against a fresh survey. Under another torch release",
        "the survey runs instead.",
        '"""',
        "",
        f"TORCH_RELEASE = {torch_release()!r}",
        "",
        "KEPT: dict[str, tuple[int, ...]] = {",
        *(f"    {name!r}: {variants!r}," for name, variants in kept.items()),
        "}",
        "",
        "EXCLUDED: dict[str, str] = {",
        *(f"    {name!r}: {reason!r}," for name, reason in left_out.items()),
        "}",
    ]
    return "\n".join(lines) + "\n"


def pairs() -> list[tuple[str, int]]:
    """Every kept ``(entry, variant)`` pair."""
    return [(e.name, v) for e in catalogue().values() for v in e.variants]


def __getattr__(name: str) -> Any:
    """``CATALOGUE`` and ``EXCLUDED`` are computed on first access."""
    if name == "CATALOGUE":
        return catalogue()
    if name == "EXCLUDED":
        return excluded()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class CatalogueSlot:
    """A registered, initialized tensor of a built variant: owner path under the leaf, name, kind, shape, dtype."""

    path: str
    name: str
    buffer: bool
    shape: tuple[int, ...]
    dtype: str


def keeps_weak_references(entry: str) -> bool:
    """Whether the entry's module keeps weak references to its parameters, which ``swap_tensors``
    refuses: an RNN's flat weights (``nn.RNNBase``)."""
    return issubclass(info(entry).module_cls, nn.RNNBase)


@cache
def slots(entry: str, variant: int) -> tuple[CatalogueSlot, ...]:
    """The slots of a built leaf (paths start with ``inner``), parameters then buffers per module, in
    ``named_modules()`` order; ``None`` and uninitialized (lazy) tensors are left out."""
    leaf = build_leaf(entry, variant, 0)
    out = []
    for path, m in leaf.named_modules():
        for buffer, table in ((False, m._parameters), (True, m._buffers)):
            for name, t in table.items():
                if t is None or isinstance(t, nn.parameter.UninitializedTensorMixin):
                    continue
                out.append(CatalogueSlot(path, name, buffer, tuple(t.shape),
                                         str(t.dtype).removeprefix("torch.")))
    return tuple(out)


# ---------------------------------------------------------------- double() table


FLAG_SETTINGS = ((False, False), (False, True), (True, False), (True, True))


def converts_double(entry: str, variant: int, apply: Callable[..., Any], overwrite: bool,
                    swap: bool) -> bool:
    """Whether ``apply(leaf, double, overwrite=, swap=)`` succeeds, leaves every floating tensor float64, and
    the leaf's forward still runs."""
    leaf = build_leaf(entry, variant, 0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            apply(leaf, lambda t: t.double() if t.is_floating_point() else t, overwrite=overwrite,
                  swap=swap)
            floating = [t for t in (*leaf.parameters(), *leaf.buffers()) if t.is_floating_point()]
            if any(t.dtype != torch.float64 for t in floating):
                return False
            leaf(torch.zeros(BATCH, FEATURES))
    except Exception:
        return False
    return True


def torch_apply(module: nn.Module, fn: Callable, *, overwrite: bool, swap: bool) -> nn.Module:
    """``module._apply(fn)`` with ``torch.__future__``'s flags set for the call (restored in ``finally``)."""
    future = torch.__future__
    saved = (future.get_overwrite_module_params_on_conversion(),
             future.get_swap_module_params_on_conversion())
    try:
        future.set_overwrite_module_params_on_conversion(overwrite)
        future.set_swap_module_params_on_conversion(swap)
        return module._apply(fn)
    finally:
        future.set_overwrite_module_params_on_conversion(saved[0])
        future.set_swap_module_params_on_conversion(saved[1])


def double_table() -> str:
    """A Markdown table: per family and flag setting, ``reference/torch`` counts of entries whose every kept
    variant passes :func:`converts_double`, out of the family's entries."""
    from swapspec.reference import apply as reference_apply

    families = [f for f in FAMILY_ORDER if any(e.family == f for e in catalogue().values())]
    heads = [f"overwrite={'T' if o else 'F'}, swap={'T' if s else 'F'}" for o, s in FLAG_SETTINGS]
    lines = ["| family (entries) | " + " | ".join(heads) + " |",
             "| --- | " + " | ".join("---:" for _ in heads) + " |"]
    for fam in families:
        entries = [e for e in catalogue().values() if e.family == fam]
        cells = []
        for o, s in FLAG_SETTINGS:
            counts = [sum(all(converts_double(e.name, v, apply, o, s) for v in e.variants)
                          for e in entries) for apply in (reference_apply, torch_apply)]
            cells.append(f"{counts[0]} / {counts[1]}")
        lines.append(f"| {fam} ({len(entries)}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def entries_table() -> str:
    """Markdown lists of the kept entries (family, variants) and the excluded ones (reason)."""
    lines = ["| entry | family | variants |", "| --- | --- | --- |"]
    lines += [f"| `{e.name}` | {e.family} | {', '.join(str(v) for v in e.variants)} |"
              for e in catalogue().values()]
    lines += ["", "| excluded entry | reason |", "| --- | --- |"]
    lines += [f"| `{name}` | {reason} |" for name, reason in excluded().items()]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if "--snapshot" in argv:
        print(snapshot_source(), end="")
        return
    if "--entries" in argv:
        print(entries_table())
    if "--table" in argv or not argv:
        print("Entries whose every kept variant converts with `double()` and still runs forward, "
              "as `reference.apply / torch _apply`:\n")
        print(double_table())


if __name__ == "__main__":
    main(sys.argv[1:])
