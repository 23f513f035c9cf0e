"""A host-side Hypothesis profile that only replays saved examples (no generation).

Load it with ``-p tests.planted.replay_only``: a property then fails only on an example its
example database holds, which is how ``tests/test_database.py`` shows a replay.
"""

from hypothesis import Phase, settings

settings.register_profile("planted-replay-only", deadline=None, phases=[Phase.reuse])
settings.load_profile("planted-replay-only")
