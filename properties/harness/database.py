"""The shared example database (``--swapspec-database``) and the per-target database keys of
swapspec's property tests; a host's other tests are left alone."""

from __future__ import annotations

import pytest
from hypothesis import settings

from swapspec.properties.harness.marking import is_property_test
from swapspec.properties.harness.settings import _option


def _shared_database(config: pytest.Config):
    """The example database ``--swapspec-database`` / ``SWAPSPEC_DATABASE`` names (one per
    run), or None."""
    path = _option(config, "--swapspec-database", "SWAPSPEC_DATABASE")
    if path is None:
        return None
    if not hasattr(config, "swapspec_database"):
        config.swapspec_database = example_database(path)
    return config.swapspec_database


def example_database(location: str):
    """``DirectoryBasedExampleDatabase(location)``, or for ``redis://host:port/db`` a
    ``RedisExampleDatabase`` on that server (needs ``hypothesis[redis]``)."""
    if location.startswith(("redis://", "rediss://")):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase

        return RedisExampleDatabase(redis.Redis.from_url(location))
    from hypothesis.database import DirectoryBasedExampleDatabase

    return DirectoryBasedExampleDatabase(location)


def _key_per_target(item: pytest.Item) -> None:
    """Give each property x target its own example-database key, derived from the test id (as
    Hypothesis does for ``@pytest.mark.parametrize`` and HypoFuzz for every test it fuzzes), so
    a target's saved examples replay on that target only, and a failure a HypoFuzz campaign
    saved replays in pytest. Under a derandomized profile every target still gets the same
    examples: the seed stays the property's own (its digest without the test id)."""
    wrapped = getattr(item.obj, "__func__", item.obj)
    inner = getattr(getattr(wrapped, "hypothesis", None), "inner_test", None)
    if inner is None or not is_property_test(item):
        return
    from hypothesis.internal.compat import int_from_bytes
    from hypothesis.internal.reflection import function_digest

    inner.__dict__.pop("_hypothesis_internal_add_digest", None)
    shared = int_from_bytes(function_digest(inner))
    inner._hypothesis_internal_add_digest = item.nodeid.encode()
    current = getattr(wrapped, "_hypothesis_internal_use_settings", None)
    wrapped._hypothesis_internal_use_seed = shared if current is not None and current.derandomize \
        else None


def _use_shared_database(item: pytest.Item) -> None:
    """Point a property's Hypothesis settings at the shared example database, if one is named.

    Only swapspec's property tests are touched, and only their ``database``: the host's
    profile (examples, phases, deadline) and its other tests stay as they are.
    """
    database = _shared_database(item.config)
    if database is None or not is_property_test(item):
        return
    test = getattr(item.obj, "__func__", item.obj)
    current = getattr(test, "_hypothesis_internal_use_settings", None)
    if current is not None and current.database is not database:
        test._hypothesis_internal_use_settings = settings(current, database=database)
