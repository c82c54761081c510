"""The doctor's entry points: the setup read from the arguments and the launch flags, then every check in order
(the checkpoints', then every patch's preflight rule), each one guarded so that none can stop the others."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence

from packaging.version import Version

from .. import settings
from ..checkpoint.launch_args import ALGORITHMS, LaunchArgs, parse_launch_args
from ..checkpoint.releases import (
    NEWEST_CHECKED,
    OLDEST_KNOWN,
    PINNED,
    ReleaseFacts,
    facts,
    parse_version,
)
from ..checkpoint.safetensors_header import bytes_read
from ..diagnostic import ERROR, INFO, WARNING
from ..patches import get_registry
from ..plugin import loaded_here
from ..preflight import run_rules
from ..sglang_version import installed_sglang_version
from .context import Context, guard, launch_environ
from .draft_checks import (
    check_d2t,
    check_draft_format,
    check_draft_kind,
    check_draft_tensors,
    check_draft_weights,
    check_dtypes,
    load_draft,
)
from .flag_rules import check_flag_rules
from .multimodal_checks import check_image_prefill_graph
from .pairing_checks import (
    check_algorithm,
    check_fc_shape,
    check_layer_ids,
    check_sizes,
)
from .report import Report
from .runtime_checks import check_context, check_expected, check_inherited
from .target_checks import check_target_release, check_target_weights, load_target


def doctor(
    target: os.PathLike | str | None = None,
    draft: os.PathLike | str | None = None,
    *,
    speculative_algorithm: str | None = None,
    tp: int | None = None,
    pp: int | None = None,
    sglang_version: str | None = None,
    launch: LaunchArgs | Sequence[str] | str | None = None,
    with_patches: bool | None = None,
    checkpoint_only: bool = False,
) -> Report:
    """Check a target + draft + launch configuration; never raises for a bad checkpoint.

    ``launch``: sglang launch flags or a whole launch command (list or string), or a
    :class:`LaunchArgs`; explicit arguments win over what it says.  ``with_patches``:
    whether the server runs under eagle3-patches.  None: judged from the launch (wrapped in
    ``eagle3-patches run``, or sglang >= 0.5.11 installed here loads this package as a plugin);
    where neither the launch nor the installed sglang says (bare flags, or none), the report is
    stock sglang's and :attr:`Report.with_patches` holds the verdict with eagle3-patches.
    ``checkpoint_only``: only the checks of the checkpoints themselves (no algorithm, release
    support or launch-flag findings), as the converter runs them on its output.
    Raises ``ValueError`` only for unusable arguments (bad version string, unknown algorithm).
    """
    t0 = time.perf_counter()
    read0 = bytes_read()
    report = Report()
    la, launch_given = _launch(launch)
    version, vsrc = _release(sglang_version)
    rf = facts(version)
    algo, asrc = _algorithm(speculative_algorithm, la, launch_given)
    environ = launch_environ(la)
    patched, patched_why = patch_mode(with_patches, la, launch_given, rf, vsrc, environ)
    ctx = Context(
        report=report,
        version=version,
        rf=rf,
        algorithm=algo,
        launch=la,
        with_patches=bool(patched),
        tp=tp if tp is not None else la.tp,
        pp=pp if pp is not None else la.pp,
        checkpoint_only=checkpoint_only,
        facts=report.facts,
        patches={p.name: p for p in get_registry().patches()},
        settings=settings.read(environ),
    )
    report.facts.update(
        sglang_version=str(version),
        sglang_version_source=vsrc,
        algorithm=algo,
        algorithm_source=asrc,
        with_patches=patched,
        with_patches_source=patched_why,
        tp=ctx.tp,
        pp=ctx.pp,
        launch=la.as_dict() if launch_given else None,
    )
    _note_release(ctx, vsrc)
    # paths: explicit arguments win over the launch command
    target = _pick_path(ctx, "target", target, la.model_path, "--model-path")
    draft = _pick_path(ctx, "draft", draft, la.draft_path, "--speculative-draft-model-path")
    _check_checkpoints(ctx, target, draft)
    if not checkpoint_only:
        _check_launch(ctx)
    if target is None and draft is None:
        report.add(
            ERROR,
            "nothing-to-check",
            "neither a target nor a draft was given",
            fix="pass --target PATH and --draft PATH (or a launch command naming them)",
        )
    if patched is None and not checkpoint_only:
        # not known: the same checks, and the rules as they judge a launch under eagle3-patches
        report.with_patches = report.fork(facts={**report.facts, "with_patches": True})
        pctx = dataclasses.replace(ctx, report=report.with_patches, with_patches=True)
        _rules(pctx)
        report.with_patches.close()
    _rules(ctx)
    report.close()
    report.facts["bytes_read"] = bytes_read() - read0
    report.facts["seconds"] = round(time.perf_counter() - t0, 4)
    return report


def _launch(launch: LaunchArgs | Sequence[str] | str | None) -> tuple[LaunchArgs, bool]:
    """The launch flags, and whether any were given."""
    if launch is None:
        return LaunchArgs(), False
    if isinstance(launch, LaunchArgs):
        return launch, True
    return parse_launch_args(launch), True


def _release(sglang_version: str | None) -> tuple[Version, str]:
    """The sglang release judged, and where it comes from: the argument, the install here, or the pinned one."""
    if sglang_version is not None:
        return parse_version(sglang_version), "--sglang-version"
    installed = installed_sglang_version()
    if installed is not None:
        return installed, "installed"
    return PINNED, "assumed: sglang is not installed here"


def _algorithm(explicit: str | None, la: LaunchArgs, launch_given: bool) -> tuple[str | None, str]:
    """The speculative algorithm judged, and where it comes from; an unknown one is a ``ValueError``."""
    if explicit is not None:
        algo = explicit.strip().upper()
        if algo not in ALGORITHMS:
            raise ValueError(f"unknown speculative algorithm {explicit!r} (sglang knows {', '.join(ALGORITHMS)})")
        return algo, "--speculative-algorithm"
    if la.algorithm:
        return la.algorithm, "launch flags"
    if launch_given:
        return None, "launch flags (none given)"
    return "EAGLE3", "assumed"


def _note_release(ctx: Context, version_source: str) -> None:
    """Say where the release judged is not one the doctor's table was read from, or was assumed."""
    if not ctx.rf.in_table:
        ctx.add(
            INFO,
            "sglang-version-unknown",
            f"sglang {ctx.version} is outside the releases the doctor's table was read from "
            f"({OLDEST_KNOWN}-{NEWEST_CHECKED}); "
            "its rules are extrapolated from the nearest release",
            where=version_source,
        )
    if version_source.startswith("assumed"):
        ctx.add(
            INFO,
            "sglang-version-assumed",
            f"sglang is not installed here; checking against {ctx.version}",
            fix="pass --sglang-version V for the server's release",
        )


def _check_checkpoints(ctx: Context, target, draft) -> None:
    """The checks of the checkpoints themselves and of the two together (what the converter runs on its output)."""
    if target is not None:
        guard(ctx, "target config", lambda c: load_target(c, target))
        if ctx.target is not None:
            guard(ctx, "target weights", check_target_weights)
    if draft is not None:
        guard(ctx, "draft config", lambda c: load_draft(c, draft))
        if ctx.draft is not None:
            guard(ctx, "draft weights", check_draft_weights)
            guard(ctx, "draft format", check_draft_format)
            guard(ctx, "draft kind", check_draft_kind)
            guard(ctx, "draft tensors", check_draft_tensors)
            guard(ctx, "d2t", check_d2t)
            guard(ctx, "dtypes", check_dtypes)
    if ctx.draft is not None and ctx.target is not None:
        guard(ctx, "sizes", check_sizes)
    if ctx.draft is not None:
        guard(ctx, "fc shape", check_fc_shape)
        guard(ctx, "aux layer ids", check_layer_ids)


def _check_launch(ctx: Context) -> None:
    """The checks of the launch: the algorithm, the flags, what the release supports and what the server serves."""
    guard(ctx, "algorithm", check_algorithm)
    guard(ctx, "speculative flags", check_flag_rules)
    if ctx.target is not None:
        guard(ctx, "target release support", check_target_release)
        guard(ctx, "image input and the prefill graph", check_image_prefill_graph)
    if ctx.draft is not None and ctx.target is not None:
        guard(ctx, "context length and RoPE", check_context)
    if ctx.draft is not None:
        guard(ctx, "what the draft inherits", check_inherited)
        guard(ctx, "the expected accept length", check_expected)


def patch_mode(
    explicit: bool | None,
    la: LaunchArgs,
    launch_given: bool,
    rf: ReleaseFacts,
    version_source: str,
    environ: Mapping[str, str] | None = None,
) -> tuple[bool | None, str]:
    """Whether the server runs under eagle3-patches (None: not known), and why; ``environ``: the launch's
    environment (:func:`.context.launch_environ`), which decides whether the installed sglang loads the plugin."""
    if explicit is not None:
        return explicit, "--with-patches" if explicit else "--without-patches"
    if la.with_patches:
        return True, "the launch is wrapped in `eagle3-patches run`"
    if version_source == "installed":
        loaded, why = loaded_here(rf, environ)
        if loaded:
            return True, why
    if launch_given and la.program != "flags":
        return False, f"the launch runs {la.program} without `eagle3-patches run`"
    return None, "not known from bare flags: both verdicts, the exit status stock sglang's"


def _rules(ctx: Context) -> None:
    """The preflight rule of every sglang bug this library knows (each in its patch module)."""
    run_rules(ctx, ctx.report.add_diagnostic, lambda label, fn: guard(ctx, label, lambda c: fn()))


def check_draft(
    draft: os.PathLike | str,
    *,
    target: os.PathLike | str | None = None,
    sglang_version: str | None = None,
    with_patches: bool | None = None,
) -> Report:
    """The doctor's checks of a draft checkpoint (plus the cross-checks with ``target`` when given), for EAGLE3.

    Server-setup findings (release support, launch flags) are left out: see :func:`doctor`.
    """
    return doctor(
        target,
        draft,
        speculative_algorithm="EAGLE3",
        sglang_version=sglang_version,
        with_patches=with_patches,
        checkpoint_only=True,
    )


def _pick_path(ctx: Context, role: str, explicit, from_launch, flag: str):
    if (
        explicit is not None
        and from_launch is not None
        and os.path.abspath(str(explicit)) != os.path.abspath(str(from_launch))
    ):
        ctx.add(
            WARNING,
            "path-differs-from-launch",
            f"the {role} checked is not the one the launch command names",
            where=flag,
            found=str(from_launch),
            expected=str(explicit),
            fix=f"check the {role} the server will load",
        )
    path = explicit if explicit is not None else from_launch
    if path is not None:
        ctx.report.facts[f"{role}_path"] = str(path)
    return path
