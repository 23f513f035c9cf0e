"""Declarations of known deviations, per target family, and how a host picks some to reuse.

``select`` filters declarations by ID, property and clause; the torch target's own, ready to
select from, are ``properties.harness.targets.torch_declarations``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable

from swapspec.properties.vocabulary import ALL, Deviation


def select(declarations: Iterable[Deviation], *, ids: Iterable[str] = (),
           properties: Iterable[str] = (), clauses: Iterable[str] = ()) -> tuple[Deviation, ...]:
    """The declarations that match every criterion given (each a list of alternatives).

    - ``ids``: declaration IDs, or shell patterns of them (``"torch.fc.partial-tie-*"``);
    - ``properties``: property IDs; a declaration of several properties is kept for the named
      ones only (so reusing it never declares anything on another property);
    - ``clauses``: the clause codes a declaration observes (``"raised"``, ``CRASH``).

    An ID or pattern that matches no declaration, or an unknown property ID, raises
    ``LookupError``: a typo never selects nothing in silence.
    """
    ids, properties, clauses = tuple(ids), tuple(properties), tuple(clauses)
    unknown = sorted(set(properties) - set(ALL))
    if unknown:
        raise LookupError(f"unknown property ID(s) {', '.join(unknown)}")
    declarations = tuple(declarations)
    missing = [i for i in ids if not any(fnmatch.fnmatchcase(d.id, i) for d in declarations)]
    if missing:
        raise LookupError(f"no declaration has the ID {', '.join(map(repr, missing))}; known: "
                          + ", ".join(sorted(d.id for d in declarations if d.id)))
    chosen = []
    for d in declarations:
        if ids and not any(fnmatch.fnmatchcase(d.id, i) for i in ids):
            continue
        if clauses and not set(clauses) & set(d.clauses):
            continue
        if properties:
            named = tuple(p for p in d.property_ids if p in properties)
            if not named:
                continue
            if named != d.property_ids:
                d = dataclasses.replace(d, property_id=named)
        chosen.append(d)
    return tuple(chosen)
