"""Launch-flag combinations that sglang silently overrides, degrades, or refuses at start, per release.

Each :class:`FlagRule` is one such combination of the speculative flags (``--speculative-num-steps``,
``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``, ``--disable-overlap-schedule``, the
``SGLANG_ENABLE_SPEC_V2`` environment variable), the sglang releases where it holds (a ``SpecifierSet``), the sglang
source it was read from, and what later releases do instead.  The doctor runs the rules whose releases hold the one
it judges (:func:`check_flag_rules`); docs/doctor.md's table of them is generated from :data:`RULES`
(``tools/gen_docs.py``).  A rule judges only the flags the launch gives: where sglang would choose a value itself, it
stays silent.

What the releases do, read from their ``sglang/srt/server_args.py`` (``ServerArgs._handle_speculative_decoding``,
0.5.9 - 0.5.12) and ``sglang/srt/arg_groups/speculative_hook.py`` (``_handle_eagle_family``, 0.5.13 and later), the
draft tree from ``sglang/srt/speculative/spec_utils.py`` (``select_top_k_tokens``) and ``eagle_utils.py``
(``organize_draft_results``), and the variable's default from ``sglang/srt/environ.py``
(``SGLANG_ENABLE_SPEC_V2``):

* with ``topk == 1``, ``num_draft_tokens`` is set to ``num_steps + 1`` whatever was given (a log warning only);
* the draft tree holds ``topk + (num_steps - 1) * topk**2`` candidates and the verifier takes the best
  ``num_draft_tokens - 1`` of them with ``torch.topk``, in the draft's forward that the CUDA graphs capture: asking
  for more fails after the model has loaded, and no release checks it at start;
* before 0.5.11 spec v2 (the overlap scheduler for EAGLE) is off unless ``SGLANG_ENABLE_SPEC_V2`` is true, and when
  it is, ``disable_overlap_schedule`` is set to False (the flag ignored) and ``topk > 1`` is refused;
* 0.5.11 and 0.5.12 turn spec v2 on by default and fall back to the spec v1 worker, without the overlap scheduler,
  for ``topk > 1``; from 0.5.13 there is only the v2 worker and ``topk`` no longer decides the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..checkpoint.launch_args import LaunchArgs
from ..checkpoint.releases import NEWEST_CHECKED, SPEC_V2, env_bool, spec_v2_on
from ..diagnostic import ERROR, INFO, WARNING
from ..sglang_version import base_release
from .context import Context, launch_environ

#: the algorithms whose flags sglang resolves as below (``NEXTN`` becomes ``EAGLE``)
EAGLE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")


@dataclass(frozen=True)
class SpecFlags:
    """The speculative flags a launch gives, and whether spec v2 is on for the release judged."""

    num_steps: int | None
    topk: int | None
    draft_tokens: int | None
    disable_overlap: bool
    spec_v2: bool
    spec_v2_from: str  # where the spec v2 setting comes from

    @property
    def tree_size(self) -> int | None:
        """The candidates the draft tree holds (``select_top_k_tokens``: topk at the first step, then topk**2 per
        step); None where the launch leaves steps or topk to sglang."""
        if self.num_steps is None or self.topk is None or self.num_steps < 1 or self.topk < 1:
            return None
        return self.topk + (self.num_steps - 1) * self.topk**2

    @property
    def served_draft_tokens(self) -> int | None:
        """``--speculative-num-draft-tokens`` as sglang sets it: steps + 1 with topk 1, whatever was given; else as
        given (None: left to sglang)."""
        if self.topk == 1 and self.num_steps is not None:
            return self.num_steps + 1
        return self.draft_tokens

    def served(self) -> dict[str, int | None]:
        """The speculative ``ServerArgs`` fields the server runs with, as sglang resolves these flags (None: left to
        sglang's own choice, which depends on the model)."""
        return {
            "speculative_eagle_topk": self.topk,
            "speculative_num_steps": self.num_steps,
            "speculative_num_draft_tokens": self.served_draft_tokens,
        }


def spec_flags(la: LaunchArgs, version: Version) -> SpecFlags:
    """Read :class:`SpecFlags` from the launch: :data:`SPEC_V2` from the launch's environment
    (:func:`.context.launch_environ`: the command's own assignments, else the environment it inherits), else the
    release's default."""
    value = launch_environ(la).get(SPEC_V2)
    where = "the launch command" if SPEC_V2 in la.env else "the environment"
    on = spec_v2_on(value, version)
    if value is not None and env_bool(value) is not None:
        source = f"{SPEC_V2}={value[:20]} in {where}"
    else:
        unset = "unset" if value is None else f"{value[:20]!r} in {where} is not a boolean sglang reads"
        source = f"sglang {base_release(version)}'s default ({SPEC_V2} {unset})"
    return SpecFlags(la.num_steps, la.eagle_topk, la.num_draft_tokens, la.disable_overlap_schedule, on, source)


@dataclass(frozen=True)
class Finding:
    what: str
    found: str
    expected: str
    fix: str


@dataclass(frozen=True)
class FlagRule:
    code: str
    severity: str
    #: the releases where sglang does what :attr:`outcome` says
    releases: SpecifierSet
    #: the flags that make it (docs/doctor.md)
    when: str
    #: what sglang does with them
    outcome: str
    #: what the releases after :attr:`releases` do with the same flags
    later: str
    #: the sglang source it was read from: file, function, releases
    source: str
    #: the flag (or variable) that fixes it: where the finding points
    flag: str
    judge: Callable[[SpecFlags], Finding | None]

    def applies(self, version: Version) -> bool:
        return base_release(version) in self.releases


def _draft_tokens_overridden(f: SpecFlags) -> Finding | None:
    chain = f.served_draft_tokens
    if f.draft_tokens is None or chain is None or chain == f.draft_tokens:
        return None
    return Finding(
        what=f"with --speculative-eagle-topk 1 sglang sets --speculative-num-draft-tokens to steps + 1 = {chain} "
        f"(a log warning only): the server verifies {chain} tokens per step, not the {f.draft_tokens} asked for",
        found=f"--speculative-num-steps {f.num_steps} --speculative-eagle-topk 1 "
        f"--speculative-num-draft-tokens {f.draft_tokens}",
        expected=f"--speculative-num-draft-tokens {chain} (steps + 1) with topk 1",
        fix=f"pass --speculative-num-draft-tokens {chain}, or --speculative-eagle-topk 2 or more for a tree of "
        f"{f.draft_tokens} tokens",
    )


def _draft_tokens_exceed_tree(f: SpecFlags) -> Finding | None:
    tree = f.tree_size
    if tree is None or f.topk is None or f.topk < 2 or f.draft_tokens is None or f.draft_tokens - 1 <= tree:
        return None
    return Finding(
        what=f"the draft tree holds {tree} candidates (topk + (steps - 1) x topk^2) and sglang picks the best "
        f"num_draft_tokens - 1 = {f.draft_tokens - 1} of them with torch.topk: the server fails after the model has "
        "loaded, when it captures the draft's CUDA graphs (or at the first decode without them); no release checks "
        "it at start",
        found=f"--speculative-num-steps {f.num_steps} --speculative-eagle-topk {f.topk} "
        f"--speculative-num-draft-tokens {f.draft_tokens}",
        expected=f"--speculative-num-draft-tokens at most {tree + 1}",
        fix=f"pass --speculative-num-draft-tokens {tree + 1} or less, or raise --speculative-num-steps / "
        "--speculative-eagle-topk",
    )


def _spec_v2_topk(f: SpecFlags) -> Finding | None:
    if not f.spec_v2 or f.topk is None or f.topk < 2:
        return None
    return Finding(
        what="sglang refuses to start: spec v2 (the overlap scheduler for EAGLE) takes --speculative-eagle-topk 1 "
        'only ("Spec v2 currently only supports topk = 1")',
        found=f"{f.spec_v2_from}, --speculative-eagle-topk {f.topk}",
        expected=f"--speculative-eagle-topk 1 with spec v2, or {SPEC_V2} unset",
        fix=f"unset {SPEC_V2} (the spec v1 worker runs a tree, without the overlap scheduler), or pass "
        "--speculative-eagle-topk 1",
    )


def _overlap_forced_on(f: SpecFlags) -> Finding | None:
    if not f.spec_v2 or not f.disable_overlap or (f.topk is not None and f.topk > 1):
        return None
    return Finding(
        what="--disable-overlap-schedule is ignored: with spec v2 sglang turns the overlap scheduler back on for "
        "EAGLE (a log warning only)",
        found=f"{f.spec_v2_from}, --disable-overlap-schedule",
        expected="the overlap scheduler off, as asked",
        fix=f"unset {SPEC_V2} to run without the overlap scheduler (the spec v1 worker), or drop "
        "--disable-overlap-schedule; sglang >= 0.5.11 keeps it",
    )


def _spec_v1_fallback(f: SpecFlags) -> Finding | None:
    if not f.spec_v2 or f.disable_overlap or f.topk is None or f.topk < 2:
        return None
    return Finding(
        what=f"with --speculative-eagle-topk {f.topk} sglang runs the spec v1 worker and turns the overlap "
        "scheduler off (a log warning only): spec v2 takes topk 1 only on this release",
        found=f"--speculative-eagle-topk {f.topk}, {f.spec_v2_from}",
        expected="the overlap scheduler on (spec v2)",
        fix="pass --speculative-eagle-topk 1 to keep the overlap scheduler; sglang >= 0.5.13 keeps it with a tree",
    )


_SERVER_ARGS = "srt/server_args.py ServerArgs._handle_speculative_decoding"
_HOOK = "srt/arg_groups/speculative_hook.py _handle_eagle_family"

#: every rule, in the order the doctor runs them
RULES: tuple[FlagRule, ...] = (
    FlagRule(
        code="spec-v2-topk-refused",
        flag="--speculative-eagle-topk",
        severity=ERROR,
        releases=SpecifierSet(">=0.5.9,<0.5.11"),
        when=f"`{SPEC_V2}` true with `--speculative-eagle-topk` > 1",
        outcome="refused at start (`ValueError`)",
        later="0.5.11 - 0.5.12 fall back to spec v1 (`spec-v1-fallback`); from 0.5.13 the v2 worker takes topk > 1",
        source=f"{_SERVER_ARGS} (0.5.9, 0.5.10)",
        judge=_spec_v2_topk,
    ),
    FlagRule(
        code="spec-overlap-forced-on",
        flag="SGLANG_ENABLE_SPEC_V2",
        severity=WARNING,
        releases=SpecifierSet(">=0.5.9,<0.5.11"),
        when=f"`{SPEC_V2}` true with `--disable-overlap-schedule`",
        outcome="the flag ignored: the overlap scheduler on, a log warning only",
        later="from 0.5.11 the flag is kept (spec v1 in 0.5.11 - 0.5.12, the v2 worker without overlap from 0.5.13)",
        source=f"{_SERVER_ARGS} (0.5.9, 0.5.10)",
        judge=_overlap_forced_on,
    ),
    FlagRule(
        code="spec-v1-fallback",
        flag="--speculative-eagle-topk",
        severity=INFO,
        releases=SpecifierSet(">=0.5.11,<0.5.13"),
        when="`--speculative-eagle-topk` > 1 without `--disable-overlap-schedule`",
        outcome="the spec v1 worker, the overlap scheduler off, a log warning only",
        later="from 0.5.13 the one (v2) worker runs topk > 1 and the overlap scheduler stays as set",
        source=f"{_SERVER_ARGS} (0.5.11, 0.5.12); {_HOOK} (0.5.13)",
        judge=_spec_v1_fallback,
    ),
    FlagRule(
        code="spec-draft-tokens-exceed-tree",
        flag="--speculative-num-draft-tokens",
        severity=ERROR,
        releases=SpecifierSet(">=0.5.9"),
        when="`--speculative-eagle-topk` > 1 with `--speculative-num-draft-tokens` - 1 over the tree's "
        "topk + (steps - 1) x topk^2 candidates",
        outcome="accepted at start; `torch.topk` fails in the draft's forward, at the CUDA graph capture after "
        "loading (or the first decode)",
        later=f"the same through {NEWEST_CHECKED}",
        source="srt/speculative/spec_utils.py select_top_k_tokens, srt/speculative/eagle_utils.py "
        f"organize_draft_results (0.5.9 - {NEWEST_CHECKED}); no check in {_SERVER_ARGS} or {_HOOK}",
        judge=_draft_tokens_exceed_tree,
    ),
    FlagRule(
        code="spec-draft-tokens-overridden",
        flag="--speculative-num-draft-tokens",
        severity=WARNING,
        releases=SpecifierSet(">=0.5.9"),
        when="`--speculative-eagle-topk 1` with `--speculative-num-draft-tokens` other than steps + 1",
        outcome="set to steps + 1, a log warning only",
        later=f"the same through {NEWEST_CHECKED}",
        source=f"{_SERVER_ARGS} (0.5.9 - 0.5.12); {_HOOK} (0.5.13 - {NEWEST_CHECKED})",
        judge=_draft_tokens_overridden,
    ),
)
BY_CODE = {r.code: r for r in RULES}


def check_flag_rules(ctx: Context) -> None:
    """Run every rule of :data:`RULES` whose releases hold the one judged, for an EAGLE launch."""
    if ctx.algorithm not in EAGLE_ALGORITHMS:
        return
    flags = spec_flags(ctx.launch, ctx.version)
    ctx.report.facts["speculative_flags"] = {
        "num_steps": flags.num_steps,
        "eagle_topk": flags.topk,
        "num_draft_tokens": flags.draft_tokens,
        "disable_overlap_schedule": flags.disable_overlap,
        "spec_v2": flags.spec_v2,
        "spec_v2_from": flags.spec_v2_from,
    }
    for rule in RULES:
        if not rule.applies(ctx.version):
            continue
        finding = rule.judge(flags)
        if finding is not None:
            ctx.add(
                rule.severity,
                rule.code,
                f"{finding.what} (sglang {base_release(ctx.version)})",
                where=rule.flag,
                found=finding.found,
                expected=finding.expected,
                fix=finding.fix,
            )


def rules_table() -> str:
    """docs/doctor.md's table of :data:`RULES` (``tools/gen_docs.py`` writes it)."""
    rows = [
        "| code | severity | releases | the flags | what sglang does | later releases | read from (sglang) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in RULES:
        specs = sorted(r.releases, key=lambda s: (not s.operator.startswith(">"), s.version))
        releases = ", ".join(str(s) for s in specs)
        rows.append(f"| `{r.code}` | {r.severity} | {releases} | {r.when} | {r.outcome} | {r.later} | {r.source} |")
    return "\n".join(rows)
