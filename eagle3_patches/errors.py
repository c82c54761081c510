"""Errors raised by eagle3-patches.

Every error a user can cause carries four things: where (file, flag or config
field), what was found, what was expected, and how to fix it.  The CLI prints
``str(error)`` without a traceback for these.
"""

from __future__ import annotations


class Eagle3Error(Exception):
    """Base class: a problem a user can fix; the CLI prints it without a traceback."""


class Eagle3ConfigError(Eagle3Error, ValueError):
    """A draft/target/launch configuration that would make EAGLE-3 silently wrong."""

    def __init__(self, what: str, *, where: str = "", found: str = "", expected: str = "", fix: str = ""):
        self.what, self.where, self.found, self.expected, self.fix = what, where, found, expected, fix
        parts = [f"eagle3-patches: {what}"]
        if where:
            parts.append(f"  where:    {where}")
        if found:
            parts.append(f"  found:    {found}")
        if expected:
            parts.append(f"  expected: {expected}")
        if fix:
            parts.append(f"  fix:      {fix}")
        super().__init__("\n".join(parts))

    def __reduce__(self):  # keep the fields across process boundaries (spawned sglang workers)
        return (_rebuild, (type(self), self.what, self.where, self.found, self.expected, self.fix))


def _rebuild(cls, what, where, found, expected, fix):
    return cls(what, where=where, found=found, expected=expected, fix=fix)


class Eagle3TargetError(Eagle3ConfigError, AttributeError):
    """The target model cannot do EAGLE-3 aux-hidden-state capture (cf. vLLM's SupportsEagle3)."""


class Eagle3CaptureError(Eagle3ConfigError):
    """The aux hidden states captured by the target, or reaching the draft's ``fc``, have the wrong number or width.

    Deliberately not a ``RuntimeError``: sglang's CUDA-graph runners catch ``RuntimeError`` during capture
    and re-raise it as "Capture cuda graph failed" with advice about graph memory, which would bury a
    configuration mistake under the wrong fix."""


class PatchError(Eagle3Error, RuntimeError):
    """A patch could not be applied; every original was restored."""
