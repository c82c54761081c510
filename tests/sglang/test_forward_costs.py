"""The CPU demo's breakdown of a speculative cycle (tools/forward_costs.py): each part is timed on
sglang's real v1 EAGLE worker, by its own methods, and every part ran in every decode cycle."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.version import Version
from support.releases import sglang_version

from eagle3_patches.testing.isolation import run_isolated

# the demo's module, beside it in tools/; it stays on the path: run_isolated's child imports the function by its
# module's name
sys.path.append(str(Path(__file__).resolve().parents[2] / "tools"))
import forward_costs  # noqa: E402

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.skipif(sglang_version() > Version("0.5.12"), reason="the v1 EAGLEWorker's methods: sglang <= 0.5.12"),
]


def test_each_part_of_the_cycle_and_a_plain_step_is_timed(tiny):
    parts = run_isolated(forward_costs.measure, str(tiny["kimi_k25"]), str(tiny["draft"]), cycles=2, patches="all")
    assert set(parts) == {*forward_costs.PARTS, "cycle", "plain_decode"}
    assert all(seconds > 0 for seconds in parts.values()), parts
