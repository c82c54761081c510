"""qwen3_vl_eagle3_capture: the tiny Qwen3-VL (dense and MoE) through the real EAGLE worker gets ``3 x hidden``
into fc."""

from __future__ import annotations

from ..base import Check
from ._shared import wrapper_check

CHECKS: tuple[Check, ...] = (
    Check(
        "qwen3_vl_eagle3_capture",
        "Qwen3-VL dense and MoE (tiny) through the real EAGLE worker: 3 x hidden reaches fc",
        wrapper_check("qwen3_vl_eagle3_capture", ("qwen3_vl", "qwen3_vl_moe")),
        patch="qwen3_vl_eagle3_capture",
        runs_on="<0.5.11",
        outside="sglang 0.5.11 captures on Qwen3-VL itself",
    ),
)
