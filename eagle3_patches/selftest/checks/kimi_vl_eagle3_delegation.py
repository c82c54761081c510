"""kimi_vl_eagle3_delegation: the tiny Kimi-VL through the real EAGLE worker gets ``[tokens, 3 x hidden]`` into fc."""

from __future__ import annotations

from ..base import Check
from ._shared import wrapper_check

CHECKS: tuple[Check, ...] = (
    Check(
        "kimi_vl_eagle3_delegation",
        "Kimi-VL (tiny) through the real EAGLE worker: [tokens, 3 x hidden] reaches fc",
        wrapper_check("kimi_vl_eagle3_delegation", ("kimi_vl",)),
        patch="kimi_vl_eagle3_delegation",
    ),
)
