"""torch's deviations found when host material reached every property family (they show on
built-in trees too: the host trees only drew them first).

- ``torch.load.assign-commits-before-uninitialized-raise``: ``load_state_dict(assign=True)``
  collects its errors and raises them at the end, so every slot it assigned before (or after) an
  uninitialized lazy parameter refused its own entry holds the assigned object.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch.nn.parameter import is_lazy

from swapspec.properties.declarations.torch_load_failures import own_state
from swapspec.properties.declarations.torch_load_objects import uninitialized_refused
from swapspec.properties.vocabulary import Deviation

TORCH_ALL = (None, None)


def assign_commits_before_uninitialized_raise(example: Any) -> bool:
    """``assign=True`` on a module with an uninitialized parameter (torch raises on it) that is
    given another object for another tensor slot, which torch assigns before raising."""
    if not (example.load.assign and uninitialized_refused(example)):
        return False
    given = example.load.state_dict
    return any(isinstance(t, Tensor) and not is_lazy(t) and key in given and given[key] is not t
               for key, t in own_state(example).items())


REACH_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        ("LOAD-ROUND-TRIP", "LOAD-PATH", "LOAD-VALUES", "LOAD-IDENTITY", "LOAD-KEYS",
         "LOAD-ATOMIC", "LOAD-TIES"),
        assign_commits_before_uninitialized_raise, "INV-RAISE-UNCHANGED",
        "load_state_dict(assign=True) raises on an uninitialized (lazy) parameter given its own "
        "entry only after assigning every other entry: it collects errors and raises at the "
        "end, so the load is not atomic.\n"
        "m = torch.nn.Sequential(torch.nn.LazyLinear(2), torch.nn.Linear(2, 2))\n"
        "w = m[1].weight\n"
        "try:\n    m.load_state_dict(m.state_dict(), assign=True)\nexcept RuntimeError:\n    pass\n"
        "assert m[1].weight is not w  # assigned before the raise",
        TORCH_ALL, always=False, id="torch.load.assign-commits-before-uninitialized-raise"),
)
