"""PyTorch's own load_state_dict tests pass against the reference (``tests/upstream/run``).

The upstream files are not in this repository: set ``SWAPSPEC_UPSTREAM_DIR`` to a folder that
holds ``test/nn/test_load_state_dict.py`` (docs/load-state-dict.md says which commit). Without
it the test is skipped with that reason; with it, the run's counts are printed.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.upstream.redirect import EXCLUDED, excluded_reason, reference_load_state_dict

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = os.environ.get("SWAPSPEC_UPSTREAM_DIR", "")
FILE = Path(UPSTREAM) / "test" / "nn" / "test_load_state_dict.py"


@pytest.mark.skipif(not (UPSTREAM and FILE.is_file()),
                    reason="upstream files absent: set SWAPSPEC_UPSTREAM_DIR to a folder holding "
                           "test/nn/test_load_state_dict.py (see docs/load-state-dict.md)")
def test_upstream_load_state_dict_tests_pass_on_the_reference(capsys):
    """Rule: every upstream test not in ``EXCLUDED`` passes, and at least one ran."""
    proc = subprocess.run([str(ROOT / "tests" / "upstream" / "run"), UPSTREAM], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    with capsys.disabled():
        print(f"\nupstream load_state_dict tests on the reference: {summary}")
    counts = dict((kind, int(n)) for n, kind in re.findall(r"(\d+) (\w+)", summary))
    assert proc.returncode == 0 and counts.get("passed", 0) > 0, proc.stdout[-4000:] + proc.stderr


def test_excluded_names_have_reasons():
    """Rule: each exclusion states why, and matches its parametrized names only."""
    assert all(len(why) > 20 for why in EXCLUDED.values())
    assert excluded_reason("test_register_state_dict_pre_hook_backward_compat_swap_True")
    assert excluded_reason("test_load_state_dict_swap_True") is None


def test_redirect_answers_with_the_reference():
    """Rule: the redirect loads through the reference, reading torch's swap flag."""
    import torch
    from torch import nn

    module = nn.Linear(2, 2)
    weight = module.weight
    saved = torch.__future__.get_swap_module_params_on_conversion()
    try:
        torch.__future__.set_swap_module_params_on_conversion(True)
        given = {k: v + 1 for k, v in module.state_dict().items()}
        cdata = weight._cdata
        assert reference_load_state_dict(module, given) == ([], [])
    finally:
        torch.__future__.set_swap_module_params_on_conversion(saved)
    assert module.weight is weight and weight._cdata != cdata
    assert torch.equal(module.weight, given["weight"])
