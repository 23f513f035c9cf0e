"""torch's declarations for APPLY-CONTRACT: where torch's ``_apply`` raises halfway on a
conversion whose contract accepts every tensor, as it does under APPLY-VALUES (the same
regions, predicates and repros; each declaration is the APPLY-VALUES one, for this property)."""

from __future__ import annotations

import dataclasses

from swapspec.properties.declarations.torch import TORCH_DEVIATIONS
from swapspec.properties.vocabulary import Deviation


def _for_contract(d: Deviation) -> Deviation:
    return dataclasses.replace(d, property_id="APPLY-CONTRACT", observed="raised",
                               id=f"{d.id}.contract")


CONTRACT_DEVIATIONS: tuple[Deviation, ...] = tuple(
    _for_contract(d) for d in TORCH_DEVIATIONS
    if "APPLY-VALUES" in d.property_ids and d.clauses == ("raised",))
