"""A host's own modules, drawn by the properties alongside the built-in trees.

A host describes each of its modules as a :class:`HostModule`; its target's ``modules`` is a
strategy of them (``st.sampled_from([...])`` or ``st.builds(HostModule, ...)``). Rules:

* ``name`` identifies the module: one name, one module. The tree spec records only the name
  (``LeafSpec(kind="host", entry=name)``), and rebuilding looks it up here.
* ``build()`` returns a fresh module with the same tensors on every call (seed what it draws).
* ``inputs(x)`` turns the properties' forward input ``x``, a float32 tensor of shape
  ``(BATCH, FEATURES)``, into the positional arguments of the module's forward (default ``(x,)``).
  The forward returns a tensor; inside a drawn tree (``module_trees`` draws host leaves among
  the others) it must have the input's shape, as the next leaf takes it. The host leaf casts
  ``x`` to the dtype of the module's first floating tensor and the result back to ``x``'s.

:func:`host_trees` makes each drawn ``HostModule`` a one-leaf tree: a :class:`HostLeaf` root
whose child ``inner`` is the host's module, so every property that rebuilds, copies or
reports a drawn tree does the same with it. Names the properties give are the module's names
under ``inner.`` (``inner.weight``). ``HostModule.source`` gives the lines a standalone repro
needs to build the module without swapspec, when ``build`` is importable.
"""

from __future__ import annotations

from hypothesis import event
from hypothesis import strategies as st
from torch import nn

from swapspec.strategies.host_leaves import HostModule, register


def host_trees(modules: st.SearchStrategy[HostModule]) -> st.SearchStrategy[nn.Module]:
    """Draw one of ``modules`` as a built one-leaf tree (``tree_info`` knows it). Reports
    ``hypothesis.event('tree: host: <name>')``."""
    return modules.map(_host_tree)


def _host_tree(host: HostModule) -> nn.Module:
    from swapspec.strategies.trees import LeafSpec, TreeSpec, build_tree

    tree = build_tree(TreeSpec(root=LeafSpec(kind="host", entry=register(host))))
    event(f"tree: host: {host.name}")
    return tree
