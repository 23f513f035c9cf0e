"""A host-side Hypothesis profile for the plugin's own tests: few examples, no shrinking.

Load it with ``-p tests.planted.fast_profile``; without ``--swapspec-profile`` the plugin
leaves it in place. Derandomized, so every run draws the same examples.
"""

from hypothesis import Phase, settings

settings.register_profile(
    "planted-fast", max_examples=15, deadline=None, derandomize=True, database=None,
    phases=[Phase.explicit, Phase.generate],
)
settings.load_profile("planted-fast")
