"""The doctor's report: findings (each a :class:`~eagle3_patches.diagnostic.Diagnostic`) and facts, in a human
and a JSON form; every string read from a checkpoint is printed escaped."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..diagnostic import ERROR, INFO, WARNING, Diagnostic
from ..errors import Eagle3ConfigError
from ..terminal import escape_terminal

_RANK = {ERROR: 0, WARNING: 1, INFO: 2}

#: findings of one code listed one by one; the rest are counted in one summary finding (a hostile checkpoint can have
#: 100k tensors)
MAX_FINDINGS_PER_CODE = 20
#: d2t / t2d larger than this are not read (a corrupted shape, not a vocabulary)


@dataclass
class Report:
    findings: list[Diagnostic] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
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
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "counts": {s: len(self.by_severity(s)) for s in (ERROR, WARNING, INFO)},
            "facts": self.facts,
            "findings": [f.as_dict() for f in sorted(self.findings, key=lambda f: _RANK.get(f.severity, 3))],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def format(self, *, show_info: bool = True, color: bool = False) -> str:
        """The human report; every string read from a checkpoint is printed escaped (:mod:`.terminal`)."""

        def paint(s: str, code: str) -> str:
            return f"\033[{code}m{s}\033[0m" if color else s

        lines = ["eagle3-patches doctor"]
        fx = self.facts
        setup = [f"sglang {fx.get('sglang_version')} ({fx.get('sglang_version_source')})"]
        if fx.get("algorithm"):
            setup.append(f"--speculative-algorithm {fx['algorithm']} ({fx.get('algorithm_source')})")
        if fx.get("tp"):
            setup.append(f"tp {fx['tp']}")
        setup.append("with eagle3-patches" if fx.get("with_patches") else "stock sglang (no eagle3-patches)")
        lines.append("  setup:  " + escape_terminal(", ".join(setup)))
        for role in ("target", "draft"):
            if fx.get(role):
                lines.append(f"  {role}: {'' if role == 'target' else ' '}{escape_terminal(fx[role])}")
        lines.append("")
        labels = {ERROR: paint("ERROR  ", "1;31"), WARNING: paint("WARNING", "1;33"), INFO: paint("info   ", "2")}
        for f in sorted(self.findings, key=lambda f: _RANK.get(f.severity, 3)):
            if f.severity == INFO and not show_info:
                continue
            lines.append(f.render(f"{labels.get(f.severity, f.severity)} [{f.code}] ", indent=8))
        n_e, n_w, n_i = (len(self.by_severity(s)) for s in (ERROR, WARNING, INFO))
        read = fx.get("bytes_read")
        tail = f" Read {_human(read)} in {fx.get('seconds', 0):.2f} s." if read is not None else ""
        verdict = paint("FAIL", "1;31") if n_e else paint("OK", "1;32")
        if lines[-1] != "":
            lines.append("")
        lines.append(f"{verdict}: {n_e} error(s), {n_w} warning(s), {n_i} note(s).{tail}")
        return "\n".join(lines)


def _human(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)
