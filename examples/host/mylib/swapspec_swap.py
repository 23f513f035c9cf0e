"""``--swapspec-target=mylib.swapspec_swap:target``: ``mylib.swap_call``, a hand-written
functional call with no ties, registered names only and no write-back (``mylib.swap``)."""

from mylib import swap_call
from swapspec.properties.harness.targets import Target


def _swap_call(module, tensors, args=(), kwargs=None):
    return swap_call(module, tensors, *args, **(kwargs or {}))


target = Target("mylib-swap", functional_call=_swap_call, call_forms=("dict",),
                lacks={"tie_weights", "strict"},
                designs={"registered-names-only", "no-write-back"})
