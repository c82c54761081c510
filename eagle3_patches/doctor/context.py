"""What a doctor check reads (the :class:`~eagle3_patches.preflight.Setup` every patch's preflight rule reads too)
and where it writes (the :class:`~.report.Report`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..diagnostic import ERROR, Diagnostic
from ..errors import Eagle3ConfigError
from ..preflight import Setup
from .report import Report


@dataclass
class Context(Setup):
    """The setup the preflight rules read, plus the report the doctor writes."""

    report: Report = field(default_factory=Report)

    def add(self, *a, **kw) -> Diagnostic:
        return self.report.add(*a, **kw)


def guard(ctx: Context, label: str, fn: Callable[[Context], None]) -> None:
    try:
        fn(ctx)
    except Eagle3ConfigError as exc:
        ctx.report.add_diagnostic(exc.diagnostic)
    except Exception as exc:  # noqa: BLE001 - a doctor must never show a traceback
        ctx.add(
            ERROR,
            "internal-error",
            f"the doctor's {label} check could not finish: {type(exc).__name__}: {exc}",
            fix="this is a bug in eagle3-patches; please report it with the --json output",
        )
