"""One shape for every problem eagle3-patches reports, one way to print it, one JSON form.

A :class:`Diagnostic` is what a guard raises (inside :class:`~eagle3_patches.errors.Eagle3ConfigError`),
what the doctor reports (``eagle3-patches doctor``), what a patch's preflight rule finds and what
``eagle3-patches probe-report`` concludes from the probe's records: severity, a stable ``code``
(docs/doctor.md and docs/troubleshooting.md list them), what is wrong, where, what was found, what
was expected, the likely cause and the fix.  ``related`` names the doctor codes that check for the
cause; ``context`` holds machine-readable extras (the probe's hop, mode, pid and rank).

:meth:`Diagnostic.render` is the one human form (every field escaped for the terminal: strings
from checkpoints are untrusted), :meth:`Diagnostic.as_dict` the one JSON form.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .terminal import escape_terminal

ERROR = "error"
WARNING = "warning"
INFO = "info"
SEVERITIES = (ERROR, WARNING, INFO)
#: the labelled fields of the human form, in order
FIELDS = ("where", "found", "expected", "cause", "fix")


def first_few(items, limit: int, sep: str = ", ") -> str:
    """At most ``limit`` of ``items`` joined by ``sep``, then `` ...`` when some were left out: how a finding
    lists names (tensors, parameters, differences) that may run into the thousands."""
    items = list(items)
    return sep.join(items[:limit]) + (" ..." if len(items) > limit else "")


@dataclass(frozen=True)
class Diagnostic:
    severity: str
    code: str
    what: str
    where: str = ""
    found: str = ""
    expected: str = ""
    cause: str = ""
    fix: str = ""
    related: tuple[str, ...] = ()
    context: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")

    @classmethod
    def make(cls, severity: str, code: str, what: str, **fields: Any) -> Diagnostic:
        """A diagnostic from loosely typed fields: ``None`` and ``""`` dropped, the rest as text."""
        kept = {k: v for k, v in fields.items() if v not in (None, "")}
        for key in FIELDS:
            if key in kept:
                kept[key] = str(kept[key])
        if "related" in kept:
            kept["related"] = tuple(kept["related"])
        return cls(severity, code, str(what), **kept)

    def replace(self, **changes: Any) -> Diagnostic:
        return dataclasses.replace(self, **changes)

    # -- the one JSON form
    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"severity": self.severity, "code": self.code, "what": self.what}
        for key in FIELDS:
            out[key] = getattr(self, key)
        out["related"] = list(self.related)
        out["context"] = dict(self.context)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Diagnostic:
        return cls.make(
            d["severity"],
            d["code"],
            d["what"],
            **{k: d.get(k) for k in (*FIELDS, "related")},
            context=dict(d.get("context") or {}),
        )

    # -- the one human form
    def render(self, head: str = "", *, indent: int = 2) -> str:
        """``head`` + what, then one escaped ``label: value`` line per non-empty field, ``indent`` spaces in."""
        lines = [f"{head}{escape_terminal(self.what)}"]
        pad = " " * indent
        for key in FIELDS:
            value = getattr(self, key)
            if value:
                lines.append(f"{pad}{key + ':':<10}{escape_terminal(value)}")
        if self.related:
            lines.append(f"{pad}{'doctor:':<10}`eagle3-patches doctor` finding(s) {', '.join(self.related)}")
        return "\n".join(lines)


class Diagnostics(list):
    """A list of diagnostics with ``add(severity, code, what, **fields)`` (what preflight rules return)."""

    def add(self, severity: str, code: str, what: str, **fields: Any) -> Diagnostic:
        d = Diagnostic.make(severity, code, what, **fields)
        self.append(d)
        return d
