"""Errors raised by eagle3-patches.

Every error a user can cause carries a :class:`~eagle3_patches.diagnostic.Diagnostic`: where (file,
flag or config field), what was found, what was expected, and how to fix it.  The CLI prints
``str(error)`` without a traceback for these.
"""

from __future__ import annotations

from .diagnostic import ERROR, Diagnostic


class Eagle3Error(Exception):
    """Base class: a problem a user can fix; the CLI prints it without a traceback."""


class Eagle3ConfigError(Eagle3Error, ValueError):
    """A draft/target/launch configuration that would make EAGLE-3 silently wrong.

    It carries one :class:`~eagle3_patches.diagnostic.Diagnostic` (``.diagnostic``); ``str(error)`` is
    its human form, every field escaped for the terminal."""

    default_code = "config"

    def __init__(
        self,
        what: str = "",
        *,
        where: str = "",
        found: str = "",
        expected: str = "",
        fix: str = "",
        cause: str = "",
        code: str | None = None,
        diagnostic: Diagnostic | None = None,
    ):
        if diagnostic is None:
            diagnostic = Diagnostic.make(
                ERROR,
                code or type(self).default_code,
                what,
                where=where,
                found=found,
                expected=expected,
                cause=cause,
                fix=fix,
            )
        self.diagnostic = diagnostic
        super().__init__(diagnostic.render("eagle3-patches: "))

    @property
    def code(self) -> str:
        return self.diagnostic.code

    @property
    def what(self) -> str:
        return self.diagnostic.what

    @property
    def where(self) -> str:
        return self.diagnostic.where

    @property
    def found(self) -> str:
        return self.diagnostic.found

    @property
    def expected(self) -> str:
        return self.diagnostic.expected

    @property
    def fix(self) -> str:
        return self.diagnostic.fix

    def __reduce__(self):  # keep the diagnostic across process boundaries (spawned sglang workers)
        return (_rebuild, (type(self), self.diagnostic.as_dict()))


def _rebuild(cls, diagnostic):
    return cls(diagnostic=Diagnostic.from_dict(diagnostic))


class Eagle3TargetError(Eagle3ConfigError, AttributeError):
    """The target model cannot do EAGLE-3 aux-hidden-state capture (cf. vLLM's SupportsEagle3)."""


class Eagle3CaptureError(Eagle3ConfigError):
    """The aux hidden states captured by the target, or reaching the draft's ``fc``, have the wrong number or width.

    Deliberately not a ``RuntimeError``: sglang's CUDA-graph runners catch ``RuntimeError`` during capture
    and re-raise it as "Capture cuda graph failed" with advice about graph memory, which would bury a
    configuration mistake under the wrong fix."""


class PatchError(Eagle3Error, RuntimeError):
    """A patch could not be applied; every original was restored."""
