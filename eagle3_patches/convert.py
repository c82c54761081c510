# long module: the converter's one durable write path (paths, temp dirs, copies, checks, the rename), top to bottom
"""Convert a speculators-format (or original EAGLE repository) EAGLE-3 draft to SGLang format, streaming, atomically.

    from eagle3_patches.convert import convert
    result = convert("/models/draft-speculators", "/models/draft-sglang")

What changes is planned by :mod:`eagle3_patches.checkpoint.conversion_plan` (speculators) and
:mod:`eagle3_patches.checkpoint.eagle_repo` (the EAGLE repository) (docs/checkpoints.md has
the full mapping); this module writes it durably.

How: headers are planned first, then every tensor's bytes are copied from the source
file's data region into the new file (``os.copy_file_range`` where the kernel has it),
so the peak memory is one copy buffer, no pickle is ever loaded and nothing is decoded.
The output is written into a temporary directory next to DST, its headers re-read and
checked against the plan, the doctor's draft checks run on it, and only then is it
renamed to DST: an interrupted run (SIGINT, SIGTERM, SIGHUP) leaves no DST, no temporary
directory and no parent directory it created; one left by a SIGKILLed run is removed by the
next run on the same DST once its owner process is gone.  SRC is never written.  An
existing DST is refused unless ``force``.

Every source file is read through :mod:`.checkpoint.safe_io` (no link out of SRC, regular files only);
side files (tokenizer, generation config, chat template) are an allow-list; no DST file is
given wider permissions than its source file.

One module of a little over 600 lines, on purpose: the temporary directory, its owner token, the signal
handlers and the final rename share one lifetime, and every step between them must leave nothing behind on
failure; split apart, that invariant would be spread over modules.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import stat
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint import eagle_repo
from .checkpoint.conversion_plan import (
    ConvertError,
    PlannedTensor,
    carried,
    conversion_error,
    plan_conversion,
    shards,
)
from .checkpoint.formats import checkpoint_dir, read_config
from .checkpoint.safe_io import (
    CheckpointError,
    list_checkpoint_dir,
    open_checkpoint_file,
    resolve_checkpoint_file,
)
from .checkpoint.safetensors_header import encode_header, read_header
from .doctor import check_draft
from .errors import Eagle3ConfigError
from .patches.eagle3_draft_config_fields import readers
from .terminal import progress_bar

#: default largest output shard (as transformers' save_pretrained)
DEFAULT_MAX_SHARD_SIZE = 5 * 1000**3
# pragma: no mutate core/NumberReplacer: the copy's chunk size: the same bytes are copied
COPY_CHUNK = 64 << 20
#: side files larger than this are refused (the largest tokenizers are ~30 MB)
MAX_SIDE_FILE_BYTES = 256 << 20
#: the permission bits DST files may have at most (and never more than their source file)
MAX_MODE = 0o644
#: the allow-list of small non-weight files copied to DST (never *.py, never pickles)
COPY_FILES = re.compile(
    r"^(tokenizer(_config)?\.json|tokenizer\.model|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)|merges\.txt"
    r"|generation_config\.json|[\w.-]*\.tiktoken|tiktoken\.model|chat_template\.(json|jinja))$"
)


class ConvertInterrupted(KeyboardInterrupt):
    """SIGTERM / SIGHUP during a conversion: handled like Ctrl-C (cleanup, then exit 128 + signum)."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


@dataclass
class ConvertResult:
    src: Path
    dst: Path
    files: list[Path]
    tensors: int
    bytes_copied: int
    seconds: float
    config: dict
    renamed: dict[str, str]  # source name -> output name, where they differ
    dropped: list[str]
    report: Any = None  # the doctor's Report on the output
    notes: list[str] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)  # debris of killed earlier runs removed (or an old DST restored)
    serving: str = ""  # the draft norms the config carries and the releases that read them ("" when none)


# ====================================================================== helpers
def parse_size(text: str | int) -> int:
    """``5GB`` / ``500MB`` / ``1GiB`` / ``123`` -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*", str(text), re.I)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 5GB, 500MB)")
    num, unit = float(m.group(1)), (m.group(2) or "").upper()
    base = 1024 if "I" in unit else 1000
    # pragma: no mutate core/NumberReplacer `B": 1, "`, `B": -1, "`: the `"B"` key is never looked up (a bare `B` is not
    # in `KMGT`, so it reads the `""` key)
    power = {"": 0, "B": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit[:1] if unit and unit[0] in "KMGT" else ""]
    size = int(num * base**power)
    if size <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return size


def _inside(a: Path, b: Path) -> bool:
    """a == b or a is inside b."""
    try:
        a.relative_to(b)
        return True
    except ValueError:
        return False


def _check_paths(src: Path, dst: Path, force: bool) -> Path:
    """``dst`` made absolute; refuses a DST that overlaps SRC, is the current directory (or above it), or exists."""
    rs, rd = Path(os.path.realpath(src)), Path(os.path.abspath(dst))
    cwd = Path(os.getcwd())
    if rd == Path(rd.anchor) or _inside(cwd, rd):
        raise conversion_error(
            "DST must name a new directory, not the current directory, one of its parents or the root",
            where=str(dst),
            found=str(rd),
            fix="name a new directory, e.g. ./draft-sglang",
        )
    rd_real = Path(os.path.realpath(rd))  # realpath, not Path.resolve: a symlink loop is no RuntimeError
    if _inside(rd_real, rs) or _inside(rs, rd_real):
        raise conversion_error(
            "the destination overlaps the source; the converter never writes into SRC",
            where=str(dst),
            found=f"SRC {rs}, DST {rd}",
            fix="choose a DST outside SRC (e.g. a sibling directory)",
        )
    if os.path.lexists(rd) and not force:
        raise conversion_error(
            "the destination already exists",
            where=str(dst),
            fix="choose a new DST, or pass --force to replace it",
        )
    return rd


def _dst_error(exc: OSError, path: Path, action: str) -> ConvertError:
    """An OSError while writing DST as what / where / found / fix."""
    where = path
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        for parent in [path, *path.parents]:  # name the component that is not a directory
            if os.path.lexists(parent) and not parent.is_dir():
                return conversion_error(
                    f"cannot {action}: {parent} is not a directory",
                    where=str(path),
                    found=f"a file at {parent}",
                    expected="a directory (or nothing) at each component of DST",
                    fix="choose another DST, or move that file away",
                )
    fix = {
        errno.EACCES: "choose a DST in a directory you can write, or fix its permissions",
        errno.EPERM: "choose a DST in a directory you can write, or fix its permissions",
        errno.EROFS: "the filesystem is read-only: choose a DST on a writable one",
        errno.ENOSPC: "free space or choose a DST on another filesystem",
        errno.EDQUOT: "free space or choose a DST on another filesystem",
        errno.ENAMETOOLONG: "choose a shorter DST",
        # pragma: no mutate core/NumberReplacer `-1`: neither 0 nor -1 is a key of the table: the same default fix
    }.get(exc.errno or 0, "check DST and its parent directory")
    return conversion_error(
        f"cannot {action}: {exc.strerror or exc}",
        where=str(where),
        found=f"{type(exc).__name__} [errno {exc.errno}]",
        fix=fix,
    )


def _make_parents(parent: Path) -> list[Path]:
    """``mkdir -p parent``; returns the directories it created, outermost first (removed again on failure)."""
    missing = []
    p = parent
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    created = []
    try:
        for d in reversed(missing):
            os.mkdir(d, 0o755)
            created.append(d)
    except OSError as exc:
        _remove_dirs(created)
        raise _dst_error(exc, d, "create the destination's parent directory") from None
    return created


def _remove_dirs(created: list[Path]) -> None:
    for d in reversed(created):
        try:
            os.rmdir(d)
        except OSError:
            # pragma: no mutate core/ReplaceBreakWithContinue: an outer directory cannot be removed while the inner one
            # that could not be is still in it
            break


# ---------------------------------------------------------------- owner tokens (stale temp dirs)
def _process_token(pid: int) -> str | None:
    """A token naming process ``pid`` uniquely across pid reuse and reboots (Linux: boot id + start time), or None
    if gone."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
        try:  # a kernel without the boot id (some containers): the start time alone still tells pids apart
            # pragma: no mutate core/NumberReplacer: the boot id's length in the owner token: every run of this version
            # writes and reads tokens the same way
            # pragma: no mutate eagle3/DropNormalisation: the boot id is a 36-character UUID and a newline: the first 8
            # characters after dropping the dashes are the same with or without the newline stripped
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
        except OSError:
            boot = ""
        return f"{boot}{stat_line.rsplit(')', 1)[1].split()[19]}"
    except FileNotFoundError:
        # pragma: no mutate core/AddNot: for a process that is gone, the fallback's `os.kill` says gone too
        # (`ProcessLookupError`: None)
        if os.path.isdir("/proc/self"):
            return None  # /proc is there and the process is not
    except (OSError, IndexError, ValueError):
        pass
    try:  # no /proc: only "is the pid alive"
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:
        pass
    return "0"


_TEMP = re.compile(r"^\.(?P<dst>.+)\.eagle3-(?P<kind>convert|old)-(?P<pid>\d+)-(?P<token>[0-9a-f]+)-[0-9a-f]{8}$")


def _temp_name(dst: Path, kind: str) -> Path:
    pid = os.getpid()
    return dst.parent / f".{dst.name}.eagle3-{kind}-{pid}-{_process_token(pid)}-{uuid.uuid4().hex[:8]}"


def _remove_stale(dst: Path) -> list[str]:
    """Remove temp dirs of earlier runs on ``dst`` whose owner process is gone (a SIGKILLed run's debris).

    A left ``.eagle3-old-*`` directory (a killed ``--force`` run between its two renames) is
    put back as DST when DST is missing, else removed.  Returns notes on what was done.
    """
    notes: list[str] = []
    try:
        names = os.listdir(dst.parent)
    except OSError:
        return notes
    for name in names:
        m = _TEMP.match(name)
        if not m or m["dst"] != dst.name or _process_token(int(m["pid"])) == m["token"]:
            continue
        path = dst.parent / name
        try:
            st = os.lstat(path)
        except OSError:  # removed meanwhile
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        if m["kind"] == "old" and not os.path.lexists(dst):
            os.rename(path, dst)
            notes.append(f"restored {dst} from {name}, left by a killed run (pid {m['pid']})")
        else:
            shutil.rmtree(path, ignore_errors=True)
            notes.append(f"removed {name}, left by a killed run (pid {m['pid']})")
    return notes


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`ConvertInterrupted` (like SIGINT's KeyboardInterrupt) while converting."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise ConvertInterrupted(signum)

    old = {}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


# ====================================================================== planning
class _Progress:
    def __init__(self, total: int, progress: Any):
        self.total, self.done, self.bar, self.cb = total, 0, None, None
        if callable(progress) and not isinstance(progress, bool):
            self.cb = progress
        elif progress is True or (progress is None and total >= (256 << 20) and sys.stderr.isatty()):
            self.bar = progress_bar(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="convert")

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        if self.cb is not None:
            self.cb(self.done, self.total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``: a write may take fewer bytes than it is given (FUSE and network filesystems)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy_range(src_fd: int, offset: int, length: int, dst_fd: int, progress: _Progress) -> None:
    """Copy ``length`` bytes at ``offset`` of ``src_fd`` to the current position of ``dst_fd``."""
    use_cfr = hasattr(os, "copy_file_range")
    remaining = length
    while remaining:
        n = min(remaining, COPY_CHUNK)
        # pragma: no mutate core/NumberReplacer: `done` is assigned on every path before it is read
        done = 0
        if use_cfr:
            try:
                done = os.copy_file_range(src_fd, dst_fd, n, offset)
            except OSError:
                # pragma: no mutate core/NumberReplacer: the fallback below assigns `done` before it is read
                use_cfr, done = False, 0
        if not use_cfr:
            buf = os.pread(src_fd, n, offset)
            if not buf:
                raise conversion_error("the source file ended early while copying", found=f"offset {offset}")
            _write_all(dst_fd, buf)
            done = len(buf)
        if done <= 0:
            raise conversion_error("the source file ended early while copying", found=f"offset {offset}")
        offset += done
        remaining -= done
        progress.update(done)


def _narrowed(mode: int) -> int:
    """DST permission bits for a file whose source has ``mode``: never wider than it, at most :data:`MAX_MODE`."""
    return mode & MAX_MODE


def _write_shard(src: Path, path: Path, items: list[PlannedTensor], progress: _Progress) -> dict[str, tuple[int, int]]:
    header, offsets = encode_header(((i.out, i.src.dtype, i.src.shape) for i in items), {"format": "pt"})
    mode = MAX_MODE
    for it in items:
        mode &= it.src_mode
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _narrowed(mode))
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, fd)
        files: dict[str, Any] = {}
        _write_all(fd, header)
        for it in items:
            f = files.get(it.src.file)
            if f is None:
                f = files[it.src.file] = stack.enter_context(
                    open_checkpoint_file(src, it.src.file, what="source shard")
                )
            _copy_range(f.fd, it.src_data_start + it.src.start, it.src.nbytes, fd, progress)
        os.fsync(fd)
    return offsets


def _side_files(src: Path) -> list[str]:
    """The allow-listed side files of ``src``, each checked by the safe-open rules before anything is written.

    Refuses the conversion naming every side file that links out of SRC, is not a regular
    file or is implausibly large.
    """
    names = [n for n in list_checkpoint_dir(src, "source draft") if COPY_FILES.match(n)]
    refused: list[Eagle3ConfigError] = []
    for name in names:
        try:
            _, _, st = resolve_checkpoint_file(src, name, what="side file")
            if st.st_size > MAX_SIDE_FILE_BYTES:
                raise conversion_error(
                    f"side file {name} is implausibly large",
                    where=str(src / name),
                    found=f"{st.st_size} bytes (at most {MAX_SIDE_FILE_BYTES})",
                )
        except Eagle3ConfigError as exc:
            refused.append(exc)
    if refused:
        raise conversion_error(
            f"the source's side file(s) {', '.join(Path(e.where).name for e in refused)} are refused: the converter "
            "copies "
            "nothing through a link out of SRC, nothing that is not a regular file, nothing implausibly large",
            where=str(src),
            found="; ".join(f"{e.where}: {e.found or e.what}" for e in refused),
            expected="regular files inside the source directory",
            fix="replace each link with the file it stands for (or remove it), then convert again",
        )
    return names


def _copy_side_files(src: Path, tmp: Path, names: list[str]) -> None:
    """Copy the checked side files through the safe open, each with no wider permissions than its source."""
    for name in names:
        with open_checkpoint_file(src, name, what="side file") as f:
            out = os.open(
                tmp / name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                _narrowed(f.stat.st_mode),
            )
            try:
                # pragma: no mutate core/NumberReplacer `(1`, `(-1`: a progress with neither bar nor callback: its total
                # is never shown
                _copy_range(f.fd, 0, min(f.size, MAX_SIDE_FILE_BYTES), out, _Progress(0, False))
            finally:
                os.close(out)


def _verify(path: Path, items: list[PlannedTensor], offsets: dict[str, tuple[int, int]]) -> None:
    """Re-read the written shard (the safetensors library validates it) and compare it with the plan."""
    try:
        h = read_header(path)
        tensors = h.tensors
    except CheckpointError as exc:
        raise conversion_error("the written shard does not read back", where=str(path), found=exc.what) from None
    # ``tensors`` holds exactly the names the library read (``read_header`` refuses duplicates), so
    # comparing it with the plan also compares the names
    want = {i.out: (i.src.dtype, i.src.shape, offsets[i.out]) for i in items}
    got = {n: (t.dtype, t.shape, (t.start, t.end)) for n, t in tensors.items()}
    if want != got:
        bad = sorted(n for n in want.keys() | got.keys() if want.get(n) != got.get(n))
        raise conversion_error(
            "the written shard's header does not match the plan",
            where=str(path),
            found=f"{len(bad)} tensor(s) differ; "
            + "; ".join(f"{n}: planned {want.get(n)}, written {got.get(n)}" for n in bad[:3]),
            expected="(dtype, shape, data offsets) as planned for every tensor",
        )
    if h.metadata.get("format") != "pt":  # what a PyTorch safetensors file declares (transformers reads it)
        raise conversion_error(
            "the written shard's metadata does not say format pt",
            where=str(path),
            found=str(h.metadata),
            expected="{'format': 'pt'}",
        )


# ====================================================================== entry point
def convert(
    src: os.PathLike | str,
    dst: os.PathLike | str,
    *,
    force: bool = False,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    aux_layer_ids: list[int] | None = None,
    drop_embed_tokens: bool = False,
    target: os.PathLike | str | None = None,
    sglang_version: str | None = None,
    progress: bool | Callable[[int, int], None] | None = None,
    run_doctor: bool = True,
    num_target_layers: int | None = None,
) -> ConvertResult:
    """Convert the speculators draft (or the original EAGLE repository's EAGLE-3 draft) at ``src`` into an
    SGLang-format draft at ``dst``.

    ``aux_layer_ids``: override the source's ids (speculators' meaning).  ``drop_embed_tokens``:
    leave out ``embed_tokens.weight`` (sglang uses the target's embedding anyway).
    ``target``: also run the doctor's target cross-checks (layer range, hidden, vocab) on the
    result.  ``target`` or ``num_target_layers``: the target's layer count (the EAGLE repository's ids
    are computed from it).  ``progress``: True for a progress bar, a ``callable(done, total)``, or None (a
    bar for large checkpoints on a terminal).  Raises :class:`ConvertError` /
    :class:`Eagle3ConfigError` with what / where / fix; on any failure DST is left untouched.
    """
    with _signals_interrupt():
        plan_args: dict[str, Any] = {"aux_layer_ids": aux_layer_ids, "drop_embed_tokens": drop_embed_tokens}
        plan_args |= {"target": target, "num_target_layers": num_target_layers}
        return _convert(src, dst, force, max_shard_size, sglang_version, progress, run_doctor, plan_args)


def _convert(src, dst, force, max_shard_size, sglang_version, progress, run_doctor, plan_args) -> ConvertResult:
    t0 = time.perf_counter()
    src_dir = checkpoint_dir(src, "source draft")
    shown = Path(dst)
    dst = _check_paths(src_dir, shown, force)
    # a killed --force run's DST is put back before anything is planned or copied: without --force it is then
    # refused at once, not after the whole copy
    cleaned = _remove_stale(dst)
    if not force and os.path.lexists(dst):
        raise conversion_error(
            "the destination already exists: a killed `--force` run had moved it aside, and it was put back",
            where=str(shown),
            found="; ".join(cleaned),
            fix="choose a new DST, or pass --force to replace it",
        )
    from_repo = eagle_repo.is_source(read_config(src_dir, "source draft"))
    plan = (eagle_repo.plan_eagle_repo if from_repo else plan_conversion)(src_dir, **plan_args)
    out_config, items, renamed, dropped, src_files = (
        plan.sglang_config,
        plan.items,
        plan.renamed,
        plan.dropped,
        plan.src_files,
    )
    limit = parse_size(max_shard_size)
    planned = shards(items, limit)
    total = sum(i.src.nbytes for i in items)
    side = _side_files(src_dir)
    config_mode = _narrowed(resolve_checkpoint_file(src_dir, "config.json", what="config")[2].st_mode)
    dir_mode = 0o755 & os.stat(src_dir).st_mode

    created = _make_parents(dst.parent)
    tmp = _temp_name(dst, "convert")
    try:
        with contextlib.closing(_Progress(total, progress)) as bar:  # the bar ends with the copying (or its failure)
            try:
                os.mkdir(tmp, dir_mode)
            except OSError as exc:
                raise _dst_error(exc, dst, "create the destination") from None
            _write_json(tmp / "config.json", out_config, config_mode, sort_keys=True)
            n = len(planned)
            names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
            weight_map: dict[str, str] = {}
            written: list[Path] = []
            for name, shard in zip(names, planned):
                path = tmp / name
                offsets = _write_shard(src_dir, path, shard, bar)
                _verify(path, shard, offsets)
                weight_map.update({i.out: name for i in shard})
                written.append(path)
            if n > 1:
                index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
                _write_json(tmp / "model.safetensors.index.json", index, config_mode)
            _copy_side_files(src_dir, tmp, side)
        report = None
        if run_doctor:
            report = check_draft(tmp, target=plan_args["target"], sglang_version=sglang_version)
            # the doctor checked the temporary directory: its report names DST (in every text field)
            report.findings[:] = [
                fnd.replace(**{k: v.replace(str(tmp), str(dst)) for k, v in vars(fnd).items() if isinstance(v, str)})
                for fnd in report.findings
            ]
            for key, value in list(report.facts.items()):
                if isinstance(value, str):
                    report.facts[key] = value.replace(str(tmp), str(dst))
            if report.errors:
                first = report.errors[0]
                raise conversion_error(
                    f"the converted draft fails the doctor's checks: {first.what}",
                    where=first.where,
                    found=first.found,
                    expected=first.expected,
                    fix=first.fix or "see `eagle3-patches doctor --draft` on the source",
                )
        _fsync_dir(tmp)
        _replace(tmp, dst, force)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_dirs(created)
        if isinstance(exc, OSError):
            raise _dst_error(exc, dst, "write the converted draft") from None
        raise
    src_from = out_config["eagle3_patches_converted_from"]
    return ConvertResult(
        src=src_dir,
        dst=shown,
        files=[shown / p.name for p in written],
        tensors=len(items),
        bytes_copied=total,
        seconds=time.perf_counter() - t0,
        config=out_config,
        renamed=renamed,
        dropped=dropped,
        report=report,
        cleaned=cleaned,
        serving=readers(carried(out_config)),
        notes=[
            f"read {len(src_files)} source shard(s)",
            f"aux ids {out_config['eagle_config']['eagle_aux_hidden_state_layer_ids']} (output-of-layer) from "
            f"{src_from['format']}'s {src_from['eagle_aux_hidden_state_layer_ids']} (input-of-layer)",
        ],
    )


# pragma: no mutate core/ReplaceFalseWithTrue: only the index takes the default, and its keys (`metadata`, `weight_map`,
# whose entries are sorted) are in order already
def _write_json(path: Path, obj: Any, mode: int, *, sort_keys: bool = False) -> None:
    data = (json.dumps(obj, indent=2, sort_keys=sort_keys) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _replace(tmp: Path, dst: Path, force: bool) -> None:
    """Rename ``tmp`` to ``dst``; with ``force`` an existing ``dst`` is moved aside first and removed after."""
    old = None
    if os.path.lexists(dst):
        if not force:  # appeared while we were writing
            raise conversion_error(
                "the destination appeared while converting", where=str(dst), fix="pass --force to replace it"
            )
        old = _temp_name(dst, "old")
        os.rename(dst, old)
    try:
        os.rename(tmp, dst)
    except BaseException:
        if old is not None:
            os.rename(old, dst)
        raise
    _fsync_dir(dst.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
