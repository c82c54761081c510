"""eagle3_image_draft_rows

Bug: for a request with an image, the EAGLE-3 draft's prefill (the draft extend after the target's prefill) reads
the target's merged input embeddings (``forward_batch.mm_input_embeds``: text rows and the vision tower's rows) in
place of its own token embeddings, from sglang 0.5.10 (the Llama draft; the MLA draft from 0.5.12).  Three faults
of that hand-over were fixed one release at a time, each read from the wheels:

* only the last row of the flattened batch is re-embedded from the sampled token (``input_ids[-1]``): in a batched
  prefill every other sequence's last position keeps the target's row of its own last prompt token, where the draft
  needs the embedding of the token just sampled (sglang PRs #27647, #27846; fixed in 0.5.14);
* the draft's token ids are shifted left by one per sequence and the embeddings are not: every prefix row is the
  target's row one position late, image rows included (sglang PRs #36507 / #37548; fixed in 0.5.20);
* the tensor is the target's own, which its forward may overwrite in place (fused residual-add norms) before the
  draft reads it (sglang issue #35440; 0.5.21 hands the draft a copy).

What users see: nothing: outputs stay right (the target verifies every token) and the accept length of image
requests falls (of batched ones most), with no error and no log line; text-only requests are not touched.

What the patch changes: it refuses the launch.  Once ``ServerArgs`` has resolved the flags (in the launcher, before
any rank starts), ``--speculative-algorithm EAGLE3`` with a target whose multimodal input is on (sglang's own
``ModelConfig.is_multimodal``) is refused with ``Eagle3ConfigError`` naming the faults of the installed release and
the release that has all three fixed.  No backport is small and sure: the shift and the copy are in the EAGLE
worker and in the target's embedding routine, which differ in every release of the range.  A target served text
only (``enable_multimodal`` off) is not refused; neither is a text-only target.

Releases: 0.5.10 - 0.5.20 (read: ``models/llama_eagle3.py``, ``models/kimi_k25_eagle3.py``,
``speculative/eagle_worker_v2.py`` and ``managers/mm_utils.py`` of every release from 0.5.9 to the newest checked;
0.5.9's draft embeds its own shifted token ids, each sequence's last row the sampled token and the image positions
the vocabulary's last row, as the target's ``embed_mm_inputs`` clamped them in place).

Upstream probe: sglang's own source beside ``server_args.py``: the per-sequence last rows in
``models/llama_eagle3.py``, the shifted rows (``rotated_mm``) in ``speculative/eagle_worker_v2.py`` and the copy in
``managers/mm_utils.py`` all present means ``upstream``.

Tests: ``tests/patches/test_eagle3_image_draft_rows.py``: the check on sglang's real ``ServerArgs`` and
``ModelConfig`` for the tiny Kimi-K2.5 (multimodal on: refused, naming the faults of the release and the fixing
release; served text only, a text-only target, another algorithm: silent); the faults named per release; the
upstream probe on each layout, and on the installed release's own source; the doctor's ``eagle3-image-draft-rows``
(stock: a warning; patched: refused at start; silent on 0.5.9 and from 0.5.21, and for a text-only target).
``tests/e2e/test_image_requests.py`` (0.5.9 and the newest release: images through the real server).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..checkpoint.releases import (
    MM_DRAFT_EMBEDS_COPIED_FROM,
    MM_DRAFT_EMBEDS_FROM,
    MM_DRAFT_LAST_ROWS_FROM,
    MM_DRAFT_ROWS_SHIFTED_FROM,
    parse_version,
)
from ..diagnostic import ERROR, WARNING, Diagnostic, Diagnostics
from ..errors import Eagle3ConfigError
from ..sglang_version import base_release, installed_sglang_version
from . import LauncherCheck

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

NAME = "eagle3_image_draft_rows"
ALGORITHM = "EAGLE3"
#: architectures whose multimodal input sglang leaves off unless ``--enable-multimodal`` is given
#: (``configs/model_config.py``'s ``mm_disabled_models``, 0.5.9 - 0.5.20)
MULTIMODAL_OFF_BY_DEFAULT = (
    "Gemma3ForConditionalGeneration",
    "Llama4ForConditionalGeneration",
    "Step3VLForConditionalGeneration",
    "InklingForConditionalGeneration",
)
#: where sglang has each fix: (file beside server_args.py, what it contains)
UPSTREAM_MARKERS = (
    ("models/llama_eagle3.py", "forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1"),
    ("speculative/eagle_worker_v2.py", "rotated_mm"),
    ("managers/mm_utils.py", "input_embeds.clone()"),
)
WHAT = (
    "EAGLE3 with image input on sglang {version}: the draft's prefill reads wrong rows for image requests ({faults}), "
    "so image requests are accepted less often (outputs stay right), with nothing logged"
)
EXPECTED = f"the draft fed each position's own row (sglang >= {MM_DRAFT_EMBEDS_COPIED_FROM})"
FIX = (
    f"upgrade to sglang >= {MM_DRAFT_EMBEDS_COPIED_FROM}; a server that gets no image requests (sglang's command "
    f"line cannot turn image input off), or one that serves images with these faults anyway: set "
    f"EAGLE3_PATCHES_DISABLE={NAME}"
)


def faults(version: str | Version) -> list[str]:
    """The faults of the draft's multimodal prefill on ``version`` (empty where there are none)."""
    v = base_release(parse_version(version))
    if v < MM_DRAFT_EMBEDS_FROM:
        return []
    out = []
    if v < MM_DRAFT_LAST_ROWS_FROM:
        out.append("in a batch only the last sequence's last row is the sampled token's embedding")
    if v < MM_DRAFT_ROWS_SHIFTED_FROM:
        out.append("every prefix row is the target's row one position late")
    if v < MM_DRAFT_EMBEDS_COPIED_FROM:
        out.append("the rows are the target's own tensor, which its forward may overwrite in place first")
    return out


def _multimodal_on(server_args: Any) -> bool:
    """sglang's own verdict: its ``ModelConfig`` of the target (the one the launcher builds) says multimodal."""
    get = getattr(server_args, "get_model_config", None)
    try:
        if callable(get):
            config = get()
        else:
            from sglang.srt.configs.model_config import ModelConfig

            config = ModelConfig.from_server_args(server_args)
    except Exception:  # noqa: BLE001 - a config sglang cannot read is sglang's own error to report
        return False
    return bool(getattr(config, "is_multimodal", False))


def check_image_rows(server_args: Any) -> None:
    """Refuse EAGLE3 with image input on a release whose draft prefill reads wrong rows for image requests."""
    algorithm = str(server_args.speculative_algorithm or "").upper()
    if algorithm != ALGORITHM or not _multimodal_on(server_args):
        return
    version = installed_sglang_version()
    found = faults(version) if version is not None else []
    if not found:
        return
    raise Eagle3ConfigError(
        WHAT.format(version=version, faults="; ".join(found)),
        where=f"--model-path {server_args.model_path} (multimodal input on) with --speculative-algorithm EAGLE3",
        found=f"sglang {version}: {len(found)} of the 3 faults of the draft's multimodal prefill",
        expected=EXPECTED,
        fix=FIX,
    )


def reads_target_rows(sglang_srt: Path) -> bool:
    """Whether the Llama EAGLE-3 draft of the sglang source tree at ``sglang_srt`` reads the target's merged input
    embeddings (from :data:`MM_DRAFT_EMBEDS_FROM`; before, it embeds its own token ids)."""
    try:
        return "forward_batch.mm_input_embeds" in (sglang_srt / "models/llama_eagle3.py").read_text(encoding="utf-8")
    except OSError:
        return False


def fixed_upstream(sglang_srt: Path) -> bool:
    """Whether the sglang source tree at ``sglang_srt`` (the ``srt`` directory) has all three fixes."""
    for relative, marker in UPSTREAM_MARKERS:
        try:
            if marker not in (sglang_srt / relative).read_text(encoding="utf-8"):
                return False
        except OSError:
            return False
    return True


def image_input_on(setup: PatchSetup) -> bool:
    """The doctor's view: the target has a vision tower (``vision_config``) and sglang serves it with images (every
    such architecture but :data:`MULTIMODAL_OFF_BY_DEFAULT`, which ``--enable-multimodal`` turns on)."""
    target = setup.target
    if target is None or not isinstance(target.config.get("vision_config"), dict):
        return False
    return target.arch not in MULTIMODAL_OFF_BY_DEFAULT or setup.launch.enable_multimodal


class Eagle3ImageDraftRows(LauncherCheck):
    name = NAME
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 76
    summary = (
        "EAGLE3 with image input, on releases whose draft prefill reads wrong rows for images, is refused at start"
    )
    applies_to = SpecifierSet(f">={MM_DRAFT_EMBEDS_FROM},<{MM_DRAFT_EMBEDS_COPIED_FROM}")

    launcher_check = staticmethod(check_image_rows)

    def upstream(self, module: ModuleType) -> str | None:
        srt = Path(module.__file__ or "").parent
        return "sglang feeds the draft each position's own row for image requests" if fixed_upstream(srt) else None

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        out = Diagnostics()
        if setup.checkpoint_only or setup.algorithm != ALGORITHM or not image_input_on(setup):
            return out
        found = faults(setup.version) if self.covers(setup.version) else []
        if not found:
            return out
        out.add(
            WARNING,
            "eagle3-image-draft-rows",
            WHAT.format(version=base_release(setup.version), faults="; ".join(found)),
            where=f"the target's vision_config ({setup.target_view.arch}) with --speculative-algorithm EAGLE3",
            found=f"sglang {base_release(setup.version)}: {len(found)} of the 3 faults of the draft's multimodal "
            "prefill",
            expected=EXPECTED,
            fix=FIX,
        )
        return out

    def when_patched(self, d: Diagnostic, setup: PatchSetup) -> Diagnostic:
        # stock serves (a warning: the outputs stay right); under the patch the launch stops, which is an error
        return super().when_patched(d, setup).replace(severity=ERROR)


PATCH = Eagle3ImageDraftRows()
