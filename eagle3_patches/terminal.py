"""Untrusted text on a terminal: the one escaping helper of the doctor and the converter.

Tensor names, architectures, config values and paths come from a stranger's checkpoint.
Printed raw, an ANSI / OSC escape sequence in them can erase lines, fake an "OK", retitle the
window or set the clipboard; a newline can fake a whole finding; a bidi override can reorder
what is shown; a lone surrogate (a non-UTF-8 file name) makes ``print`` raise.  Human output
therefore passes every string through :func:`escape_terminal`, which writes each character
Python does not call printable (C0/C1 controls, DEL, format characters such as bidi
overrides and zero-width joiners, line/paragraph separators, surrogates, unassigned code
points) as ``\\xNN`` / ``\\uNNNN`` / ``\\UNNNNNNNN``; everything printable, non-ASCII letters
included, is kept.  ``--json`` output is not escaped here: ``json.dumps`` already writes
control characters as ``\\uNNNN``, so it stays valid and exact.
"""

from __future__ import annotations

import sys
from typing import Any


def _escape_char(c: str) -> str:
    o = ord(c)
    if o < 0x100:
        return f"\\x{o:02x}"
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def escape_terminal(text: object, *, keep_newlines: bool = False) -> str:
    """``str(text)`` with every non-printable character escaped (``keep_newlines``: keep ``\\n``)."""
    s = str(text)
    if s.isprintable():
        return s
    if keep_newlines:
        return "\n".join(escape_terminal(line) for line in s.split("\n"))
    return "".join(c if c.isprintable() else _escape_char(c) for c in s)


def error_text(exc: BaseException) -> str:
    """An error's message for the terminal: a diagnostic's human form (escaped field by field, its layout
    kept), anything else escaped whole."""
    diagnostic = getattr(exc, "diagnostic", None)
    if diagnostic is not None:
        return diagnostic.render("eagle3-patches: ")
    return escape_terminal(str(exc), keep_newlines=True)


def progress_bar(**kwargs: Any) -> Any:
    """A ``tqdm`` progress bar on stderr (``kwargs`` are tqdm's), or None where tqdm is not installed: the one
    progress-bar library of the offline tools, optional (sglang brings it; the serving process never needs it)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(file=sys.stderr, **kwargs)
