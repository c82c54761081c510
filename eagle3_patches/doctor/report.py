"""The doctor's report: findings (each a :class:`~eagle3_patches.diagnostic.Diagnostic`) and facts, in a human
and a JSON form; every string read from a checkpoint is printed escaped."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..diagnostic import ERROR, INFO, WARNING, Diagnostic
from ..errors import Eagle3ConfigError
from ..terminal import escape_terminal

# pragma: no mutate core/NumberReplacer `-1`, `3`: the order of the three severities is unchanged, and `Diagnostic`
# admits no other severity
_RANK = {ERROR: 0, WARNING: 1, INFO: 2}

#: within a severity, findings are listed by consequence, the root cause first: the speculative algorithm (EAGLE
#: with an EAGLE-3 draft skips the draft's fc, so every other capture finding is moot) and what stops the server at
#: start; then what feeds the draft the wrong input (the pair's sizes, the aux layers captured, a path that loses
#: the capture); then the draft's own tensors and vocabulary map; then the rest (dtypes, release notes) in the order
#: found.  Code prefixes, first match wins.
CONSEQUENCE = (
    ("algorithm-", "no-speculation", "pd-mode", "pd-algorithm"),
    (
        "nothing-to-check",
        "not-a-checkpoint",
        "internal-error",
        "kimi-k25-",
        "tp-draft-split",
        "pipeline-parallel",
        "draft-context-length",
        "spec-v2-topk-refused",
        "spec-draft-tokens-exceed-tree",
    ),
    (
        "hidden-",
        "target-hidden-size",
        "fc-",
        "aux-",
        "draft-not-eagle3",
        "vocab-",
        "embed-",
        "cuda-graph-capture-order",
        "tp-allreduce-fusion",
        "dp-attention-a2a-aux-rows",
        "two-batch-overlap",
    ),
    ("keys-", "tensor-", "d2t-", "t2d-", "draft-", "duplicate-tensor", "safetensors-", "target-"),
)


def consequence(code: str) -> int:
    """The rank of a finding's code in :data:`CONSEQUENCE` (lower first; unlisted codes last)."""
    return next((i for i, prefixes in enumerate(CONSEQUENCE) if code.startswith(prefixes)), len(CONSEQUENCE))


def _order(f: Diagnostic) -> tuple[int, int]:
    return _RANK.get(f.severity, 3), consequence(f.code)


#: findings of one code listed one by one; the rest are counted in one summary finding (a hostile checkpoint can have
#: 100k tensors)
MAX_FINDINGS_PER_CODE = 20
#: d2t / t2d larger than this are not read (a corrupted shape, not a vocabulary)


@dataclass
class Report:
    findings: list[Diagnostic] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    #: where it is not known whether the server runs under eagle3-patches: the report of the same setup judged
    #: with eagle3-patches (this one is stock sglang's, and the exit status is this one's)
    with_patches: Report | None = None
    # pragma: no mutate core/ReplaceFalseWithTrue: a private counter's `repr`; no output of the doctor prints a
    # `Report`'s repr
    _per_code: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)

    # -- building
    def add(self, severity: str, code: str, what: str, **kw: str) -> Diagnostic:
        """Record a finding; past :data:`MAX_FINDINGS_PER_CODE` of one code they are only counted (see
        :meth:`close`).
        """
        return self.add_diagnostic(Diagnostic.make(severity, code, what, **kw))

    def add_diagnostic(self, f: Diagnostic) -> Diagnostic:
        key = (f.severity, f.code)
        self._per_code[key] = self._per_code.get(key, 0) + 1
        if self._per_code[key] <= MAX_FINDINGS_PER_CODE:
            self.findings.append(f)
        return f

    def fork(self, *, facts: dict[str, Any]) -> Report:
        """A report holding this one's findings so far (and their counts), to be continued apart."""
        return Report(findings=list(self.findings), facts=facts, _per_code=dict(self._per_code))

    def ordered(self) -> list[Diagnostic]:
        """The findings by severity, then by consequence (:data:`CONSEQUENCE`), then in the order found."""
        return sorted(self.findings, key=_order)

    def close(self) -> None:
        """One summary finding per code whose findings were only counted."""
        for (severity, code), n in sorted(self._per_code.items()):
            if n > MAX_FINDINGS_PER_CODE:
                self.findings.append(
                    Diagnostic(
                        severity,
                        code,
                        f"{n - MAX_FINDINGS_PER_CODE} more [{code}] finding(s) like the above are not listed",
                    )
                )
        self._per_code.clear()

    # -- reading
    def by_severity(self, severity: str) -> list[Diagnostic]:
        return [f for f in self.findings if f.severity == severity]

    @property
    def errors(self) -> list[Diagnostic]:
        return self.by_severity(ERROR)

    @property
    def warnings(self) -> list[Diagnostic]:
        return self.by_severity(WARNING)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def codes(self, severity: str | None = None) -> list[str]:
        return [f.code for f in self.findings if severity is None or f.severity == severity]

    def raise_for_errors(self) -> None:
        """Raise the first error as :class:`Eagle3ConfigError` (for guards and the converter)."""
        for f in self.errors:
            more = len(self.errors) - 1
            raise Eagle3ConfigError(
                diagnostic=f.replace(
                    what=f.what + (f" (and {more} more error(s): run `eagle3-patches doctor` for all)" if more else "")
                )
            )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "counts": {s: len(self.by_severity(s)) for s in (ERROR, WARNING, INFO)},
            "facts": self.facts,
            "findings": [f.as_dict() for f in self.ordered()],
        }
        if self.with_patches is not None:
            out["with_patches"] = {k: v for k, v in self.with_patches.to_dict().items() if k != "facts"}
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def format(self, *, show_info: bool = True, color: bool = False, title: str = "eagle3-patches doctor") -> str:
        """The human report; every string read from a checkpoint is printed escaped (:mod:`.terminal`)."""
        paint = _painter(color)
        lines = [title]
        fx = self.facts
        setup = [f"sglang {fx.get('sglang_version')} ({fx.get('sglang_version_source')})"]
        if fx.get("algorithm"):
            setup.append(f"--speculative-algorithm {fx['algorithm']} ({fx.get('algorithm_source')})")
        if fx.get("tp"):
            setup.append(f"tp {fx['tp']}")
        differs = self.with_patches is not None and _judged(self.with_patches) != _judged(self)
        setup.append(_patch_mode(fx, self.with_patches is not None, differs))
        lines.append("  setup:  " + escape_terminal(", ".join(setup)))
        for role in ("target", "draft"):
            if fx.get(role):
                lines.append(f"  {role}: {'' if role == 'target' else ' '}{escape_terminal(fx[role])}")
        lines.append("")
        lines.extend(self.finding_lines(show_info=show_info, color=color))
        n_e, n_w, n_i = self.counts()
        read = fx.get("bytes_read")
        # pragma: no mutate core/NumberReplacer: `doctor()` sets `bytes_read` and `seconds` together, so the line is
        # never printed without `seconds`
        tail = f" Read {_human(read)} in {fx.get('seconds', 0):.2f} s." if read is not None else ""
        verdict = paint("FAIL", "1;31") if n_e else paint("OK", "1;32")
        # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Gt: every string but `""` is greater than `""`
        if lines[-1] != "":
            lines.append("")
        on = " on stock sglang" if differs else ""
        lines.append(f"{verdict}{on}: {n_e} error(s), {n_w} warning(s), {n_i} note(s).{tail}")
        if differs:
            lines.extend(self._with_patches_summary(paint))
        return "\n".join(lines)

    def counts(self) -> tuple[int, int, int]:
        """(errors, warnings, notes)."""
        n_e, n_w, n_i = (len(self.by_severity(s)) for s in (ERROR, WARNING, INFO))
        return n_e, n_w, n_i

    def finding_lines(self, *, show_info: bool = True, color: bool = False) -> list[str]:
        """The findings in the human form, in :meth:`ordered` order."""
        paint = _painter(color)
        labels = {ERROR: paint("ERROR  ", "1;31"), WARNING: paint("WARNING", "1;33"), INFO: paint("info   ", "2")}
        return [
            f.render(f"{labels.get(f.severity, f.severity)} [{f.code}] ", indent=8)
            for f in self.ordered()
            if show_info or f.severity != INFO
        ]

    def _with_patches_summary(self, paint) -> list[str]:
        """The verdict with eagle3-patches, in a few lines: what it fixes, what stays wrong."""
        wp = self.with_patches
        assert wp is not None
        n_e, n_w, n_i = wp.counts()
        verdict = paint("FAIL", "1;31") if n_e else paint("OK", "1;32")
        lines = [f"{verdict} with eagle3-patches: {n_e} error(s), {n_w} warning(s), {n_i} note(s)."]
        still = {f.code for f in wp.errors}
        fixed = [c for c in dict.fromkeys(f.code for f in self.ordered() if f.severity == ERROR) if c not in still]
        if fixed:
            lines.append("  fixed by eagle3-patches: " + ", ".join(fixed))
        for f in wp.ordered():
            if f.severity == ERROR:
                lines.append(f.render(f"  {paint('ERROR', '1;31')} [{f.code}] ", indent=8))
        lines.append(
            "  The server runs under eagle3-patches when launched with `eagle3-patches run -- ...`, or on sglang"
            " >= 0.5.11 with eagle3-patches installed (its plugin). Say which: --with-patches judges that launch"
            " and exits by it; --without-patches judges stock sglang alone."
        )
        return lines


def _painter(color: bool):
    def paint(s: str, code: str) -> str:
        return f"\033[{code}m{s}\033[0m" if color else s

    return paint


def _patch_mode(fx: dict[str, Any], both: bool, differs: bool) -> str:
    """The setup line's part that says whether the server runs under eagle3-patches, and how that is known."""
    why = fx.get("with_patches_source") or ""
    explicit = why in ("", "--with-patches", "--without-patches")
    if both:
        return "stock sglang or eagle3-patches (" + (
            "not known from the flags: both verdicts below)" if differs else "the same verdict either way)"
        )
    if fx.get("with_patches"):
        return "with eagle3-patches" + ("" if explicit else f" ({why})")
    return "stock sglang (no eagle3-patches" + ("" if explicit else f": {why}") + ")"


def _judged(r: Report) -> list[tuple[str, str]]:
    return sorted((f.severity, f.code) for f in r.findings)


def _human(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


@dataclass
class PairReport:
    """The doctor's report on a prefill/decode pair: each side's own report, and the findings across the two."""

    prefill: Report
    decode: Report
    pair: Report

    def sides(self) -> list[tuple[str, Report]]:
        return [("prefill", self.prefill), ("decode", self.decode), ("pair", self.pair)]

    @property
    def ok(self) -> bool:
        return all(r.ok for _, r in self.sides())

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, "exit_code": self.exit_code}
        for name, r in self.sides():
            out[name] = r.to_dict()
        del out["pair"]["facts"]  # the pair's facts are its sides'
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def format(self, *, show_info: bool = True, color: bool = False) -> str:
        paint = _painter(color)
        parts = [
            r.format(show_info=show_info, color=color, title=f"eagle3-patches doctor: the {name} server")
            for name, r in self.sides()[:2]
        ]
        pair = ["eagle3-patches doctor: what the two sides must agree on", ""]
        pair += self.pair.finding_lines(show_info=show_info, color=color) or ["  nothing differs that must not"]
        pair.append("")
        totals = [sum(c) for c in zip(*(r.counts() for _, r in self.sides()))]
        verdict = paint("FAIL", "1;31") if not self.ok else paint("OK", "1;32")
        pair.append(
            f"{verdict} for the pair: {totals[0]} error(s), {totals[1]} warning(s), {totals[2]} note(s) "
            "(both sides and across them)."
        )
        return "\n\n".join([*parts, "\n".join(pair)])
