"""Harness that runs PyTorch's own ``load_state_dict`` tests against ``reference.load_state_dict``.

The upstream files are never committed: ``tests/upstream/run DIR`` runs the copies in ``DIR``
(see docs/load-state-dict.md for the commit and how to get them).
"""
