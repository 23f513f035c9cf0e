"""swapspec's properties: one rule per test, the pytest plugin, targets and deviations.

Run them with ``pytest --pyargs swapspec.properties --swapspec-target=...``.
"""
