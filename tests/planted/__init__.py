"""Planted targets for swapspec's own tests: copies of the reference with known bugs."""
