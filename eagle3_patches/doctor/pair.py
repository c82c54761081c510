"""The doctor on a prefill/decode pair: each side judged as one server, then what the two must agree on.

With EAGLE-3 the prefill server runs the target's prefill and the draft's extend, and sends the decode server the
target's KV, the draft's KV and, per request, one metadata row (the first token, the draft's top-k and its last
hidden state) that the decode server turns back into its draft input.  sglang compares only the page size (and from
0.5.23 the KV dtype) across the pair, at the first transfer; every other disagreement serves, at a lower accept
length.  Each check here names both sides.  It reads the two launch commands as operators write them (one per
server; sglang's router is given only their URLs) and the checkpoints they name.

What the two must agree on is declared once, in the ``disaggregation_fingerprint`` patch (its
``SPECULATIVE_FLAGS`` and ``agreed_settings``), which refuses a disagreement at run time on the decode server; here
each side's flags are read as sglang resolves them on the release that side runs (the single-server doctor's
resolvers: ``flag_rules.SpecFlags.served``, ``draft_checks.served_dtype``), and its settings from its launch's
environment (``context.launch_environ``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from packaging.version import Version

from .. import settings
from ..checkpoint.digest import checkpoint_digest
from ..checkpoint.formats import MLA_DRAFT_ARCH, per_head_draft_beside_mla, read_config, target_view
from ..checkpoint.launch_args import LaunchArgs, LaunchArgsError, parse_launch_args
from ..checkpoint.releases import NEWEST_CHECKED, parse_version
from ..diagnostic import ERROR, WARNING
from ..errors import Eagle3ConfigError
from ..patches import get_registry
from ..patches.disaggregation_fingerprint import SPECULATIVE_FLAGS, agreed_settings
from .context import launch_environ
from .draft_checks import served_dtype
from .flag_rules import SPEC_V2, spec_flags
from .report import PairReport, Report
from .run import doctor

SIDES = ("prefill", "decode")


def doctor_pair(
    prefill: LaunchArgs | Sequence[str] | str,
    decode: LaunchArgs | Sequence[str] | str,
    *,
    sglang_version: str | None = None,
    with_patches: bool | None = None,
) -> PairReport:
    """Judge a disaggregated pair from its two launch commands (see the module docstring).

    Raises :class:`~eagle3_patches.checkpoint.launch_args.LaunchArgsError` for a command that cannot be parsed and
    ``ValueError`` for a bad version string, as :func:`~.run.doctor` does; never for a bad checkpoint.
    """
    # pragma: no mutate core/ReplaceTrueWithFalse: two sides, two commands
    la = {side: _parsed(side, cmd) for side, cmd in zip(SIDES, (prefill, decode), strict=True)}
    reports = {
        side: doctor(launch=la[side], sglang_version=sglang_version, with_patches=with_patches) for side in SIDES
    }
    pair = Report()
    _check_pair(pair, la["prefill"], la["decode"], reports)
    # pragma: no mutate eagle3/DeleteCallStatement: a pair has at most three findings of a code (one a speculative
    # flag), never more than a report lists before it summarises
    pair.close()
    return PairReport(prefill=reports["prefill"], decode=reports["decode"], pair=pair)


def _parsed(side: str, cmd: LaunchArgs | Sequence[str] | str) -> LaunchArgs:
    """One side's launch command, parsed; a command that is empty or cannot be parsed is a usage error naming the
    side."""
    if isinstance(cmd, LaunchArgs):
        return cmd
    if not (cmd.strip() if isinstance(cmd, str) else [a for a in cmd if str(a).strip()]):
        raise LaunchArgsError(
            f"the {side} server's launch command is empty",
            where=f"--{side}",
            expected=f"the {side} server's whole launch command",
            fix=f'--{side} "python -m sglang.launch_server --disaggregation-mode {side} ..."',
        )
    try:
        return parse_launch_args(cmd)
    except LaunchArgsError as exc:
        d = exc.diagnostic
        raise LaunchArgsError(
            f"the {side} server's launch command: {d.what}",
            where=f"--{side}",
            found=d.found,
            expected=d.expected,
            fix=d.fix or f"quote the {side} server's command as one argument, each of its own quotes closed",
        ) from None


def _both(field: str, p: object, d: object) -> str:
    return f"prefill {field} {p}; decode {field} {d}"


def _check_pair(out: Report, p: LaunchArgs, d: LaunchArgs, reports: dict[str, Report]) -> None:
    for side, la in (("prefill", p), ("decode", d)):
        if la.disaggregation_mode != side:
            out.add(
                ERROR,
                "pd-mode",
                f"the {side} server's launch does not run it as the {side} side",
                where=f"{side}: --disaggregation-mode",
                found=la.disaggregation_mode if "disaggregation_mode" in la.given else "not given (colocated)",
                expected=side,
                fix=f"add --disaggregation-mode {side} to the {side} server's launch",
            )
    versions = {side: parse_version(str(reports[side].facts["sglang_version"])) for side in SIDES}
    _check_algorithm(out, p, d)
    if p.algorithm is not None and d.algorithm is not None:
        _check_speculative_flags(out, p, d, versions)
        _check_draft(out, p, d)
        _check_draft_kv_split(out, p, d)
    _check_target(out, p, d)
    _check_transfer(out, p, d)
    _check_patches(out, p, d, reports)
    v2 = {side: spec_flags(la, versions[side]) for side, la in (("prefill", p), ("decode", d))}
    if v2["prefill"].spec_v2 != v2["decode"].spec_v2:
        out.add(
            ERROR,
            "pd-spec-v2",
            "one side runs sglang's spec-v2 EAGLE worker and the other the classic one",
            where=f"{SPEC_V2} in the launch environment",
            found=f"prefill: spec v2 {'on' if v2['prefill'].spec_v2 else 'off'} ({v2['prefill'].spec_v2_from}); "
            f"decode: spec v2 {'on' if v2['decode'].spec_v2 else 'off'} ({v2['decode'].spec_v2_from})",
            expected="the same on both sides",
            fix=f"set {SPEC_V2} alike in front of both launches",
        )
    _must_match(
        out,
        WARNING,
        "pd-context-length",
        "--context-length",
        p.context_length,
        d.context_length,
        "the two sides accept different context lengths: a prompt the prefill side takes may be refused or cut on "
        "the decode side",
    )


def _check_algorithm(out: Report, p: LaunchArgs, d: LaunchArgs) -> None:
    if p.algorithm == d.algorithm:
        return
    found = _both("--speculative-algorithm", p.algorithm or "none", d.algorithm or "none")
    if p.algorithm is None:
        out.add(
            ERROR,
            "pd-algorithm",
            "the decode server speculates and the prefill server does not: the decode side reads a zero metadata "
            "row for every request (first token 0, probability 0, a zero draft hidden state) and, with an MLA "
            "target, its draft KV for the prompt is never written; it serves, at a lower accept length",
            where="prefill: --speculative-algorithm",
            found=found,
            expected=f"--speculative-algorithm {d.algorithm} on both sides",
            fix="pass the same speculative flags (algorithm, draft, steps, topk, draft tokens) to both servers",
        )
    elif d.algorithm is None:
        out.add(
            WARNING,
            "pd-algorithm",
            "the prefill server runs the draft and the decode server does not speculate: the draft's work on the "
            "prefill side is thrown away",
            where="decode: --speculative-algorithm",
            found=found,
            expected=f"--speculative-algorithm {p.algorithm} on both sides, or on neither",
            fix="pass the same speculative flags to both servers",
        )
    else:
        out.add(
            ERROR,
            "pd-algorithm",
            "the two sides run different speculative algorithms: the decode side rebuilds its draft input from "
            "what another algorithm wrote",
            where="--speculative-algorithm",
            found=found,
            expected="the same on both sides",
            fix="pass the same speculative flags to both servers",
        )


def _check_speculative_flags(out: Report, p: LaunchArgs, d: LaunchArgs, versions: dict[str, Version]) -> None:
    """The flags of the declaration, each as sglang sets it on that side's release (with topk 1 the draft tokens are
    steps + 1 whatever was given)."""
    flags = {side: spec_flags(la, versions[side]) for side, la in (("prefill", p), ("decode", d))}
    served = {side: f.served() for side, f in flags.items()}
    # with topk 1 on both sides the draft tokens follow from the steps: their difference is the steps' finding
    derived = all(f.topk == 1 and f.num_steps is not None for f in flags.values())
    for field, flag in SPECULATIVE_FLAGS.items():
        pv, dv = served["prefill"][field], served["decode"][field]
        if pv == dv or (derived and field == "speculative_num_draft_tokens"):
            continue
        chosen = None in (pv, dv)  # one side leaves it to sglang, whose choice may or may not be the other's
        shown = ["not given (sglang chooses)" if v is None else f"{v}" for v in (pv, dv)]
        out.add(
            WARNING if chosen else ERROR,
            "pd-speculative-flags",
            f"{flag} differs between the two sides: the draft's top-k the prefill side sends is not the one the "
            "decode side verifies with"
            if field == "speculative_eagle_topk"
            else f"{flag} differs between the two sides (as sglang sets it)",
            where=flag,
            found=f"prefill: {shown[0]}; decode: {shown[1]}",
            expected="the same on both sides",
            fix=f"give both servers the same {flag}",
        )


def _check_draft(out: Report, p: LaunchArgs, d: LaunchArgs) -> None:
    if p.draft_path is None or d.draft_path is None:
        return  # each side's own report says a draft is missing
    # pragma: no mutate eagle3/DropGuard: one path has one digest; the guard spares reading the files twice
    if os.path.abspath(p.draft_path) == os.path.abspath(d.draft_path):
        return
    digests = {}
    for side, path in (("prefill", p.draft_path), ("decode", d.draft_path)):
        try:
            digests[side] = checkpoint_digest(path, "draft")
        except Eagle3ConfigError:
            return  # that side's report names the unreadable draft
    if digests["prefill"] != digests["decode"]:
        out.add(
            ERROR,
            "pd-draft",
            "the two sides serve different drafts: the decode side continues from a hidden state and top-k another "
            "draft produced",
            where="--speculative-draft-model-path",
            found=f"prefill {p.draft_path} (sha256 {digests['prefill'][:16]}); decode {d.draft_path} "
            f"(sha256 {digests['decode'][:16]})",
            expected="the same checkpoint (the same files) on both sides",
            fix="copy one draft checkpoint to both nodes and point both launches at it",
        )


def _check_draft_kv_split(out: Report, p: LaunchArgs, d: LaunchArgs) -> None:
    """An MLA target with an MHA (Llama-class) draft across attention-TP sizes that differ."""
    if p.attention_tp == d.attention_tp or p.model_path is None or p.draft_path is None:
        return
    try:
        split = per_head_draft_beside_mla(p.model_path, p.draft_path)
    except Eagle3ConfigError:
        return  # the prefill side's report names the unreadable checkpoint
    if split:
        out.add(
            ERROR,
            "pd-draft-kv-split",
            "an MLA target with a per-head (Llama-class) draft across different attention-TP sizes: sglang judges "
            "the KV layout from the target's pool and sends the draft's per-head KV unsliced from one prefill rank, "
            "so it arrives misplaced or partial on the decode side (sglang PR #13555: accept length 2.8 -> 2.1; "
            f"the fix, PR #20698, is not in a release up to {NEWEST_CHECKED})",
            where="--tp / --dp-size / --enable-dp-attention",
            found=_both("attention-TP size", p.attention_tp, d.attention_tp),
            expected="the same attention-TP size on both sides, or an MLA draft",
            fix=f"serve an MLA EAGLE-3 draft ({MLA_DRAFT_ARCH}), or give both sides the same attention-TP size "
            "(tp / dp-size under --enable-dp-attention)",
        )


def _check_target(out: Report, p: LaunchArgs, d: LaunchArgs) -> None:
    if p.model_path is None or d.model_path is None:
        return
    # pragma: no mutate eagle3/DropGuard: one path has one config; the guard spares reading it twice
    if os.path.abspath(p.model_path) == os.path.abspath(d.model_path):
        return
    try:
        same = read_config(p.model_path, "target") == read_config(d.model_path, "target")
    except Eagle3ConfigError:
        return
    if not same:
        out.add(
            ERROR,
            "pd-target",
            "the two sides serve targets whose config.json differ",
            where="--model-path",
            found=f"prefill {p.model_path}; decode {d.model_path}",
            expected="the same target on both sides",
            fix="point both launches at copies of one target checkpoint",
        )


def _must_match(out: Report, severity: str, code: str, flag: str, pv: object, dv: object, what: str, fix: str = ""):
    """One finding when the two sides give ``flag`` different values."""
    if pv != dv:
        out.add(
            severity,
            code,
            what,
            where=flag,
            found=_both(flag, pv, dv),
            expected="the same on both sides",
            fix=fix or f"give both servers the same {flag}",
        )


def _check_transfer(out: Report, p: LaunchArgs, d: LaunchArgs) -> None:
    backend = "--disaggregation-transfer-backend"
    _must_match(
        out,
        ERROR,
        "pd-transfer-backend",
        backend,
        p.transfer_backend,
        d.transfer_backend,
        "the two sides use different transfer backends: they cannot exchange KV",
    )
    if p.transfer_backend == "fake":
        out.add(
            ERROR,
            "pd-transfer-backend",
            "a prefill server cannot run the fake transfer backend (sglang refuses it at start; 0.5.9 fails there): "
            "fake is a decode-only test backend that moves no bytes, the decode side starting every request from an "
            "empty KV and a zero metadata row",
            where=f"prefill: {backend}",
            found="fake",
            expected="mooncake, nixl, mori or ascend",
            fix="choose the backend of your interconnect on both sides",
        )
    chosen = "sglang's choice"
    _must_match(
        out,
        WARNING if None in (p.page_size, d.page_size) else ERROR,
        "pd-page-size",
        "--page-size",
        p.page_size or chosen,
        d.page_size or chosen,
        "the two sides' KV page sizes differ: sglang refuses the pair at the first transfer, after both servers have "
        "loaded",
        "give both servers the same --page-size (and --attention-backend, which picks the default)",
    )
    kv = {side: served_kv_cache_dtype(la) for side, la in (("prefill", p), ("decode", d))}
    _must_match(
        out,
        WARNING if AUTO_UNRESOLVED in kv.values() else ERROR,
        "pd-kv-cache-dtype",
        "--kv-cache-dtype",
        kv["prefill"],
        kv["decode"],
        "the two sides' KV cache dtypes differ: the decode side reads the prefill side's KV bytes as another type",
    )


#: ``--kv-cache-dtype auto`` where the doctor cannot tell what sglang makes of it (the target's quantization config
#: may ask for an FP8 KV cache)
AUTO_UNRESOLVED = "auto (the target's quantization config decides)"


def served_kv_cache_dtype(la: LaunchArgs) -> str:
    """The KV cache dtype sglang runs with (``configure_kv_cache_dtype``): ``bf16`` and ``bfloat16`` are one dtype;
    ``auto`` is the model's dtype (``--dtype``, else the target config's, by sglang's auto rule), or
    :data:`AUTO_UNRESOLVED` where the target's quantization config may choose an FP8 KV cache (``modelopt``, ``petit``,
    a ``kv_cache_quant_algo``) or the target cannot be read."""
    value = "bfloat16" if la.kv_cache_dtype == "bf16" else la.kv_cache_dtype
    # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Gt: every other value sglang accepts for
    # --kv-cache-dtype (fp8_e4m3, fp8_e5m2, fp4_e2m1, bfloat16) sorts after "auto"
    if value != "auto":
        return value
    if la.model_path is None:
        return AUTO_UNRESOLVED
    try:
        tv = target_view(read_config(la.model_path, "target"))
    except Eagle3ConfigError:
        return AUTO_UNRESOLVED
    text = tv.config.get("text_config")
    for cfg in (tv.config, text if isinstance(text, dict) else {}):
        q = cfg.get("quantization_config")
        if isinstance(q, dict) and (
            "kv_cache_quant_algo" in q or str(q.get("quant_method", "")).startswith(("modelopt", "petit"))
        ):
            return AUTO_UNRESOLVED
    dtype, _ = served_dtype(tv.dtype, la.dtype)
    return dtype or AUTO_UNRESOLVED


def _check_patches(out: Report, p: LaunchArgs, d: LaunchArgs, reports: dict[str, Report]) -> None:
    patched = {side: reports[side].facts.get("with_patches") for side in SIDES}
    if None not in patched.values() and patched["prefill"] != patched["decode"]:
        without = "prefill" if not patched["prefill"] else "decode"
        out.add(
            ERROR,
            "pd-patches",
            f"only one side runs under eagle3-patches: every fix the {without} side lacks shows on the decode "
            "side as lower acceptance",
            where=f"{without}: the launch command",
            found=f"prefill: {reports['prefill'].facts.get('with_patches_source')}; decode: "
            f"{reports['decode'].facts.get('with_patches_source')}",
            expected="both sides under eagle3-patches",
            fix=f"launch the {without} server with `eagle3-patches run -- ...` (or install eagle3-patches there)",
        )
    if False in patched.values():
        return  # neither, or one side without eagle3-patches (said above): its settings change nothing
    agreed = {side: _agreed(la) for side, la in (("prefill", p), ("decode", d))}
    differs = [k for k in agreed["prefill"] if agreed["prefill"][k] != agreed["decode"][k]]
    if differs:
        out.add(
            ERROR,
            "pd-patch-set",
            "the two sides run different eagle3-patches settings: a different patch set or layer-id convention "
            "changes what the draft is fed on one side only (the decode server refuses its requests)",
            where="the launch environment",
            found="; ".join(_setting_difference(k, agreed["prefill"][k], agreed["decode"][k]) for k in differs),
            expected="the same on both sides",
            fix=f"set {', '.join(settings.BEHAVIOUR)} alike in front of both launches (and the same "
            "`eagle3-patches run --only / --disable`)",
        )


def _agreed(la: LaunchArgs) -> dict[str, object]:
    """What of eagle3-patches one side runs, as the declaration compares it: its launch's settings and the patches
    they select."""
    cfg = settings.read(launch_environ(la))
    return agreed_settings(cfg, (p.name for p in get_registry().patches() if cfg.selects(p.name, p.default_enabled)))


def _setting_difference(key: str, p: object, d: object) -> str:
    # pragma: no mutate core/ReplaceAndWithOr: the patches on are a list on both sides, every other setting on neither
    if isinstance(p, list) and isinstance(d, list):  # the patches on
        only = {side: sorted(set(a) - set(b)) for side, a, b in (("prefill", p, d), ("decode", d, p))}
        return "the patches on: " + "; ".join(f"{side} alone {', '.join(n) or 'none'}" for side, n in only.items())
    return _both(key, p if p not in ("", None) else "unset", d if d not in ("", None) else "unset")
