"""Two targets of one name, ``planted-pair``, each with one planted bug, for ``tests/test_compare.py``.

Reports of the two read like two torch releases of one target:

- ``ties_declared``: ``apply`` splits tied parameters, declared as a deviation (APPLY-TIES
  shows ``parameter-tie-split``); ``functional_call`` is the reference's.
- ``no_restore``: ``apply`` is the reference's; ``functional_call`` leaves given parameters in
  the module, undeclared (FC-RESTORE fails).
"""

from __future__ import annotations

from types import SimpleNamespace

from swapspec import reference
from tests.planted.broken_reference import (
    TIE_SPLIT,
    parameter_keeping_functional_call,
    tie_splitting_apply,
)

NAME = "planted-pair"

ties_declared = SimpleNamespace(name=NAME, apply=tie_splitting_apply,
                                functional_call=reference.functional_call, deviations=[TIE_SPLIT])

no_restore = SimpleNamespace(name=NAME, apply=reference.apply,
                             functional_call=parameter_keeping_functional_call)
