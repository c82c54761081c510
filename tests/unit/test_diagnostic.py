"""The one shape of a finding: how long lists of names are cut."""

from __future__ import annotations

import pytest

from eagle3_patches.diagnostic import first_few


@pytest.mark.parametrize("n", [0, 1, 3])
def test_first_few_lists_everything_up_to_the_limit(n):
    names = [f"t{i}" for i in range(n)]
    assert first_few(names, 3) == ", ".join(names)


@pytest.mark.parametrize("n", [4, 1000])
def test_first_few_cuts_at_the_limit_and_says_so(n):
    out = first_few((f"t{i}" for i in range(n)), 3, "; ")  # any iterable, in its order
    assert out == "t0; t1; t2 ..."
