"""A tiny image processor for the tiny Kimi-K2.5 (:func:`eagle3_patches.testing.tiny_vl_models.build_kimi_k25_vl`),
written to the public interface sglang's Kimi-K2.5 processor (``multimodal/processors/kimi_k25.py``) calls on the
hub's remote-code processor; no code of the model hub.

The checkpoint carries this file as ``processing_tiny_kimi_k25.py`` and names it in ``processor_config.json``'s
``auto_map``: sglang loads it with ``--trust-remote-code``, as it loads Kimi-K2.5's own.  What sglang calls:

* ``tokenizer``: the checkpoint's tokenizer, whose id ``media_placeholder_token_id`` is ``<|media_pad|>``;
* ``media_processor.media_tokens_calculator({"type": "image", "image": PIL image})``: the image's placeholder count,
  and ``media_processor.media_proc_cfg`` (patch and merge sizes, limits, normalisation), which sglang reads from
  0.5.11;
* ``__call__(text=[prompt], medias=[...], return_tensors="pt", ...)``: ``input_ids`` ``[1, L]``, ``pixel_values``
  ``[patches, 3, 14, 14]`` and ``grid_thws`` ``[images, 3]`` (MoonViT's input: 14-pixel patches, row-major, and
  ``(t, h, w)`` in patches, merged 2 x 2 into one placeholder each).

Images are resized to multiples of 28 pixels (two patches), at most :data:`MAX_SIDE` a side, and normalised to
[-1, 1].  Only the standard library, torch, Pillow and transformers are imported: transformers loads this file as a
module of its own.
"""

from __future__ import annotations

import re

import torch
from transformers import BatchFeature, PreTrainedTokenizerFast

PATCH = 14
MERGE = 2
#: the longest side an image is resized to (small: the vision tower runs on CPU in the tests)
MAX_SIDE = 84
MEDIA_TOKEN = "<|media_pad|>"


def _side(pixels: int) -> int:
    unit = PATCH * MERGE
    return max(unit, min(MAX_SIDE, round(pixels / unit) * unit))


class TinyMediaProcessor:
    #: what sglang's own Kimi-K2.5 wrapper (from 0.5.11) reads of the hub processor's ``media_proc_cfg``
    media_proc_cfg = {
        "patch_size": PATCH,
        "merge_kernel_size": [MERGE, MERGE],
        "in_patch_limit": (MAX_SIDE // PATCH) ** 2,
        "patch_limit_on_one_side": MAX_SIDE // PATCH,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }

    def grid(self, image) -> tuple[int, int, int]:
        """``(t, h, w)`` in patches of the resized image."""
        width, height = image.size
        return 1, _side(height) // PATCH, _side(width) // PATCH

    def media_tokens_calculator(self, media: dict) -> int:
        t, h, w = self.grid(media["image"])
        return t * h * w // (MERGE * MERGE)

    def pixel_values(self, image) -> torch.Tensor:
        t, h, w = self.grid(image)
        resized = image.convert("RGB").resize((w * PATCH, h * PATCH))
        data = torch.tensor(list(resized.getdata()), dtype=torch.float32).view(h * PATCH, w * PATCH, 3)
        data = data / 127.5 - 1.0
        # [h, 14, w, 14, 3] -> [h, w, 3, 14, 14]: one row-major patch after another
        patches = data.view(h, PATCH, w, PATCH, 3).permute(0, 2, 4, 1, 3)
        return patches.reshape(h * w, 3, PATCH, PATCH)


class TinyKimiK25Processor:
    #: no transformers image processor: sglang then prepares nothing itself and calls this class
    image_processor = None

    def __init__(self, tokenizer: PreTrainedTokenizerFast):
        self.tokenizer = tokenizer
        self.media_processor = TinyMediaProcessor()

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoProcessor") -> None:
        """transformers calls it on a checkpoint's own processor class; nothing to register here."""

    @classmethod
    def from_pretrained(cls, path, *args, **kwargs) -> TinyKimiK25Processor:
        return cls(PreTrainedTokenizerFast.from_pretrained(path))

    def _ids(self, text: str) -> list[int]:
        media_id = self.tokenizer.convert_tokens_to_ids(MEDIA_TOKEN)
        ids: list[int] = []
        for part in re.split(f"({re.escape(MEDIA_TOKEN)})", text):
            if part == MEDIA_TOKEN:
                ids.append(media_id)
            elif part.strip():
                ids.extend(self.tokenizer(part, add_special_tokens=False)["input_ids"])
        return ids

    def __call__(self, text=None, medias=None, return_tensors="pt", **kwargs) -> BatchFeature:
        texts = [text] if isinstance(text, str) else list(text or [])
        out: dict = {"input_ids": torch.tensor([self._ids(t) for t in texts], dtype=torch.long)}
        images = [m["image"] for m in medias or [] if m.get("type") == "image"]
        if images:
            out["pixel_values"] = torch.cat([self.media_processor.pixel_values(i) for i in images])
            out["grid_thws"] = torch.tensor([self.media_processor.grid(i) for i in images], dtype=torch.long)
        return BatchFeature(out)
