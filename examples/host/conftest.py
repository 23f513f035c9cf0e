"""mylib's own test settings: a small derandomized Hypothesis profile for every test run here,
swapspec's properties included (swapspec loads a profile only when asked)."""

from hypothesis import Phase, settings

settings.register_profile("mylib-ci", max_examples=10, deadline=None, derandomize=True,
                          database=None, phases=[Phase.explicit, Phase.generate])
settings.load_profile("mylib-ci")
