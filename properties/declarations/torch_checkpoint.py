"""Declared deviations of torch's ``nn.Module.load_state_dict`` from the ``CHECKPOINT-`` rules.

Both come from one decision: torch loads key by key and runs ``set_extra_state`` and the load
post-hooks as it goes, and only then raises, so a refused load keeps what it loaded before.
The predicates read the drawn ``LoadInput`` (``Example.load``) before the call.
"""

from __future__ import annotations

from typing import Any

from swapspec.properties.vocabulary import Deviation

# Checked on torch 2.13.0 only: a run of the oracle matrix sets the lower bound.
TORCH_CHECKED = ("2.13.0", None)


def extra_state_before_unexpected_key(example: Any) -> bool:
    """A strict load of CHECKPOINT-EXTRA-STATE that gives the extra state and an unexpected
    ``tree._extra_state`` key: torch calls ``set_extra_state`` and then refuses the key."""
    load = example.load
    return (load is not None and load.strict and "tree._extra_state" in load.state_dict
            and "extra._extra_state" in load.state_dict)


def always(example: Any) -> bool:
    """Every example of the property."""
    return True


CHECKPOINT_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "CHECKPOINT-EXTRA-STATE", extra_state_before_unexpected_key, "changed",
        torch_versions=TORCH_CHECKED, reason=
        "A strict load_state_dict that refuses an unexpected key has already called "
        "set_extra_state with the given extra state, and keeps it (torch collects the errors and "
        "raises after loading every module). Repro: class E(nn.Module):\n"
        " def __init__(s): super().__init__(); s.v = 0\n"
        " def get_extra_state(s): return s.v\n"
        " def set_extra_state(s, v): s.v = v\n"
        "m = nn.Module(); m.e = E(); m.l = nn.Linear(2, 2); "
        "sd = {**m.state_dict(), 'e._extra_state': 1, 'l._extra_state': 1}; "
        "m.load_state_dict(sd)  # RuntimeError: Unexpected key(s) in state_dict: "
        "\"l._extra_state\"; assert m.e.v == 0  # fails: 1",
        id="torch.checkpoint.extra-state-set-before-unexpected-key"),
    Deviation(
        "CHECKPOINT-POST-HOOK-RETURN", always, "changed", torch_versions=TORCH_CHECKED, reason=
        "load_state_dict runs a module's load post-hooks after loading it and its children, and "
        "raises the AssertionError of a hook that returned a value only then: the module stays "
        "loaded. Repro: m = nn.Linear(2, 2); "
        "m.register_load_state_dict_post_hook(lambda mod, keys: 'renamed'); "
        "m.load_state_dict({'weight': torch.zeros(2, 2), 'bias': torch.zeros(2)})  "
        "# AssertionError; assert m.bias.abs().sum() > 0  # fails: loaded",
        id="torch.checkpoint.post-hook-return-after-load"),
)
