"""swapspec's own tests: every test runs with torch's and the reference's global state isolated.

The plugin itself comes in through its ``pytest11`` entry point (``pip install -e .``).
"""

from collections.abc import Iterator

import pytest

from swapspec.properties.harness.isolation import isolated_global_state
from swapspec.properties.harness.marking import is_property_test


@pytest.fixture(autouse=True)
def swapspec_own_test_isolation(request: pytest.FixtureRequest) -> Iterator[None]:
    """The plugin isolates property tests; this isolates the project's other tests too."""
    if is_property_test(request.node):
        yield
        return
    with isolated_global_state():
        yield
