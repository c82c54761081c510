"""eagle3_algorithm_guard

Bug: ``--speculative-algorithm EAGLE`` (or ``NEXTN``) with an EAGLE-3 draft starts fine: the target captures no aux
layers, the draft gets the final normed H-wide state, ``fc`` is skipped.  This was the field's real root cause.
Nothing validates the draft against the algorithm in any release checked (an upstream PR proposing a guard
was closed unmerged).  The other half of the same mistake: ``--speculative-algorithm EAGLE3`` without
``--speculative-draft-model-path`` makes sglang take the target itself as the draft (its MTP default for
DeepSeek-V3-family architectures), load it twice and crash, or serve without an EAGLE-3 draft (sglang issue 36528,
open on the newest release).

What users see: accept length about 1.0 after a 20-minute load; no error.  Without a draft: a target loaded twice
and a crash, or a server that speculates without an EAGLE-3 draft.

What the patch changes: where ``ServerArgs`` resolves the flags (``__post_init__``; ``resolve_once`` from sglang
0.5.23, whose constructor resolves nothing), before sglang fills in its defaults, it refuses EAGLE3 without a draft
with ``Eagle3ConfigError`` naming ``--speculative-draft-model-path`` (and NEXTN, to speculate with a target's own
MTP layers).
With EAGLE or NEXTN and a draft it reads the draft's ``config.json`` and safetensors header (no tensor data): an
architecture naming Eagle3, ``eagle_config.use_aux_hidden_state``, speculators' ``speculators_model_type: eagle3``,
or an ``fc`` whose in-width is 3 or more times hidden (an EAGLE-1/2 draft's ``fc`` takes 2 x hidden, the token's
embedding and one state) marks an EAGLE-3 draft (the doctor judges the draft by the same rule,
``checkpoint/draft_kind.evidence``), and EAGLE/NEXTN with one is refused with ``Eagle3ConfigError`` giving the exact
flag.  ``EAGLE3_PATCHES_UPGRADE_ALGORITHM=1`` upgrades to EAGLE3 with a warning instead.  Under ``eagle3-patches
run`` the launcher prints the message without a traceback.

Releases: 0.5.8 and later.

Upstream probe: none.

Tests: ``tests/patches/test_eagle3_algorithm_guard.py``: real ``ServerArgs`` for the tiny Kimi target: stock
accepts EAGLE with the EAGLE-3 draft (asserted), patched refuses it (and NEXTN) with the flag in the message and
stays silent for EAGLE3, the opt-in upgrade gives EAGLE3, an EAGLE-1 draft still runs with EAGLE; the draft
detection is tested on each kind of evidence and on a target (not a draft).  EAGLE3 without a draft: stock takes the
target itself as the draft, the guard refuses naming ``--speculative-draft-model-path``, NEXTN and the sglang issue,
and the doctor names it only for a launch without a draft.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from .. import settings
from ..checkpoint.draft_kind import eagle3_draft_evidence
from ..diagnostic import ERROR, WARNING, Diagnostic, Diagnostics
from ..errors import Eagle3ConfigError
from ..registry import Patch, Saver, expect_attr
from ..sglang_runtime import server_args_resolution_method

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

logger = logging.getLogger("eagle3_patches")


NO_DRAFT_WHAT = (
    "--speculative-algorithm EAGLE3 without --speculative-draft-model-path: sglang takes the target itself "
    "as the draft (its MTP default), loads it twice and fails, or serves without an EAGLE-3 draft "
    "(sglang issue 36528)"
)
NO_DRAFT_FIX = (
    "pass the EAGLE-3 draft with --speculative-draft-model-path; to speculate with a DeepSeek-V3-family "
    "target's own MTP layers, use --speculative-algorithm NEXTN instead"
)


def check_algorithm(server_args) -> None:
    """Refuse EAGLE3 without a draft, and (or, opted in, upgrade) EAGLE/NEXTN with an EAGLE-3 draft.  Reads the
    flags as the user gave them (before sglang fills in its defaults), and the draft's config + header only."""
    algorithm = (server_args.speculative_algorithm or "").upper()
    draft = server_args.speculative_draft_model_path
    if algorithm == "EAGLE3" and not draft:
        raise Eagle3ConfigError(
            NO_DRAFT_WHAT,
            where="--speculative-algorithm EAGLE3",
            found="no --speculative-draft-model-path",
            expected="--speculative-draft-model-path PATH/TO/EAGLE3-DRAFT",
            fix=NO_DRAFT_FIX,
        )
    if algorithm not in ("EAGLE", "NEXTN") or not draft:
        return
    evidence = eagle3_draft_evidence(draft)
    if evidence is None:
        return
    if settings.current().upgrade_algorithm:
        logger.warning(
            "eagle3-patches: --speculative-algorithm %s with an EAGLE-3 draft (%s); upgraded to EAGLE3 because %s is "
            "set",
            algorithm,
            evidence,
            settings.UPGRADE_ALGORITHM,
        )
        server_args.speculative_algorithm = "EAGLE3"
        return
    raise Eagle3ConfigError(
        f"--speculative-algorithm {algorithm} with an EAGLE-3 draft: the target would capture no aux layers, "
        "the draft's fc would be skipped and the accept length would fall to ~1.0",
        where=f"--speculative-algorithm {server_args.speculative_algorithm} --speculative-draft-model-path {draft}",
        found=f"an EAGLE-3 draft ({evidence})",
        expected="--speculative-algorithm EAGLE3 for an EAGLE-3 draft",
        fix=f"launch with --speculative-algorithm EAGLE3 (or set {settings.UPGRADE_ALGORITHM}=1 to upgrade "
        "automatically)",
    )


def _guarded_post_init(wrapped, instance, args, kwargs):
    check_algorithm(instance)
    return wrapped(*args, **kwargs)


class Eagle3AlgorithmGuard(Patch):
    name = "eagle3_algorithm_guard"
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 70
    summary = (
        "--speculative-algorithm EAGLE with an EAGLE-3 draft, or EAGLE3 without a draft, is refused at start with the"
        " exact flag"
    )
    module = "sglang.srt.server_args"
    applies_to = SpecifierSet(">=0.5.8")
    remedy = "refused"

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        out = Diagnostics()
        launched = setup.facts.get("launch") is not None
        if (
            not setup.checkpoint_only
            and launched
            and setup.algorithm == "EAGLE3"
            and setup.draft is None
            and not setup.launch.draft_path
        ):
            out.add(
                ERROR,
                "algorithm-eagle3-without-draft",
                NO_DRAFT_WHAT,
                where="--speculative-algorithm EAGLE3",
                found="no --speculative-draft-model-path",
                expected="--speculative-draft-model-path PATH/TO/EAGLE3-DRAFT",
                fix=NO_DRAFT_FIX,
            )
        is3, why = setup.draft_is_eagle3()
        if setup.checkpoint_only or setup.algorithm not in ("EAGLE", "NEXTN") or not is3:
            return out
        out.add(
            ERROR,
            "algorithm-eagle-with-eagle3-draft",
            f"--speculative-algorithm {setup.algorithm} with an EAGLE-3 draft ({why}): nothing is captured, the draft "
            "gets the "
            "final normed state, fc is skipped, its lm_head is replaced by the target's, d2t is unused; accept length "
            "~1.0 "
            "and no error",
            where="--speculative-algorithm",
            found=setup.algorithm,
            expected="EAGLE3",
            fix="launch with --speculative-algorithm EAGLE3",
        )
        return out

    def when_patched(self, d: Diagnostic, setup: PatchSetup) -> Diagnostic:
        if setup.settings.upgrade_algorithm:
            return d.replace(
                severity=WARNING,
                what=f"{d.what} ({settings.UPGRADE_ALGORITHM}=1: eagle3-patches upgrades it to EAGLE3 with a warning)",
            )
        return super().when_patched(d, setup)

    def check(self, module: ModuleType) -> None:
        # pragma: no mutate eagle3/DeleteCallStatement: a guard of `check()`: every release the patch applies to
        # passes it (the matrix applies the patch on each), so only a release that fails it tells the mutant apart
        expect_attr(module.ServerArgs, server_args_resolution_method(module.ServerArgs))

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.ServerArgs, server_args_resolution_method(module.ServerArgs), _guarded_post_init)


PATCH = Eagle3AlgorithmGuard()
