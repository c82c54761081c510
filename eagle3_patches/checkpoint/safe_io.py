"""The one way eagle3-patches opens, reads and parses a file of a checkpoint it did not write.

A checkpoint comes from the hub or from a stranger's git clone: every byte of it, every name
and every link in it is hostile (docs/security.md).  The doctor, the converter and the strict
loader read checkpoint files only through :func:`open_checkpoint_file` (and the helpers built
on it), which enforces, before a single byte is read:

* **containment**: the file's real path (every symlink resolved) lies inside the checkpoint
  directory's real path.  The one exception is the Hugging Face cache layout: a checkpoint at
  ``.../models--org--name/snapshots/<rev>`` may link into ``.../models--org--name/blobs/``.
  A link anywhere else (``vocab.txt -> /etc/shadow``, ``sub -> /``) is refused by name.
* **regular files only**: the resolved path is ``stat``-ed first, so a FIFO (which would block
  an ``open``), a socket, a device (whose ``open`` may act) or a directory named like a file
  is refused by name without ever being opened.  The open itself is
  ``O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC`` and ``fstat`` must show the
  same regular file, so a swap between the check and the open is refused too.
* **no roots in /proc, /sys or /dev** (but /dev/shm), whose "regular" files are kernel state.
* **bounded reads**: :meth:`CheckpointFile.read_all` refuses a file above its cap before
  reading it, and :func:`load_json` refuses a JSON document whose parse would exceed
  :data:`JSON_PARSE_BUDGET` (estimated from byte counts, in linear time, before parsing),
  any integer longer than :data:`MAX_INT_DIGITS` digits (Python's ``int`` parsing is quadratic
  and its 4300-digit limit raises ``ValueError`` from inside ``json``) and any float longer
  than :data:`MAX_FLOAT_CHARS` characters.

Every refusal is an :class:`UnsafeFileError` (code ``unsafe-file``) or a
:class:`CheckpointError` naming the file, what was found and the fix.

For the strict loader (and any other reader of a draft):

    with open_checkpoint_file(draft_dir, "model.safetensors", what="draft shard") as f:
        f.fd, f.size, f.read_at(0, 8), f.library_path   # library_path: hand to safetensors.safe_open
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from ..errors import Eagle3ConfigError

#: the JSON documents a checkpoint holds may not take more memory than this to parse
#: (estimated by :func:`json_parse_cost`; docs/security.md states the budgets)
JSON_PARSE_BUDGET = 384 << 20
#: the peak memory (RSS) doctor and convert stay under on any input (docs/security.md; held by
#: tests/checkpoint/test_ckpt_hostile.py on a 40 MB header and a 64 MB index)
RSS_BUDGET = 512 << 20
#: an integer in a checkpoint's JSON with more digits than this is refused (u64 has 20)
MAX_INT_DIGITS = 20
#: a float literal longer than this is refused (a double needs at most 24 characters)
MAX_FLOAT_CHARS = 64
#: roots under these are kernel state, not checkpoints (/dev/shm, a tmpfs models are copied to, is fine)
_PSEUDO_ROOTS = ("/proc", "/sys", "/dev")
_SHM = "/dev/shm"
#: POSIX's flags (Linux, macOS): a platform without one of them is not one this module can keep its promises on
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


class CheckpointError(Eagle3ConfigError):
    """A path that is not a readable checkpoint, or a config.json / index that cannot be parsed.

    ``code`` names the class of problem for reports (``not-a-checkpoint``, ``config-json``,
    ``safetensors-index``, ``unsafe-file``, ...).
    """

    default_code = "checkpoint"


class UnsafeFileError(CheckpointError):
    """A checkpoint file eagle3-patches refuses to read: a link out of the checkpoint, or not a regular file."""

    default_code = "unsafe-file"


def checkpoint_error(
    code: str, what: str, *, where: str = "", found: str = "", expected: str = "", fix: str = ""
) -> CheckpointError:
    return CheckpointError(what, code=code, where=where, found=found, expected=expected, fix=fix)


# ------------------------------------------------------------------ paths
def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _label(what: str, name: os.PathLike | str) -> str:
    """``what`` and ``name`` for a message ("side file vocab.txt"), without saying the name twice."""
    return what if what.endswith(str(name)) else f"{what} {name}"


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return kind
    return "special file"


def checked_root(root: os.PathLike | str, role: str = "checkpoint") -> Path:
    """``root``'s real path; refused when it lies in /proc, /sys or /dev (/dev/shm is fine)."""
    real = os.path.realpath(root)
    if any(_inside(real, p) for p in _PSEUDO_ROOTS) and not _inside(real, _SHM):
        raise UnsafeFileError(
            f"the {role} path is kernel state, not a checkpoint",
            where=str(root),
            found=real,
            expected="a checkpoint directory on a real filesystem",
            fix=f"pass the {role} checkpoint's directory",
        )
    return Path(real)


def _allowed_roots(root_real: Path) -> tuple[str, ...]:
    """Where files of the checkpoint at ``root_real`` may resolve to (the HF cache's blobs/ too)."""
    roots = [str(root_real)]
    snaps = root_real.parent
    if snaps.name == "snapshots" and snaps.parent.name.startswith("models--"):
        roots.append(str(snaps.parent / "blobs"))
    return tuple(roots)


def resolve_checkpoint_file(
    root: os.PathLike | str, name: os.PathLike | str, *, what: str = "file"
) -> tuple[Path, Path, os.stat_result]:
    """``(shown, real, stat)`` for ``name`` inside the checkpoint ``root``, refusing what must not be read.

    ``shown`` is the path as the user would write it (``root/name``), ``real`` the resolved one.
    Nothing is opened: a FIFO, device or directory is named and refused from its ``stat``.
    """
    shown = Path(root) / name
    label = _label(what, name)
    root_real = checked_root(root)
    real = os.path.realpath(shown)
    if not any(_inside(real, r) for r in _allowed_roots(root_real)):
        raise UnsafeFileError(
            f"{label} resolves outside the checkpoint directory; eagle3-patches never reads through such a link",
            where=str(shown),
            found=f"-> {real}",
            expected=f"a file inside {root_real}"
            + (" (or the Hugging Face cache's blobs/)" if len(_allowed_roots(root_real)) > 1 else ""),
            fix="replace the link with the file it stands for, or remove it",
        )
    try:
        st = os.stat(real)
    except FileNotFoundError:
        dangling = os.path.islink(shown)
        raise checkpoint_error(
            "safetensors-index" if what.endswith("shard") else "not-a-checkpoint",
            f"{label} is missing" + (" (a dangling link)" if dangling else ""),
            where=str(shown),
            found=f"-> {real} (does not exist)" if dangling else "",
            fix="restore the file (finish the download)",
        ) from None
    except OSError as exc:
        raise _os_error(exc, shown, label) from None
    if not stat.S_ISREG(st.st_mode):
        kind = _file_kind(st.st_mode)
        raise UnsafeFileError(
            f"{label} is a {kind}, not a regular file; refused without reading it",
            where=str(shown),
            found=kind + (f" (via link -> {real})" if str(real) != os.path.abspath(shown) else ""),
            expected="a regular file",
            fix="replace it with the real file",
        )
    return shown, Path(real), st


def _os_error(exc: OSError, path: Path, label: str) -> CheckpointError:
    # pragma: no mutate core/NumberReplacer `-1`: neither 0 nor -1 is a key of the table (errno numbers are positive),
    # so an error without a number gets the default either way
    reason = {
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.ELOOP: "a symlink loop",
        errno.ENAMETOOLONG: "the name is too long",
        errno.ENOTDIR: "a component of the path is not a directory",
    }.get(exc.errno or 0, exc.strerror or type(exc).__name__)
    return checkpoint_error(
        "unsafe-file" if exc.errno == errno.ELOOP else "not-a-checkpoint",
        f"cannot read {label}: {reason}",
        where=str(path),
        found=f"{type(exc).__name__}: {exc.strerror or exc}",
        fix="check the path and its permissions",
    )


def list_checkpoint_dir(root: os.PathLike | str, role: str = "checkpoint") -> list[str]:
    """The entry names of the checkpoint directory ``root`` (sorted; nothing is opened or followed)."""
    try:
        return sorted(os.listdir(root))
    except OSError as exc:
        raise _os_error(exc, Path(root), f"the {role} directory {root}") from None


# ------------------------------------------------------------------ opening
class CheckpointFile:
    """An open, checked, regular file of a checkpoint (use as a context manager)."""

    def __init__(self, shown: Path, real: Path, fd: int, st: os.stat_result, what: str):
        self.path, self.real, self.fd, self.stat, self.what = shown, real, fd, st, what

    @property
    def size(self) -> int:
        return self.stat.st_size

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def library_path(self) -> str:
        """A path naming exactly this open file, for libraries that take paths (``safe_open``).

        ``/proc/self/fd/N`` on Linux (the same inode, whatever happens to the name meanwhile),
        else the resolved path.
        """
        p = f"/proc/self/fd/{self.fd}"
        return p if os.path.exists(p) else str(self.real)

    def read_at(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (fewer only at the end of the file)."""
        parts, got = [], 0
        # pragma: no mutate core/ReplaceComparisonOperator_Lt_LtE: at `got == n` the mutant asks `os.pread` for `min(0,
        # ...)` = 0 bytes, gets `b""` and leaves the loop: the same bytes
        while got < n:
            try:
                # pragma: no mutate core/NumberReplacer: the size of one `pread`: the loop reads until `n` bytes or the
                # end, whatever the chunk, so the bytes are the same
                b = os.pread(self.fd, min(n - got, 64 << 20), offset + got)
            except OSError as exc:
                raise _os_error(exc, self.path, _label(self.what, self.path.name)) from None
            if not b:
                break
            parts.append(b)
            got += len(b)
        return b"".join(parts)

    def read_all(self, max_bytes: int, *, code: str = "config-json") -> bytes:
        """The whole file, refused (unread) when larger than ``max_bytes``."""
        if self.size > max_bytes:
            raise checkpoint_error(
                code,
                f"{_label(self.what, self.name)} is implausibly large",
                where=str(self.path),
                found=f"{self.size} bytes",
                expected=f"<= {max_bytes} bytes",
                fix=f"repair or re-download {self.name}",
            )
        # pragma: no mutate core/NumberReplacer `2`: one byte past the cap is enough to see that the file grew; reading
        # two finds the same growth (a file grown by one byte reads `max_bytes + 1` bytes either way)
        data = self.read_at(0, max_bytes + 1)
        if len(data) > max_bytes:  # grew after the stat
            raise checkpoint_error(
                code,
                f"{_label(self.what, self.name)} changed while being read",
                where=str(self.path),
                fix="retry when nothing writes the checkpoint",
            )
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> CheckpointFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_checkpoint_file(root: os.PathLike | str, name: os.PathLike | str, *, what: str = "file") -> CheckpointFile:
    """Open ``root/name`` for reading under the rules of this module (see the module docstring).

    ``what`` words the messages ("draft shard", "side file", ...).  Raises
    :class:`UnsafeFileError` / :class:`CheckpointError`; never blocks, never follows a link out
    of the checkpoint, never opens a device or FIFO.
    """
    shown, real, st = resolve_checkpoint_file(root, name, what=what)
    try:
        fd = os.open(real, _OPEN_FLAGS)
    except OSError as exc:
        raise _os_error(exc, shown, _label(what, name)) from None
    fst = os.fstat(fd)
    if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise UnsafeFileError(
            f"{_label(what, name)} changed while being opened",
            where=str(shown),
            fix="retry when nothing writes the checkpoint",
        )
    return CheckpointFile(shown, real, fd, fst, what)


def read_checkpoint_bytes(
    root: os.PathLike | str, name: os.PathLike | str, *, max_bytes: int, what: str = "file", code: str = "config-json"
) -> bytes:
    """The whole of ``root/name`` (at most ``max_bytes``), read through :func:`open_checkpoint_file`."""
    with open_checkpoint_file(root, name, what=what) as f:
        return f.read_all(max_bytes, code=code)


# ------------------------------------------------------------------ JSON
#: no JSON document takes more memory to parse than this many bytes per input byte (measured:
#: CPython's json at most ~40 on nested empty lists; the safetensors library at most ~10)
_PER_BYTE = 48
#: memory charged per ``{`` / per ``[`` or ``:`` / per ``,`` / per input byte by the counting estimate
_COST_OBJECT, _COST_MEMBER, _COST_ITEM, _COST_BYTE = 704, 160, 64, 2.5
# pragma: no mutate core/NumberReplacer `255`: byte 255 left in the text after the translation changes nothing counted:
# only `{`, `[`, `:` and `,` are counted there
_NOT_STRUCTURAL = bytes(sorted(set(range(256)) - set(b"{[:,")))


def json_parse_cost(raw: bytes) -> int:
    """An upper bound of the memory parsing ``raw`` takes, computed in linear time before parsing it.

    The smaller of two bounds: ``48 x len(raw)`` (no document costs more per byte), and, for
    documents where that exceeds the budget, one from counts of structural characters: every
    object needs a ``{``, every list a ``[``, every member a ``:``, every further item a ``,``
    (characters inside strings only make the estimate larger), each charged what CPython's
    json or the safetensors library spends on it at most, plus the text and its strings.
    """
    cheap = _PER_BYTE * len(raw)
    # pragma: no mutate core/ReplaceComparisonOperator_LtE_Lt: at `cheap == JSON_PARSE_BUDGET` the mutant returns
    # `min(cheap, counted)`, at most the budget too: `check_parse_budget` refuses neither, and the estimate is shown
    # only in a refusal
    if cheap <= JSON_PARSE_BUDGET:
        return cheap
    marks = raw.translate(None, _NOT_STRUCTURAL)  # one pass; counting in what is left is cheap
    counted = (
        _COST_OBJECT * marks.count(b"{")
        + _COST_MEMBER * (marks.count(b"[") + marks.count(b":"))
        + _COST_ITEM * marks.count(b",")
        + int(_COST_BYTE * len(raw))
    )
    return min(cheap, counted)


def check_parse_budget(raw: bytes, *, what: str, where: str, code: str) -> None:
    cost = json_parse_cost(raw)
    if cost > JSON_PARSE_BUDGET:
        raise checkpoint_error(
            code,
            f"{what} is too complex to parse within eagle3-patches' memory budget",
            where=where,
            found=f"{len(raw)} bytes, estimated {cost >> 20} MiB to parse",
            expected=f"<= {JSON_PARSE_BUDGET >> 20} MiB (docs/security.md)",
            fix="this is no checkpoint written by a known tool; re-download or re-export it",
        )


class _TooLong(ValueError):
    pass


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _TooLong(
            f"an integer with {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS} accepted): {text[:24]}..."
        )
    return int(text)


def _bounded_float(text: str) -> float:
    if len(text) > MAX_FLOAT_CHARS:
        raise _TooLong(f"a number of {len(text)} characters (at most {MAX_FLOAT_CHARS} accepted): {text[:24]}...")
    return float(text)


def load_json(raw: bytes, *, what: str, where: str, code: str, object_pairs_hook=None) -> Any:
    """Parse untrusted JSON bytes: UTF-8, within the parse budget, numbers of bounded length.

    Every failure is a :class:`CheckpointError` with ``code``.
    """
    check_parse_budget(raw, what=what, where=where, code=code)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        # pragma: no mutate core/NumberReplacer: a `UnicodeDecodeError`'s message (codec, byte, position, reason) is far
        # shorter than 200 characters, so the cut never cuts
        raise checkpoint_error(
            code, f"{what} is not UTF-8", where=where, found=str(exc)[:200], fix="repair or re-download it"
        ) from None
    try:
        return json.loads(text, parse_int=_bounded_int, parse_float=_bounded_float, object_pairs_hook=object_pairs_hook)
    except Eagle3ConfigError:  # raised by the caller's object_pairs_hook
        raise
    except _TooLong as exc:
        raise checkpoint_error(
            code,
            f"{what} holds an absurd number",
            where=where,
            found=str(exc),
            expected=f"integers of at most {MAX_INT_DIGITS} digits",
            fix="repair or re-download it",
        ) from None
    except (ValueError, RecursionError) as exc:
        # pragma: no mutate core/NumberReplacer: the messages of `json`'s `JSONDecodeError` and of `RecursionError` are
        # far shorter than 200 characters (`::test_invalid_json_is_refused_with_the_parsers_words`), so the cut never
        # cuts
        raise checkpoint_error(
            code,
            f"{what} is not valid JSON",
            where=where,
            found=str(exc)[:200] or type(exc).__name__,
            fix="repair or re-download it",
        ) from None
