"""The EAGLE-3 patch set, in the order they apply (the fork-path series uses the same order)."""

from __future__ import annotations

from ..registry import Registry

#: module names under eagle3_patches.patches, in application order
PATCH_MODULES = [
    "kimi_k25_eagle3_delegation",
    "aux_capture_validation",
    "cuda_graph_capture_order",
    "tp_allreduce_fusion_capture",
    "eagle3_draft_strict_loading",
    "eagle3_fc_guard",
    "eagle3_algorithm_guard",
    "eagle3_target_capability",
    "hidden_state_dump",
    "layer_id_convention",
    "eagle3_probe",
]


def build_registry() -> Registry:
    import importlib

    patches = [importlib.import_module(f"{__name__}.{m}").PATCH for m in PATCH_MODULES]
    return Registry("eagle3", patches)
