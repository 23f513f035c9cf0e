"""Every property ID, grouped by family, for hosts to name in skips and deviations, and the
target features (``properties.targets.FEATURES``) each one needs.

``tests/test_plugin.py`` checks that these tuples list exactly the properties the test
files define, so a host can rely on them.
"""

from __future__ import annotations

APPLY = (
    "APPLY-ATOMIC", "APPLY-FN-ONCE", "APPLY-FORWARD", "APPLY-GRADS", "APPLY-NO-SET-DATA-ACROSS-IMPL",
    "APPLY-NONE-SLOTS", "APPLY-PARAMETER-IDENTITY", "APPLY-PATH", "APPLY-RECURSE-FALSE",
    "APPLY-OPTIMIZER", "APPLY-REFUSED-SWAP", "APPLY-ROUND-TRIP", "APPLY-TENSOR-HOOKS", "APPLY-TIES",
    "APPLY-VALUES",
)
FUNCTIONAL_CALL = (
    "FC-BAD-INPUT", "FC-GRADIENTS", "FC-INPUT-FORMS", "FC-ORACLE", "FC-PARAMETRIZED",
    "FC-RESTORE", "FC-STRICT",
    "FC-TIES", "FC-VISIBLE", "FC-WRITE-BACK",
)
TOGETHER = ("TOGETHER-APPLY-IN-FORWARD", "TOGETHER-CONVERTED-CALL")
XLA = (
    "XLA-DTYPE-PATH", "XLA-FUNCTIONAL-CALL", "XLA-LOAD-FROM", "XLA-LOAD-INTO",
    "XLA-MOVE-ALL-FLAGS", "XLA-ROUND-TRIP", "XLA-SET-DATA-REFUSED", "XLA-STATE",
)
SEQUENCES = ("SEQ-FORWARD", "SEQ-HOOKS", "SEQ-OPTIMIZER", "SEQ-STATE")
LOAD = (
    "LOAD-ATOMIC", "LOAD-IDENTITY", "LOAD-KEYS", "LOAD-PATH", "LOAD-ROUND-TRIP", "LOAD-TIES",
    "LOAD-VALUES",
)
FAMILIES: dict[str, tuple[str, ...]] = {
    "apply": APPLY, "functional_call": FUNCTIONAL_CALL, "together": TOGETHER, "xla": XLA,
    "sequences": SEQUENCES, "load_state_dict": LOAD,
}
ALL: tuple[str, ...] = tuple(pid for family in FAMILIES.values() for pid in family)

# What each property calls on the target. A target without one of them is skipped there
# (``properties.targets.Target.has``); a property not listed needs ``FAMILY_NEEDS`` of its family.
FAMILY_NEEDS: dict[str, tuple[str, ...]] = {
    "apply": ("apply",), "functional_call": ("functional_call",),
    "together": ("apply", "functional_call"), "xla": ("apply",),
    "load_state_dict": ("load_state_dict",), "sequences": ("apply", "functional_call"),
}
NEEDS: dict[str, tuple[str, ...]] = {
    **{pid: FAMILY_NEEDS[family] for family, pids in FAMILIES.items() for pid in pids},
    "FC-STRICT": ("functional_call", "strict"),
    "FC-INPUT-FORMS": ("functional_call", "tuple_inputs"),
    "XLA-FUNCTIONAL-CALL": ("functional_call",),
    "XLA-LOAD-FROM": ("load_state_dict",),
    "XLA-LOAD-INTO": ("load_state_dict",),
    "XLA-SET-DATA-REFUSED": (),  # a fact about the torch build, whatever the target
}
