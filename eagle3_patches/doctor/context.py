"""What a doctor check reads (the :class:`~eagle3_patches.preflight.Setup` every patch's preflight rule reads too)
and where it writes (the :class:`~.report.Report`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from .._bootstrap import child_environment
from ..checkpoint.launch_args import LaunchArgs
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


def launch_environ(la: LaunchArgs) -> dict[str, str]:
    """The environment the launched server runs with: the one source of every verdict that depends on it (the patch
    set, the ``EAGLE3_PATCHES_*`` settings, sglang's own variables such as ``SGLANG_ENABLE_SPEC_V2``).  It is this
    process's environment, which a launch from the same shell inherits, with the command's own assignments over it,
    then what ``eagle3-patches run`` sets in front of the server (``EAGLE3_PATCHES_APPLY`` from its ``--only``,
    ``EAGLE3_PATCHES_DISABLE`` widened by its ``--disable``: :func:`~eagle3_patches._bootstrap.child_environment`)."""
    env = {**os.environ, **la.env}
    if la.with_patches:
        env = child_environment(patches=",".join(la.run_only) or "all", disable=la.run_disable, base=env)
    return env


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
