"""The plugin's settings: the Hypothesis profiles it registers (``--swapspec-profile``), and how an
option is read (command line, then environment variable, then ini file)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

PROFILES = {
    "swapspec-dev": settings(max_examples=25, deadline=None),
    "swapspec-ci": settings(max_examples=40, deadline=None, derandomize=True, database=None,
                            print_blob=True, suppress_health_check=[HealthCheck.too_slow]),
    "swapspec-thorough": settings(max_examples=400, deadline=None,
                                  phases=list(Phase)),
    # Mutation testing asks only "does any example fail?": no shrinking, no replay of
    # examples a previous mutant saved, the same examples for every mutant.
    "swapspec-mutation": settings(max_examples=25, deadline=None, derandomize=True,
                                  database=None, phases=[Phase.explicit, Phase.generate],
                                  suppress_health_check=[HealthCheck.too_slow]),
}


for _name, _profile in PROFILES.items():
    settings.register_profile(_name, _profile)


def _option(config: pytest.Config, name: str, env: str) -> str | None:
    return config.getoption(name) or os.environ.get(env) or None


def _target_spec(config: pytest.Config) -> str | None:
    return _option(config, "--swapspec-target", "SWAPSPEC_TARGET") or config.getini(
        "swapspec_target") or None


NO_TARGET = ("swapspec: no target chosen. Name the implementation under test with "
             "--swapspec-target=pkg.mod[:attr] (or SWAPSPEC_TARGET, or swapspec_target in the "
             "ini file); --swapspec-target=all runs the built-in targets")
