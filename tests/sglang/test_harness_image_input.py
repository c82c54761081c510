"""The test harness's EAGLE3 scenarios run text batches with image input off, as a text-only server does: with it
on, the patch set refuses EAGLE3 on the releases whose draft reads wrong rows for images (``eagle3_image_draft_rows``),
and every check that builds the tiny Kimi-K2.5's EAGLE worker failed there."""

from __future__ import annotations

import pytest

from eagle3_patches.testing.isolation import run_isolated

pytestmark = pytest.mark.sglang


def image_input(target: str, draft: str) -> tuple:
    """``enable_multimodal`` of the harness's EAGLE3 server args for ``target``: by default, and where a scenario
    leaves it to sglang (the image scenario)."""
    from eagle3_patches.testing import sglang_harness as h

    by_default = h.eagle3_server_args(target, draft).enable_multimodal
    return by_default, h.eagle3_server_args(target, draft, enable_multimodal=None).enable_multimodal


def test_eagle3_scenarios_serve_text_unless_one_asks_for_images(tiny):
    target, draft = str(tiny["kimi_k25"]), str(tiny["draft"])
    assert run_isolated(image_input, target, draft) == (False, None)
