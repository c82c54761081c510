"""Tiny EAGLE-3 drafts in the quantized layouts sglang serves, for the strict loader's tests.

Each builder takes the tiny draft's tensors (:func:`.tiny_models.eagle3_draft_tensors`) and
writes them the way the quantization's own tools lay them out on disk, with the
``quantization_config`` sglang reads from ``config.json``:

* ``fp8``: sglang's ``Fp8Config`` checkpoint (``quant_method: fp8``, static activations, per-tensor
  scales): ``weight`` in ``float8_e4m3fn``, ``weight_scale`` and ``input_scale`` per projection;
* ``compressed-tensors`` W8A8-FP8 (``float-quantized``, per-channel weight scales);
* ``compressed-tensors`` W4A16 (``pack-quantized``, group 32: Kimi-K2.5's own format):
  ``weight_packed`` int32 (eight 4-bit values a word), ``weight_scale`` per group, ``weight_shape``.

Only the decoder layer's projections are quantized (``fc``, the norms and the heads stay as they
are, as the quantizers leave them: sglang builds ``fc`` as a plain ``nn.Linear``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from . import tiny_models as tm

_PROJ = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.weight$")
GROUP = 32


def _projections(tensors: dict) -> list[str]:
    return [n for n in tensors if _PROJ.search(n)]


def fp8_tensors(tensors: dict) -> dict:
    import torch

    out = dict(tensors)
    for name in _projections(tensors):
        w = tensors[name].float()
        scale = w.abs().max() / torch.finfo(torch.float8_e4m3fn).max
        base = name.removesuffix(".weight")
        out[name] = (w / scale).to(torch.float8_e4m3fn)
        out[f"{base}.weight_scale"] = scale.reshape(()).float()
        out[f"{base}.input_scale"] = torch.tensor(0.02, dtype=torch.float32)
    return out


def w8a8_fp8_tensors(tensors: dict) -> dict:
    import torch

    out = dict(tensors)
    for name in _projections(tensors):
        w = tensors[name].float()
        scale = w.abs().amax(dim=1, keepdim=True) / torch.finfo(torch.float8_e4m3fn).max
        out[name] = (w / scale).to(torch.float8_e4m3fn)
        out[name.removesuffix(".weight") + ".weight_scale"] = scale.float()
    return out


def w4a16_tensors(tensors: dict) -> dict:
    import torch

    out = dict(tensors)
    for name in _projections(tensors):
        w = out.pop(name).float()
        rows, cols = w.shape
        groups = w.reshape(rows, cols // GROUP, GROUP)
        scale = groups.abs().amax(dim=-1) / 7
        q = torch.clamp(torch.round(groups / scale.unsqueeze(-1)), -8, 7).to(torch.int32).reshape(rows, cols) + 8
        packed = torch.zeros(rows, cols // 8, dtype=torch.int32)
        for i in range(8):
            packed |= q[:, i::8] << (4 * i)
        base = name.removesuffix(".weight")
        out[f"{base}.weight_packed"] = packed
        out[f"{base}.weight_scale"] = scale.to(torch.bfloat16)
        out[f"{base}.weight_shape"] = torch.tensor([rows, cols], dtype=torch.int64)
    return out


def _compressed_tensors_config(fmt: str, weights: dict, input_activations: dict | None) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": dict(
                    {"symmetric": True, "dynamic": False, "actorder": None, "observer": "minmax"}, **weights
                ),
                "input_activations": input_activations,
                "output_activations": None,
                "format": fmt,
            }
        },
        "ignore": ["lm_head", "fc"],
        "kv_cache_scheme": None,
    }


QUANT_CONFIGS = {
    "fp8": {"quant_method": "fp8", "activation_scheme": "static"},
    "w8a8-fp8": _compressed_tensors_config(
        "float-quantized",
        {"num_bits": 8, "type": "float", "strategy": "channel"},
        {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True},
    ),
    "w4a16": _compressed_tensors_config(
        "pack-quantized",
        {"num_bits": 4, "type": "int", "strategy": "group", "group_size": GROUP},
        None,
    ),
}
QUANT_TENSORS = {"fp8": fp8_tensors, "w8a8-fp8": w8a8_fp8_tensors, "w4a16": w4a16_tensors}


def build_quantized_draft(
    path: os.PathLike, kind: str, spec: tm.TinyDraftSpec = tm.TinyDraftSpec(), tensors: dict | None = None
) -> Path:
    """The tiny draft quantized as ``kind`` (a key of :data:`QUANT_CONFIGS`); ``tensors``: already quantized."""
    config = tm.eagle3_draft_config(spec)
    config["quantization_config"] = QUANT_CONFIGS[kind]
    if tensors is None:
        tensors = QUANT_TENSORS[kind](tm.eagle3_draft_tensors(spec))
    return tm.write_checkpoint(Path(path), config, tensors, spec.vocab)
