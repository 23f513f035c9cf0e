"""mylib's own strategies (a file of this name is common in Hypothesis projects; swapspec's are
``swapspec.strategies``, so the two never clash)."""

from hypothesis import strategies as st
from mylib import Gate

gates = st.integers(0, 3).map(lambda seed: Gate(seed=seed))
flags = st.tuples(st.booleans(), st.booleans())
