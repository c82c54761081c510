"""The converter's durability and owner-token edges: fsyncs, platforms without directory fds or /proc,
a --force replacement whose old tree cannot be fully removed, and the progress bar's units and end."""

from __future__ import annotations

import errno
import hashlib
import os
import pathlib
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_patches import convert as convert_mod
from eagle3_patches.convert import convert


def _tree_digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".eagle3-" in p.name]


# ------------------------------------------------------------------ owner tokens
def _fake_proc(monkeypatch, files: dict[str, object]) -> None:
    """Path.read_text of the given /proc paths returns the text given, or raises the exception given; every other
    path reads as usual."""
    real = pathlib.Path.read_text

    def read_text(self, *args, **kwargs):
        what = files.get(str(self))
        if what is None:
            return real(self, *args, **kwargs)
        if isinstance(what, BaseException):
            raise what
        if callable(what):
            return what()
        return what

    monkeypatch.setattr(pathlib.Path, "read_text", read_text)


def _no_proc(monkeypatch, *pids: int) -> None:
    """A platform without /proc: the pids' stat files are missing and so is /proc/self."""
    _fake_proc(
        monkeypatch,
        {f"/proc/{pid}/stat": FileNotFoundError(errno.ENOENT, "No such file", f"/proc/{pid}/stat") for pid in pids},
    )
    real_isdir = os.path.isdir
    monkeypatch.setattr(os.path, "isdir", lambda p: False if str(p) == "/proc/self" else real_isdir(p))


@pytest.fixture
def live_child():
    """A real, live child process (killed and reaped at the end)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


@pytest.fixture
def dead_pid():
    """The pid of a child that has exited and been reaped: no process has it."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _still_alive(child: subprocess.Popen) -> bool:
    try:
        child.wait(timeout=0.3)
    except subprocess.TimeoutExpired:
        return True
    return False


@pytest.mark.parametrize(
    "stat",
    [
        pytest.param(
            lambda pid: PermissionError(errno.EACCES, "Permission denied", f"/proc/{pid}/stat"), id="unreadable"
        ),
        pytest.param(lambda pid: f"{pid} (short) S 1 2 3\n", id="too-short"),
        pytest.param(lambda pid: lambda: b"\xff\xfe stat".decode(), id="not-utf8"),
    ],
)
def test_an_unusable_proc_stat_falls_back_to_the_liveness_check(monkeypatch, live_child, stat):
    """A /proc stat file that cannot be read (permission), is cut short, or is not UTF-8: the token of a live
    process falls back to "0" (alive by os.kill(pid, 0), which leaves it running) instead of the error escaping."""
    pid = live_child.pid
    _fake_proc(monkeypatch, {f"/proc/{pid}/stat": stat(pid)})
    assert convert_mod._process_token(pid) == "0"
    assert _still_alive(live_child)


def test_without_proc_a_dead_pid_has_no_token_and_a_live_one_has_zero(monkeypatch, live_child, dead_pid):
    """No /proc at all: os.kill(pid, 0) decides; the liveness probe leaves the live process alive."""
    _no_proc(monkeypatch, live_child.pid, dead_pid)
    assert convert_mod._process_token(live_child.pid) == "0"
    assert _still_alive(live_child)  # the probe is signal 0: it sends nothing
    assert convert_mod._process_token(dead_pid) is None


def test_an_unreadable_stat_of_a_live_child_probes_it_without_signalling_it(monkeypatch, live_child, dead_pid):
    """The fallback probe on a real child leaves it running, and tells a reaped child's pid as gone."""
    _fake_proc(
        monkeypatch,
        {f"/proc/{pid}/stat": PermissionError(errno.EACCES, "Permission denied") for pid in (live_child.pid, dead_pid)},
    )
    assert convert_mod._process_token(live_child.pid) == "0"
    assert _still_alive(live_child)
    assert convert_mod._process_token(dead_pid) is None


def test_a_pid_of_another_user_counts_as_alive(monkeypatch):
    """os.kill(pid, 0) refused with EPERM (the process exists but belongs to someone else): alive, token "0"."""
    pid = os.getpid()
    _no_proc(monkeypatch, pid)
    calls = []

    def kill(p, sig):
        calls.append((p, sig))
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "kill", kill)
    assert convert_mod._process_token(pid) == "0"
    assert calls == [(pid, 0)]


def test_the_start_time_is_read_after_the_last_parenthesis_of_the_command_name(monkeypatch):
    """A command name may itself contain ") ": the fields are counted after the last ')' of the stat line, so the
    token is the boot id prefix + the real start time (field 22)."""
    pid = os.getpid()
    fields = ["S"] + [str(1000 + i) for i in range(1, 45)]
    fields[19] = "987654"  # starttime
    stat_line = f"{pid} (evil) 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22) " + " ".join(fields) + "\n"
    _fake_proc(
        monkeypatch,
        {f"/proc/{pid}/stat": stat_line, "/proc/sys/kernel/random/boot_id": "0123abcd-4567-89ef-0123-456789abcdef\n"},
    )
    assert convert_mod._process_token(pid) == "0123abcd987654"


# ------------------------------------------------------------------ fsyncs
def test_the_shard_the_temp_dir_and_the_parent_are_fsynced_in_order(tiny, tmp_path, monkeypatch):
    """The output shard is fsynced with all its bytes written, the temporary directory before it is renamed to
    DST, and DST's parent after the rename (so the rename itself is durable)."""
    dst = tmp_path / "out"
    real_fsync = os.fsync
    synced = []

    def fsync(fd):
        st = os.fstat(fd)
        synced.append(
            (os.readlink(f"/proc/self/fd/{fd}"), st.st_size, os.path.isdir(f"/proc/self/fd/{fd}"), dst.exists())
        )
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    res = convert(tiny["speculators_draft"], dst, progress=False)
    monkeypatch.undo()
    shard = res.dst / "model.safetensors"
    size = shard.stat().st_size
    shards = [s for s in synced if not s[2]]
    assert len(shards) == 1
    path, got_size, _, dst_there = shards[0]
    assert Path(path).name == "model.safetensors" and ".out.eagle3-convert-" in Path(path).parent.name
    assert got_size == size and not dst_there
    dirs = [(p, there) for p, _, is_dir, there in synced if is_dir]
    temp_dirs = [i for i, (p, there) in enumerate(dirs) if Path(p).name.startswith(".out.eagle3-convert-")]
    parent = [i for i, (p, there) in enumerate(dirs) if Path(p) == tmp_path.resolve()]
    assert temp_dirs and parent, synced
    assert not dirs[temp_dirs[-1]][1]  # the temporary directory, before the rename
    assert dirs[parent[-1]][1] and parent[-1] > temp_dirs[-1]  # DST's parent, after it
    assert synced.index(shards[0]) < min(i for i, s in enumerate(synced) if s[2])


def test_a_platform_without_directory_fds_still_converts(tiny, tmp_path, monkeypatch):
    """Opening a directory for reading fails (no directory fds): the directory fsyncs are skipped, the draft is
    the same as on Linux."""
    ref = convert(tiny["speculators_draft"], tmp_path / "ref", progress=False)
    real_open = os.open
    refused = []

    def fake_open(path, flags, *args, **kwargs):
        if flags == os.O_RDONLY and "dir_fd" not in kwargs and os.path.isdir(path):
            refused.append(str(path))
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    res = convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
    monkeypatch.undo()
    assert refused  # the directory fsyncs did try
    assert _tree_digest(res.dst) == _tree_digest(ref.dst)
    assert sorted(_leftovers(tmp_path)) == []


def test_a_filesystem_that_reads_and_writes_short_gives_the_same_draft(tiny, tmp_path, monkeypatch):
    """A filesystem whose reads and writes may move fewer bytes than asked (FUSE and network filesystems do), on a
    platform without ``os.copy_file_range``: each read and write here moves one byte less than asked, so every
    buffer ends with a one-byte read and a one-byte write; the shards, config.json and side files are the same,
    byte for byte."""
    ref = convert(tiny["speculators_draft"], tmp_path / "ref", progress=False)
    real_pread, real_write = os.pread, os.write
    calls = {"pread": 0, "write": 0}

    def short_pread(fd, n, offset):
        calls["pread"] += 1
        return real_pread(fd, max(1, n - 1), offset)

    def short_write(fd, data):
        calls["write"] += 1
        return real_write(fd, bytes(data[: max(1, len(data) - 1)]))

    monkeypatch.delattr(os, "copy_file_range", raising=False)
    monkeypatch.setattr(os, "pread", short_pread)
    monkeypatch.setattr(os, "write", short_write)
    res = convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
    monkeypatch.undo()
    assert calls["pread"] and calls["write"]
    assert _tree_digest(res.dst) == _tree_digest(ref.dst)
    assert res.report.ok and _leftovers(tmp_path) == []


def test_a_filesystem_refusing_directory_fsync_still_converts(tiny, tmp_path, monkeypatch):
    """fsync of a directory fails with EINVAL (some filesystems): ignored, the draft is the same."""
    ref = convert(tiny["speculators_draft"], tmp_path / "ref", progress=False)
    real_fsync = os.fsync
    refused = []

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    res = convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
    monkeypatch.undo()
    assert refused
    assert _tree_digest(res.dst) == _tree_digest(ref.dst)
    assert _leftovers(tmp_path) == []


# ------------------------------------------------------------------ --force
def test_force_succeeds_when_the_old_destination_cannot_be_fully_removed(tiny, tmp_path, monkeypatch):
    """--force over a DST whose moved-aside old tree cannot be removed completely (a file that refuses unlink): the
    new draft is in place and the conversion succeeds; the old tree's remains are left, not an error."""
    ref = convert(tiny["speculators_draft"], tmp_path / "ref", progress=False)
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "a-stuck-file.bin").write_bytes(b"old")
    (dst / "z-other.bin").write_bytes(b"old")
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if os.fspath(path).endswith("a-stuck-file.bin"):
            raise PermissionError(errno.EPERM, "Operation not permitted", os.fspath(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    res = convert(tiny["speculators_draft"], dst, force=True, progress=False)
    monkeypatch.undo()
    assert res.dst == dst and _tree_digest(dst) == _tree_digest(ref.dst)
    assert not (dst / "a-stuck-file.bin").exists()
    left = _leftovers(tmp_path)
    assert len(left) == 1 and ".out.eagle3-old-" in left[0]
    assert (tmp_path / left[0] / "a-stuck-file.bin").exists()


# ------------------------------------------------------------------ progress bar
def test_the_progress_bar_counts_in_binary_units(capsys):
    """10225 bytes read 9.99k on the bar (KiB: divided by 1024, not 1000 or anything else)."""
    p = convert_mod._Progress(10225, True)
    p.update(10225)
    p.close()
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "9.99k/9.99k" in last, last


def test_the_progress_bar_is_finished_before_the_output_is_made_durable(tiny, tmp_path, monkeypatch, capsys):
    """The bar ends (its final line written, with a newline) as soon as the copying does: by the time the
    temporary directory is fsynced, stderr holds a finished 100% line."""
    real_fsync = os.fsync
    seen = []

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            seen.append(sys.stderr.getvalue())
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    convert(tiny["speculators_draft"], tmp_path / "out", progress=True)
    monkeypatch.undo()
    assert seen
    err = seen[0]
    assert err.endswith("\n"), repr(err[-200:])
    assert err.replace("\r", "\n").strip().splitlines()[-1].startswith("convert: 100%")
