"""Hostile checkpoints and destinations: doctor and convert never leak, hang, crash or leave debris.

Every input is built here.  The command-line cases run ``python -P -m eagle3_patches`` in a
subprocess with a timeout (a hang is a timeout, not a timing assertion), read its
``ru_maxrss`` from ``wait4`` where memory is the point, and are tallied: the last test of the
module checks the tally and puts "hostile cases run N, tracebacks 0, hangs 0, files leaked 0"
into pytest's summary.  A traceback, an ``internal-error`` finding, a hang or any leaked byte
or leftover file is a failure of its own case as well.  Each guard is also run on a correct
checkpoint, where it must stay silent.  docs/security.md is the threat model these cases test.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle3_patches.checkpoint.safe_io import RSS_BUDGET, CheckpointError, open_checkpoint_file
from eagle3_patches.checkpoint.safetensors_header import read_header
from eagle3_patches.doctor import doctor
from eagle3_patches.errors import Eagle3Error
from eagle3_patches.terminal import escape_terminal
from eagle3_patches.testing import tiny_models as tm

ROOT = Path(__file__).resolve().parents[2]
CLEAN = "0.5.11"  # a release without launch-flag faults: isolates the checkpoint findings
TALLY: Counter = Counter()


# ====================================================================== running cases
@dataclass
class Run:
    rc: int
    out: str
    err: str
    maxrss: int  # bytes: the child's own peak (VmHWM), see PEAK
    hung: bool

    @property
    def text(self) -> str:
        return self.out + self.err


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "EAGLE3_PATCHES_DEBUG"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


#: runs the CLI and reports the process's own peak RSS at exit.  Not wait4's ru_maxrss: Linux
#: carries the parent's peak into a child across (v)fork + exec, so a child of this test
#: process would report the test runner's memory, not its own.
PEAK = """
import atexit, os, sys
def peak():
    with open("/proc/self/status") as f:
        kb = next((line.split()[1] for line in f if line.startswith("VmHWM:")), "-1")
    os.write(2, f"\\n[peak-rss-kb {kb}]\\n".encode())
atexit.register(peak)
from eagle3_patches.cli import main
sys.exit(main(sys.argv[1:]))
"""


class Proc:
    """A command-line run in progress (``finish`` waits, with a hang timeout, and tallies it)."""

    def __init__(self, args, *, cwd=None, script: str | None = None, user: bool = False):
        flags = ["-P"] if sys.version_info >= (3, 11) else []
        argv = [sys.executable, *flags, *(["-c", script] if script else ["-m", "eagle3_patches"]), *map(str, args)]
        if user:
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        # SIGINT at its default, as for a command typed at a terminal: a shell's background job (a test run started
        # with `&`) inherits it ignored, and the command then rightly ignores Ctrl-C's signal too
        self.p = subprocess.Popen(
            argv,
            stdout=self.out,
            stderr=self.err,
            cwd=cwd,
            env=_env(),
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    def finish(self, timeout: float = 120) -> Run:
        hung = threading.Event()

        def kill():
            hung.set()
            os.killpg(self.p.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        _, status, usage = os.wait4(self.p.pid, 0)
        timer.cancel()
        self.p.returncode = os.waitstatus_to_exitcode(status)
        outs = []
        for f in (self.out, self.err):
            f.seek(0)
            outs.append(f.read().decode("utf-8", "replace"))
            f.close()
        peak = [line for line in outs[1].splitlines() if line.startswith("[peak-rss-kb ")]
        maxrss = int(peak[-1].split()[1].rstrip("]")) * 1024 if peak else usage.ru_maxrss * 1024
        run = Run(self.p.returncode, outs[0], outs[1], maxrss, hung.is_set())
        TALLY["run"] += 1
        TALLY["hangs"] += run.hung
        TALLY["tracebacks"] += "Traceback" in run.text or "internal-error" in run.text
        return run


def cli(*args, timeout: float = 120, **kw) -> Run:
    run = Proc(args, **kw).finish(timeout)
    assert not run.hung, f"hung: {args}"
    assert "Traceback" not in run.text and "internal-error" not in run.text, run.text
    return run


def leftovers(parent: Path, *, dst: Path | None = None, secrets: tuple[bytes, ...] = ()) -> list[str]:
    """Debris under ``parent``: temp dirs, a DST that must not exist, any file holding a secret."""
    problems = [f"temp dir {p.name}" for p in parent.iterdir() if ".eagle3-" in p.name]
    if dst is not None and os.path.lexists(dst):
        problems.append(f"{dst} exists")
    for dirpath, dirs, files in os.walk(parent):
        if Path(dirpath) == parent and "outside" in dirs:
            dirs.remove("outside")  # where the secret itself lives (the `secret` fixture)
        for name in files:
            p = Path(dirpath, name)
            if secrets and not p.is_symlink() and p.is_file() and any(s in p.read_bytes() for s in secrets):
                problems.append(f"secret in {p}")
    return problems


def assert_no_leak(parent: Path, **kw) -> None:
    problems = leftovers(parent, **kw)
    TALLY["leaked"] += bool(problems)
    assert not problems, problems


def in_process(fn):
    """One in-process hostile case: anything but an Eagle3Error (or an internal-error finding) is a traceback."""
    TALLY["run"] += 1
    try:
        result = fn()
    except Eagle3Error as exc:
        return exc
    except Exception:
        TALLY["tracebacks"] += 1
        raise
    if hasattr(result, "codes") and "internal-error" in result.codes():
        TALLY["tracebacks"] += 1
        raise AssertionError(result.format())
    return result


# ====================================================================== building inputs
def copy_checkpoint(src: Path, dst: Path, mode: int = 0o644) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        shutil.copyfile(f, dst / f.name)
        os.chmod(dst / f.name, mode)
    return dst


def write_header(path: Path, raw: bytes, data: bytes = b"") -> Path:
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    return path


def draft_with_header(root: Path, tiny, raw: bytes, data: bytes = b"") -> Path:
    d = root / "draft"
    d.mkdir()
    shutil.copyfile(tiny["draft"] / "config.json", d / "config.json")
    write_header(d / "model.safetensors", raw, data)
    return d


@pytest.fixture
def secret(tmp_path) -> tuple[Path, bytes]:
    """A file outside every checkpoint, with content that must never reach a DST or the terminal."""
    token = f"TOP-SECRET-{uuid.uuid4().hex}".encode()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "id_rsa").write_bytes(token + b"\n")
    return outside / "id_rsa", token


@pytest.fixture
def src(tmp_path, tiny) -> Path:
    """A speculators draft of our own (world-readable copies)."""
    return copy_checkpoint(tiny["speculators_draft"], tmp_path / "src")


@pytest.fixture
def draft(tmp_path, tiny) -> Path:
    return copy_checkpoint(tiny["draft"], tmp_path / "draft")


def doctor_cli(*args, version=CLEAN, **kw) -> Run:
    return cli("doctor", "--sglang-version", version, *args, **kw)


# ====================================================================== 1. links and special files
def test_convert_copies_no_secret_through_side_file_links(src, tmp_path, secret):
    path, token = secret
    os.symlink(path, src / "vocab.txt")
    os.symlink("/proc/self/environ", src / "generation_config.json")
    os.symlink(path.parent, src / "merges.txt")  # a directory, through a link
    run = cli("convert", src, tmp_path / "out", "--no-progress")
    assert run.rc == 1
    for name in ("vocab.txt", "generation_config.json", "merges.txt"):
        assert name in run.err
    assert token.decode() not in run.text and "HF_TOKEN" not in run.text
    assert_no_leak(tmp_path, dst=tmp_path / "out", secrets=(token,))


def test_shard_linked_out_of_the_checkpoint_is_not_read(src, tmp_path, tiny, secret):
    _, token = secret
    outside = tmp_path / "outside" / "model.safetensors"
    shutil.copyfile(tiny["speculators_draft"] / "model.safetensors", outside)
    (src / "model.safetensors").unlink()
    os.symlink(outside, src / "model.safetensors")
    run = cli("convert", src, tmp_path / "out", "--no-progress")
    assert run.rc == 1 and "resolves outside the checkpoint" in run.err and "model.safetensors" in run.err
    assert_no_leak(tmp_path, dst=tmp_path / "out", secrets=(token,))
    run = doctor_cli("--draft", src)
    assert run.rc == 1 and "[unsafe-file]" in run.out


@pytest.mark.parametrize("sibling", ["draft-private", "draft2", "draft.bak"])
def test_a_link_into_a_sibling_whose_name_starts_with_the_checkpoints_is_outside(tmp_path, tiny, sibling):
    """``models/draft/config.json -> ../draft-private/config.json``: the sibling's path starts with the
    checkpoint's as a string, but it is another directory; nothing in it is read."""
    models = tmp_path / "models"
    draft = copy_checkpoint(tiny["draft"], models / "draft")
    private = models / sibling
    private.mkdir()
    token = f"TOP-SECRET-{uuid.uuid4().hex}"
    (private / "config.json").write_text(json.dumps({**json.loads((draft / "config.json").read_text()), "x": token}))
    (draft / "config.json").unlink()
    os.symlink(f"../{sibling}/config.json", draft / "config.json")
    with pytest.raises(CheckpointError, match="resolves outside the checkpoint directory") as refused:
        open_checkpoint_file(draft, "config.json")
    assert refused.value.found == f"-> {private / 'config.json'}"
    run = doctor_cli("--draft", draft)
    assert run.rc == 1 and "[unsafe-file]" in run.out and token not in run.text


def test_a_hub_snapshot_may_link_into_its_blobs_but_not_into_a_sibling_named_like_it(tmp_path, tiny):
    repo = tmp_path / "hub" / "models--org--draft"
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    for blobs in ("blobs", "blobs-evil"):
        (repo / blobs).mkdir()
        shutil.copyfile(tiny["draft"] / "config.json", repo / blobs / "c")
    os.symlink("../../blobs/c", snap / "config.json")
    os.symlink("../../blobs-evil/c", snap / "generation_config.json")
    with open_checkpoint_file(snap, "config.json") as f:
        assert f.size > 0
    with pytest.raises(CheckpointError, match="resolves outside"):
        open_checkpoint_file(snap, "generation_config.json")


def test_index_path_through_a_root_link_is_refused(draft, tmp_path):
    os.symlink("/", draft / "sub")
    wm = {n: "model.safetensors" for n in tm.tensor_names(draft)}
    wm["stolen"] = "sub/etc/passwd"
    (draft / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    run = doctor_cli("--draft", draft)
    assert run.rc == 1 and "[unsafe-file]" in run.out and "sub/etc/passwd" in run.out
    assert "root:" not in run.text and "header length" not in run.text
    assert_no_leak(tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "loop", "dangling"])
def test_special_files_named_like_weights_are_refused_by_name(draft, tmp_path, kind):
    f = draft / "model.safetensors"
    f.unlink()
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "directory":
        f.mkdir()
    elif kind == "device":
        try:
            os.mknod(f, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")
    elif kind == "loop":
        os.symlink("model.safetensors", f)
    else:
        os.symlink("gone.safetensors", f)
    run = doctor_cli("--draft", draft, timeout=60)
    assert run.rc == 1 and "model.safetensors" in run.out
    assert {
        "fifo": "FIFO",
        "directory": "is a directory",
        "device": "character device",
        "loop": "symlink loop",
        "dangling": "dangling link",
    }[kind] in run.out
    assert "holds no *.safetensors" not in run.out


def test_fifo_config_and_side_file_never_block(src, tmp_path):
    os.mkfifo(src / "tokenizer_config.json.tmp")  # not on the allow-list: ignored, never opened
    (src / "merges.txt").unlink(missing_ok=True)
    os.mkfifo(src / "merges.txt")
    run = cli("convert", src, tmp_path / "out", "--no-progress", timeout=60)
    assert run.rc == 1 and "merges.txt" in run.err and "FIFO" in run.err
    assert_no_leak(tmp_path, dst=tmp_path / "out")
    (src / "config.json").unlink()
    os.mkfifo(src / "config.json")
    run = doctor_cli("--draft", src, timeout=60)
    assert run.rc == 1 and "config.json is a FIFO" in run.out


def test_kernel_state_is_no_checkpoint(tiny):
    run = doctor_cli("--draft", "/proc/self")
    assert run.rc == 1 and "kernel state" in run.out
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):  # a tmpfs models are copied to: fine
        shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
        try:
            report = in_process(
                lambda: doctor(tiny["deepseek_v3"], copy_checkpoint(tiny["draft"], shm / "draft"), sglang_version=CLEAN)
            )
            assert report.ok, report.format()
        finally:
            shutil.rmtree(shm, ignore_errors=True)


def test_hugging_face_cache_layout_is_read(tmp_path, tiny):
    """The one allowed link target outside the directory: ``snapshots/<rev>/f -> ../../blobs/<hash>``."""
    repo = tmp_path / "hub" / "models--org--draft"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        blob = repo / "blobs" / uuid.uuid4().hex
        shutil.copyfile(tiny["draft"] / f, blob)
        os.symlink(os.path.relpath(blob, snap), snap / f)
    report = in_process(lambda: doctor(tiny["deepseek_v3"], snap, sglang_version=CLEAN))
    assert report.ok and "unsafe-file" not in report.codes(), report.format()
    # ... but not a link from the snapshot to anywhere else, nor a blobs/ that is itself a link
    os.symlink(tiny["draft"] / "tokenizer.json", snap / "tokenizer.json")
    with pytest.raises(CheckpointError, match="resolves outside"):
        open_checkpoint_file(snap, "tokenizer.json")
    shutil.rmtree(repo / "blobs")
    os.symlink(tiny["draft"], repo / "blobs")
    report = in_process(lambda: doctor(None, snap, sglang_version=CLEAN))
    assert "unsafe-file" in report.codes()


def test_links_inside_the_checkpoint_are_read(draft, tiny):
    (draft / "weights").mkdir()
    (draft / "model.safetensors").rename(draft / "weights" / "model.safetensors")
    os.symlink("weights/model.safetensors", draft / "model.safetensors")
    report = in_process(lambda: doctor(tiny["deepseek_v3"], draft, sglang_version=CLEAN))
    assert report.ok, report.format()


@pytest.mark.parametrize("mode", [0o600, 0o644, 0o640])
def test_dst_files_are_never_wider_than_their_source(src, tmp_path, mode):
    for f in src.iterdir():
        os.chmod(f, mode)
    run = cli("convert", src, tmp_path / "out", "--no-progress")
    assert run.rc == 0, run.text
    for f in (tmp_path / "out").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) & ~mode == 0, (f.name, oct(f.stat().st_mode))
    assert {f.name for f in (tmp_path / "out").iterdir()} >= {"tokenizer.json", "config.json", "model.safetensors"}


# ====================================================================== 2. CPU and memory
def test_long_shape_of_huge_dims_is_refused_in_linear_time(tmp_path, tiny):
    """5 MB of 20-digit dims: the unbounded product once took minutes; now refused like safetensors does."""
    dims = ",".join(["18446744073709551615"] * 240_000)
    raw = ('{"fc.weight":{"dtype":"BF16","shape":[' + dims + '],"data_offsets":[0,2]}}').encode()
    d = draft_with_header(tmp_path, tiny, raw, b"\0\0")
    run = doctor_cli("--draft", d, timeout=60)
    assert run.rc == 1 and "[safetensors-header]" in run.out and "64 bits" in run.out


def _rss_case(root: Path, tiny, kind: str) -> Path:
    d = root / kind
    d.mkdir()
    shutil.copyfile(tiny["draft"] / "config.json", d / "config.json")
    if kind == "index-64MB":
        shutil.copyfile(tiny["draft"] / "model.safetensors", d / "model.safetensors")
        entries, size, i = [], 0, 0
        while size < 64_000_000:
            name = f"language_model.model.layers.{i % 61}.mlp.experts.{i % 384}.gate_proj.weight_packed_{i}"
            e = f'    "{name}": "model.safetensors",\n'
            entries.append(e)
            size += len(e)
            i += 1
        (d / "model.safetensors.index.json").write_text(
            '{"weight_map": {\n' + "".join(entries).rstrip(",\n") + "\n}}\n"
        )
        return d
    if kind == "header-40MB-rank":
        raw = b'{"x":{"dtype":"U8","shape":[' + b",".join([b"1"] * 19_999_980) + b'],"data_offsets":[0,1]}}'
        data = b"\0"
    else:  # a 40 MB header of 100k tensors with long names: within the parse budget, so parsed
        n, pad = 100_000, "x" * 330
        raw = (
            "{"
            + ",".join(
                f'"{pad}.{i:07d}.weight":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i in range(n)
            )
            + "}"
        ).encode()
        raw += b" " * (40_000_000 - len(raw))
        data = b"\0" * n
    write_header(d / "model.safetensors", raw, data)
    return d


@pytest.mark.parametrize("kind", ["header-40MB", "header-40MB-rank", "index-64MB"])
def test_memory_stays_within_the_stated_budget(tmp_path, tiny, kind, figure):
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc/self/status to read the peak RSS from")
    d = _rss_case(tmp_path, tiny, kind)
    run = cli("doctor", "--sglang-version", CLEAN, "--draft", d, "-q", script=PEAK, timeout=300)
    assert run.rc == 1  # each is refused (budget) or fails the draft checks
    assert run.maxrss <= RSS_BUDGET, f"{kind}: {run.maxrss >> 20} MiB > {RSS_BUDGET >> 20} MiB"
    figure(f"hostile {kind}: doctor peak RSS {run.maxrss >> 20} MiB (budget {RSS_BUDGET >> 20} MiB)")


@pytest.mark.parametrize(
    "where",
    ["header-shape", "header-offsets", "config-int", "config-float", "index-metadata", "config-nesting"],
)
def test_absurd_numbers_and_nesting_are_messages(tmp_path, tiny, where):
    big = "9" * 5000
    d = tmp_path / "draft"
    copy_checkpoint(tiny["draft"], d)
    if where.startswith("header"):
        shape, offs = (big, "0,2") if where == "header-shape" else ("1", f"0,{big}")
        write_header(
            d / "model.safetensors",
            f'{{"fc.weight":{{"dtype":"BF16","shape":[{shape}],"data_offsets":[{offs}]}}}}'.encode(),
            b"\0\0",
        )
        needle = "[safetensors-header]"
    elif where == "index-metadata":
        wm = {n: "model.safetensors" for n in tm.tensor_names(d)}
        (d / "model.safetensors.index.json").write_text(
            '{"metadata": {"total_size": ' + big + '}, "weight_map": ' + json.dumps(wm) + "}"
        )
        needle = "absurd number"
    else:
        text = (d / "config.json").read_text()
        value = {"config-int": big, "config-float": "1." + big, "config-nesting": "[" * 100_000 + "]" * 100_000}[where]
        (d / "config.json").write_text(text.replace('"hidden_size": 64', f'"hidden_size": {value}'))
        needle = "absurd number" if where != "config-nesting" else "not valid JSON"
    run = doctor_cli("--draft", d)
    assert run.rc == 1 and needle in run.out, run.out


@pytest.mark.parametrize("rank, ok", [(64, True), (65, False)])
def test_rank_beyond_what_frameworks_load_is_refused(tmp_path, rank, ok):
    raw = json.dumps({"x": {"dtype": "U8", "shape": [1] * rank, "data_offsets": [0, 1]}}).encode()
    f = write_header(tmp_path / "x.safetensors", raw, b"\0")
    result = in_process(lambda: read_header(f).tensors)
    assert isinstance(result, Eagle3Error) != ok, result
    if not ok:
        assert "65 dimensions" in result.what


def test_findings_of_one_kind_are_capped(tmp_path, tiny, make_draft):
    import torch

    def many(t):
        t.update({f"extra.{i}.weight": torch.zeros(2, dtype=torch.uint8) for i in range(200)})

    report = in_process(lambda: doctor(tiny["deepseek_v3"], make_draft("many", tensors=many), sglang_version=CLEAN))
    dtype = [f for f in report.findings if f.code == "tensor-dtype"]
    assert len(dtype) == 21 and "180 more [tensor-dtype]" in dtype[-1].what, [f.what for f in dtype[-2:]]


# ====================================================================== 3. destinations and odd shapes
def test_dst_with_a_file_as_a_component(src, tmp_path):
    (tmp_path / "afile").write_text("mine")
    run = cli("convert", src, tmp_path / "afile" / "sub" / "out", "--no-progress")
    assert run.rc == 1 and "is not a directory" in run.err and "afile" in run.err
    assert (tmp_path / "afile").read_text() == "mine"
    assert_no_leak(tmp_path)


def test_dst_dot_and_parents_of_the_working_directory(src, tmp_path):
    for dst in (".", "..", "/"):
        run = cli("convert", src, dst, "--no-progress", "--force", cwd=tmp_path)
        assert run.rc == 1 and "DST must name a new directory" in run.err, run.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_read_only_parent_as_a_non_root_user(tiny):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    root = Path(tempfile.mkdtemp(prefix="eagle3-hostile-"))
    try:
        os.chmod(root, 0o755)
        s = copy_checkpoint(tiny["speculators_draft"], root / "src")
        os.chmod(s, 0o755)
        ro = root / "ro"
        ro.mkdir(mode=0o555)
        os.chmod(ro, 0o555)
        probe = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "true"], capture_output=True
        )
        if probe.returncode != 0:
            pytest.skip(f"cannot drop to uid 65534 here: {probe.stderr.decode().strip()}")
        run = cli("convert", s, ro / "out", "--no-progress", user=True)
        if "No module named" in run.err or "Permission denied" in run.err and "python" in run.err.lower():
            pytest.skip("uid 65534 cannot run this interpreter")
        assert run.rc == 1 and "Permission denied" in run.err and "choose a DST" in run.err, run.text
        run = cli("convert", s, ro / "new" / "out", "--no-progress", user=True)
        assert run.rc == 1 and "Permission denied" in run.err
        assert_no_leak(root, dst=ro / "out")
        assert list(ro.iterdir()) == []
    finally:
        os.chmod(root / "ro", 0o755) if (root / "ro").exists() else None
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("name", ["fc.weight", "lm_head.weight", "d2t", "midlayer.self_attn.q_proj.weight"])
@pytest.mark.parametrize("speculators", [False, True])
def test_zero_dim_tensor_where_a_matrix_is_expected(make_draft, tmp_path, tiny, name, speculators):
    import torch

    key = name.replace("midlayer.", "layers.0.") if speculators else name

    def zero_d(t):
        t[key] = torch.zeros((), dtype=t[key].dtype)

    d = make_draft("zero-d", speculators=speculators, tensors=zero_d)
    if speculators:
        run = cli("convert", d, tmp_path / "out", "--no-progress")
        assert_no_leak(tmp_path, dst=tmp_path / "out")
    else:
        run = doctor_cli("--target", tiny["deepseek_v3"], "--draft", d)
    assert (
        run.rc == 1
        and name in run.text
        and ("not a matrix" in run.text or "wrong shape" in run.text or "1-D" in run.text)
    ), run.text


def test_refused_conversion_removes_the_parents_it_created(src, tmp_path, secret):
    os.symlink(secret[0], src / "vocab.json")  # refused after planning, before writing
    run = cli("convert", src, tmp_path / "a" / "b" / "out", "--no-progress")
    assert run.rc == 1 and "vocab.json" in run.err
    assert not (tmp_path / "a").exists()
    assert_no_leak(tmp_path)


# ====================================================================== 4. signals and debris
SLOW = """
import sys, time
import eagle3_patches.convert as c
real = c._copy_range
def slow(*a, **k):
    time.sleep(0.3)
    return real(*a, **k)
c._copy_range = slow
from eagle3_patches.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _start_slow_convert(src: Path, dst: Path) -> Proc:
    proc = Proc(["convert", src, dst, "--no-progress"], script=SLOW)
    deadline = time.monotonic() + 60
    while not (dst.parent.exists() and any(".eagle3-convert-" in p.name for p in dst.parent.iterdir())):
        assert proc.p.poll() is None and time.monotonic() < deadline, "the conversion never started writing"
        time.sleep(0.05)
    time.sleep(0.4)  # inside the copy loop
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signals_clean_up_like_ctrl_c(src, tmp_path, sig):
    dst = tmp_path / "new" / "out"
    proc = _start_slow_convert(src, dst)
    proc.p.send_signal(sig)
    run = proc.finish(60)
    assert not run.hung and run.rc == 128 + sig, run.text
    assert "Traceback" not in run.text
    assert not (tmp_path / "new").exists(), list((tmp_path / "new").iterdir())
    assert_no_leak(tmp_path)


def test_sigkill_debris_is_removed_by_the_next_run(src, tmp_path):
    dst = tmp_path / "out"
    proc = _start_slow_convert(src, dst)
    proc.p.send_signal(signal.SIGKILL)
    proc.finish(60)
    stale = [p.name for p in tmp_path.iterdir() if ".eagle3-convert-" in p.name]
    assert len(stale) == 1 and not dst.exists()
    # a temp dir whose owner is alive (this test process, with its real token) is left alone
    from eagle3_patches import convert as convert_mod

    alive = convert_mod._temp_name(dst, "convert")
    alive.mkdir()
    run = cli("convert", src, dst, "--no-progress")
    assert run.rc == 0 and "removed" in run.out and stale[0] in run.out, run.text
    assert not (tmp_path / stale[0]).exists() and alive.exists()
    alive.rmdir()
    assert_no_leak(tmp_path)


# ====================================================================== 5. terminal injection
EVIL = "\x1b[2J\x1b[1;1H\x1b]52;c;cm0gLXJmIH4=\x07OK\r\nERROR   [fake] \u202eevil"


def test_untrusted_strings_are_escaped_on_the_terminal_and_exact_in_json(tiny, make_draft):
    def evil_cfg(cfg):
        cfg["architectures"] = [EVIL + "\ud800"]  # json.dumps writes the lone surrogate as an escape

    def evil_tensor(t):
        t["lm_head" + EVIL] = t.pop("norm.weight")

    d = make_draft("evil", config=evil_cfg, tensors=evil_tensor)
    run = doctor_cli("--target", tiny["deepseek_v3"], "--draft", d)
    assert run.rc == 1
    for raw in ("\x1b", "\x07", "\r", "\u202e"):
        assert raw not in run.text
    assert "\\x1b[2J" in run.out and "\\u202e" in run.out and "\\ud800" in run.out
    assert not any(line.startswith("ERROR   [fake]") for line in run.out.splitlines())
    run = doctor_cli("--target", tiny["deepseek_v3"], "--draft", d, "--json")
    report = json.loads(run.out)
    assert EVIL + "\ud800" in report["facts"]["draft"]  # exact
    assert any(EVIL in f["found"] for f in report["findings"] if f["code"] == "keys-unknown")
    assert "\x1b" not in run.out  # JSON escapes control characters itself


def test_untrusted_paths_in_convert_errors_are_escaped(tmp_path, tiny):
    s = copy_checkpoint(tiny["speculators_draft"], tmp_path / "src\x1b[31m\nfix: rm")
    os.symlink("/etc/hostname", s / "vocab.txt")
    run = cli("convert", s, tmp_path / "out", "--no-progress")
    assert run.rc == 1 and "\x1b" not in run.err and "src\\x1b[31m\\x0afix: rm" in run.err
    assert_no_leak(tmp_path, dst=tmp_path / "out")


def test_escape_helper_keeps_printable_text():
    assert escape_terminal("models/Kimi-K2.5 模型 ok") == "models/Kimi-K2.5 模型 ok"
    assert escape_terminal("a\x1b[0m\x9bb\u200b\ud800") == "a\\x1b[0m\\x9bb\\u200b\\ud800"
    assert escape_terminal("one\ntwo\x1b", keep_newlines=True) == "one\ntwo\\x1b"


# ====================================================================== 6. absurd values
@pytest.mark.parametrize("ids", [[2, 3, 2**64], [2, 3, 10**6]])
def test_convert_without_target_refuses_absurd_layer_ids(src, tmp_path, ids):
    run = cli("convert", src, tmp_path / "out", "--no-progress", "--aux-layer-ids", ",".join(map(str, ids)))
    assert run.rc == 1 and "not layer numbers" in run.err and "--aux-layer-ids" in run.err
    cfg = json.loads((src / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = ids
    (src / "config.json").write_text(json.dumps(cfg))
    run = cli("convert", src, tmp_path / "out", "--no-progress")
    assert run.rc == 1 and "eagle_aux_hidden_state_layer_ids" in run.err and str(ids[-1]) in run.err
    assert_no_leak(tmp_path, dst=tmp_path / "out")


def test_dot_slash_shard_names_are_the_same_shard(tmp_path, tiny, make_draft):
    d = make_draft("sharded", shards=2)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    wm = index["weight_map"]
    for i, name in enumerate(sorted(wm)):
        wm[name] = ("./" if i % 2 else "") + wm[name]
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    report = in_process(lambda: doctor(tiny["deepseek_v3"], d, sglang_version=CLEAN))
    assert report.ok and "duplicate-tensor" not in report.codes(), report.format()
    for bad in ("../model.safetensors", "/etc/passwd", ""):
        wm[sorted(wm)[0]] = bad
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
        report = in_process(lambda: doctor(None, d, sglang_version=CLEAN))
        assert "safetensors-index" in report.codes("error"), report.format()


# ====================================================================== 7. the sys.path[0] rule
def test_planted_modules_are_not_imported_with_dash_p(tmp_path, tiny):
    d = copy_checkpoint(tiny["draft"], tmp_path / "draft")
    (d / "numpy.py").write_text("raise SystemExit('planted numpy imported')\n")
    run = cli("doctor", "--sglang-version", CLEAN, "--draft", ".", cwd=d)  # cli() runs python -P
    assert "planted" not in run.text and run.rc in (0, 1)


# ====================================================================== guards silent on correct input
def test_every_guard_is_silent_on_a_correct_setup(tmp_path, tiny, src):
    run = doctor_cli("--target", tiny["kimi_k25"], "--draft", tiny["draft"])
    assert run.rc == 0, run.out
    assert "\\x" not in run.out and "unsafe-file" not in run.out and "more [" not in run.out
    run = cli("convert", src, tmp_path / "new" / "out", "--no-progress", "--target", tiny["kimi_k25"])
    assert run.rc == 0 and "note:" not in run.out, run.text  # nothing stale to remove
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= {
        p.name for p in (tmp_path / "new" / "out").iterdir()
    }
    assert_no_leak(tmp_path)


# ====================================================================== fuzzing (in process)
_fuzz = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12) | st.sampled_from(
    ["fc.weight", "d2t", "x\x1b[2J"]
)
BITS = {"U8": 8, "BF16": 16, "F32": 32, "I64": 64, "BOOL": 8, "F4": 4}
MUTATIONS = [
    "none",
    "none",
    "dim",
    "offset",
    "dtype",
    "duplicate",
    "huge-dims",
    "huge-with-zero",
    "rank-65",
    "metadata",
    "extra-field",
    "trailing",
    "truncated",
    "gap",
    "bigint",
    "pad",
]


@st.composite
def headers(draw):
    """A valid header (tensors tiling the data region), then at most one hostile mutation: (raw JSON, data bytes)."""
    tensors, pos = {}, 0
    for name in draw(st.lists(names, max_size=5, unique=True)):
        dtype = draw(st.sampled_from(sorted(BITS)))
        shape = draw(st.lists(st.integers(0, 6), max_size=3))
        n = 1
        for d in shape:
            n *= d
        if (n * BITS[dtype]) % 8:
            shape, n = shape + [2], n * 2
        size = n * BITS[dtype] // 8
        tensors[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + size]}
        pos += size
    header = dict(tensors)
    mutation = draw(st.sampled_from(MUTATIONS))
    first = next(iter(tensors.values()), None)
    if first is not None:
        if mutation == "dim":
            first["shape"] = first["shape"] + [draw(st.integers(0, 3))]
        elif mutation == "offset":
            first["data_offsets"][draw(st.integers(0, 1))] += draw(st.sampled_from([-1, 1, 2**64]))
        elif mutation == "dtype":
            first["dtype"] = draw(st.sampled_from(["Q7", "bf16", "", "F8_E4M3", "C64"]))
        elif mutation == "huge-dims":
            first["shape"] = [2**64 - 1] * draw(st.integers(2, 50))
        elif mutation == "huge-with-zero":
            first["shape"] = [0] + [2**64 - 1] * draw(st.integers(1, 5))
            first["data_offsets"] = [first["data_offsets"][0]] * 2
        elif mutation == "rank-65":
            first["shape"] = [1] * 65
        elif mutation == "extra-field":
            first["extra"] = [1, 2]
    if mutation == "metadata":
        header = {
            "__metadata__": draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3) | st.integers(), max_size=2)),
            **header,
        }
    raw = json.dumps(header).encode()
    if mutation == "duplicate" and tensors:
        name, entry = next(iter(tensors.items()))
        raw = raw[:-1] + b", " + json.dumps(name).encode() + b": " + json.dumps(entry).encode() + b"}"
    elif mutation == "bigint":
        raw = raw.replace(b"[", b"[" + b"9" * 4400 + b",", 1)
    elif mutation == "pad":
        raw += b" " * draw(st.integers(1, 9))
    data = b"\0" * (pos + (mutation == "trailing") - (mutation == "truncated" and pos > 0))
    if mutation == "gap" and first is not None:
        raw = raw.replace(b'"data_offsets": [0, ', b'"data_offsets": [1, ', 1)
    return raw, data


@_fuzz
@given(case=headers())
def test_fuzzed_headers_are_at_least_as_strict_as_safetensors(tmp_path, case):
    from safetensors import safe_open

    raw, data = case
    f = write_header(tmp_path / f"{uuid.uuid4().hex}.safetensors", raw, data)
    try:
        with safe_open(str(f), framework="numpy") as h:
            h.keys()
        library_ok = True
    except Exception:  # noqa: BLE001 - any refusal
        library_ok = False
    result = in_process(lambda: read_header(f).tensors)
    ours_ok = not isinstance(result, Eagle3Error)
    assert library_ok or not ours_ok, f"accepted what safetensors refuses: {raw[:300]!r}"
    if not ours_ok:
        assert result.what and result.where == str(f), result


index_values = st.text(max_size=20) | st.sampled_from(
    [
        "model.safetensors",
        "./model.safetensors",
        "../x.safetensors",
        "/etc/passwd",
        "sub/../model.safetensors",
        "a\x1b.safetensors",
        ".",
        "",
    ]
)


@_fuzz
@given(
    wm=st.dictionaries(names, index_values | st.integers() | st.none(), max_size=6),
    meta=st.one_of(st.none(), st.integers(), st.text(max_size=5), st.dictionaries(st.text(max_size=3), st.integers())),
)
def test_fuzzed_indexes_never_crash(tiny, wm, meta):
    with tempfile.TemporaryDirectory() as tmp:
        d = copy_checkpoint(tiny["draft"], Path(tmp) / "draft")
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": meta, "weight_map": wm}))
        report = in_process(lambda: doctor(None, d, sglang_version=CLEAN))
        assert not isinstance(report, Eagle3Error)
        report.format()
        json.loads(report.to_json())


config_values = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**31, 2**64, -(2**63), 10**19]),
    st.text(max_size=6),
    st.floats(allow_nan=True),
    st.lists(st.integers(-5, 2**65), max_size=4),
    st.none(),
)
CONFIG_KEYS = [
    "hidden_size",
    "vocab_size",
    "draft_vocab_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "target_hidden_size",
    "num_hidden_layers",
    "architectures",
]


@_fuzz
@given(
    edits=st.dictionaries(st.sampled_from(CONFIG_KEYS), config_values, min_size=1, max_size=4),
    ids=st.lists(st.integers(-(2**65), 2**65), max_size=4),
)
def test_fuzzed_configs_never_crash(tiny, edits, ids):
    with tempfile.TemporaryDirectory() as tmp:
        d = copy_checkpoint(tiny["draft"], Path(tmp) / "draft")
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(edits)
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
        (d / "config.json").write_text(json.dumps(cfg))
        report = in_process(lambda: doctor(tiny["deepseek_v3"], d, sglang_version=CLEAN, tp=8))
        assert not isinstance(report, Eagle3Error)
        escape_terminal(report.format())
        json.loads(report.to_json())


# ====================================================================== the figure (keep last)
def test_zz_hostile_summary(figure):
    if TALLY["run"] == 0:
        pytest.skip("no hostile case ran (deselected)")
    figure(
        f"hostile cases run {TALLY['run']}, tracebacks {TALLY['tracebacks']}, hangs {TALLY['hangs']}, files leaked "
        f"{TALLY['leaked']}"
    )
    assert TALLY["tracebacks"] == TALLY["hangs"] == TALLY["leaked"] == 0, dict(TALLY)


# ------------------------------------------------------------------ safe_io's rules, one by one
from eagle3_patches.checkpoint import safe_io  # noqa: E402


def _refusal(fn, *args, **kw):
    with pytest.raises(CheckpointError) as e:
        fn(*args, **kw)
    return e.value.diagnostic


def test_a_file_of_exactly_the_cap_is_read_one_byte_more_is_refused(tmp_path):
    (tmp_path / "config.json").write_bytes(b"x" * 100)
    assert safe_io.read_checkpoint_bytes(tmp_path, "config.json", max_bytes=100) == b"x" * 100
    d = _refusal(safe_io.read_checkpoint_bytes, tmp_path, "config.json", max_bytes=99)
    assert "implausibly large" in d.what and (d.found, d.expected) == ("100 bytes", "<= 99 bytes")


def test_a_file_that_grows_after_its_stat_is_refused(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_bytes(b"x" * 100)
    with open_checkpoint_file(tmp_path, "config.json") as f:
        (tmp_path / "config.json").write_bytes(b"x" * 101)  # the same inode, one byte longer
        assert "changed while being read" in _refusal(f.read_all, 100).what
    index = "model.safetensors.index.json"
    (tmp_path / index).write_bytes(b"x" * 100)
    with open_checkpoint_file(tmp_path, index, what="safetensors index") as f:
        (tmp_path / index).write_bytes(b"x" * 101)
        d = _refusal(f.read_all, 100, code="safetensors-index")
    assert d.code == "safetensors-index"  # the caller's class of problem, as for a file too large at its stat
    assert d.what == f"safetensors index {index} changed while being read", d.what


@pytest.mark.parametrize("content", [b"7", b"{}"])
def test_a_file_of_one_or_two_bytes_is_read_whole(tmp_path, content):
    """The smallest files are read as they are: ``7`` (one byte) is a JSON number, not an empty file."""
    (tmp_path / "config.json").write_bytes(content)
    assert safe_io.read_checkpoint_bytes(tmp_path, "config.json", max_bytes=16) == content
    with open_checkpoint_file(tmp_path, "config.json") as f:
        assert f.read_at(0, 16) == content and f.read_at(len(content) - 1, 16) == content[-1:]


def test_a_header_too_complex_to_parse_keeps_the_budgets_fix(tmp_path):
    """A header within the length bound whose structures cost more than the parse budget is refused before it is
    parsed, with the budget's own fix (no known tool writes such a header), not the generic one."""
    raw = b'{"a":[' + b"{}," * 3_000_000 + b"{}]}"
    assert safe_io.json_parse_cost(raw) > safe_io.JSON_PARSE_BUDGET
    (tmp_path / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    with pytest.raises(Eagle3Error) as err:
        read_header(tmp_path / "model.safetensors")
    d = err.value.diagnostic
    assert "too complex to parse" in d.what
    assert d.fix == "this is no checkpoint written by a known tool; re-download or re-export it", d.fix


def test_a_header_naming_a_tensor_twice_is_refused_through_the_json_reader(tmp_path):
    """The JSON reader hands each object's pairs to its caller's hook: the safetensors header's reader refuses a
    name given twice (the library keeps the last silently)."""
    entry = b'"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}'
    raw = b"{" + entry + b", " + entry + b"}"
    (tmp_path / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0")
    with pytest.raises(Eagle3Error) as err:
        read_header(tmp_path / "model.safetensors")
    d = err.value.diagnostic
    assert d.what == "safetensors header has a duplicate name" and "'x'" in d.found, d


def test_the_file_is_closed_after_its_block_and_a_read_after_close_is_refused(tmp_path):
    (tmp_path / "config.json").write_bytes(b"{}")
    with open_checkpoint_file(tmp_path, "config.json") as f:
        fd = f.fd
    assert f.fd == -1
    with pytest.raises(OSError):
        os.fstat(fd)
    f.close()  # twice: nothing to close
    assert "cannot read" in _refusal(f.read_at, 0, 2).what


@pytest.mark.parametrize("swapped_in", ["made-before", "made-after"])  # an inode number below and above the checked one
def test_a_file_swapped_between_the_check_and_the_open_is_refused(tmp_path, monkeypatch, swapped_in):
    (tmp_path / "made-before").write_bytes(b"{}")
    (tmp_path / "config.json").write_bytes(b"{}")
    (tmp_path / "made-after").write_bytes(b"{}")
    other = os.stat(tmp_path / swapped_in)
    fds = set(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(safe_io.os, "fstat", lambda fd: other)  # what fstat shows after a swap of the name
    assert "changed while being opened" in _refusal(open_checkpoint_file, tmp_path, "config.json").what
    monkeypatch.undo()
    assert set(os.listdir("/proc/self/fd")) == fds  # the descriptor it opened is closed


@pytest.mark.parametrize("hub_layout", [True, False])
def test_only_a_hub_cache_snapshot_may_link_into_its_blobs(tmp_path, hub_layout):
    repo = tmp_path / ("models--org--name" if hub_layout else "org-name")
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc123").write_bytes(b"{}")
    snap = repo / "snapshots" / "rev"
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to(repo / "blobs" / "abc123")
    link_out = tmp_path / "outside"
    link_out.write_bytes(b"{}")
    (snap / "vocab.txt").symlink_to(link_out)
    if hub_layout:
        assert safe_io.read_checkpoint_bytes(snap, "config.json", max_bytes=10) == b"{}"
    else:
        assert "resolves outside" in _refusal(safe_io.read_checkpoint_bytes, snap, "config.json", max_bytes=10).what
    d = _refusal(safe_io.read_checkpoint_bytes, snap, "vocab.txt", max_bytes=10)
    assert d.code == "unsafe-file" and d.found == f"-> {link_out}"
    assert d.expected.endswith(" (or the Hugging Face cache's blobs/)") == hub_layout, d.expected


def test_a_fifo_is_named_as_such_and_the_link_to_it_shown(tmp_path):
    os.mkfifo(tmp_path / "model.safetensors")
    direct = _refusal(open_checkpoint_file, tmp_path, "model.safetensors")
    assert direct.code == "unsafe-file" and direct.found == "FIFO (named pipe)"
    for alias in ("alias.safetensors", "zz-alias.safetensors"):  # named before and after what it points to
        (tmp_path / alias).symlink_to(tmp_path / "model.safetensors")
        linked = _refusal(open_checkpoint_file, tmp_path, alias)
        assert linked.found == f"FIFO (named pipe) (via link -> {tmp_path / 'model.safetensors'})"


@pytest.mark.parametrize("what, code", [("draft shard", "safetensors-index"), ("config", "not-a-checkpoint")])
def test_a_missing_file_is_named_by_what_it_is(tmp_path, what, code):
    d = _refusal(open_checkpoint_file, tmp_path, "model-00002-of-00002.safetensors", what=what)
    assert d.code == code and d.what == f"{what} model-00002-of-00002.safetensors is missing", d.what
    named = _refusal(open_checkpoint_file, tmp_path, "vocab.txt", what=f"{what} vocab.txt")  # the name said once
    assert named.what == f"{what} vocab.txt is missing", named.what


@pytest.mark.parametrize(
    "error, reason",
    [
        (PermissionError(errno.EACCES, os.strerror(errno.EACCES)), "permission denied"),
        (OSError("a filesystem's error without a number"), "OSError"),  # no errno, no strerror: named by its type
    ],
)
def test_an_open_that_fails_is_refused_by_name(tmp_path, monkeypatch, error, reason):
    (tmp_path / "config.json").write_bytes(b"{}")

    def fails(*a, **k):
        raise error

    monkeypatch.setattr(safe_io.os, "open", fails)
    d = _refusal(open_checkpoint_file, tmp_path, "config.json")
    assert d.what == f"cannot read file config.json: {reason}" and d.where == str(tmp_path / "config.json"), d.what
    named = _refusal(open_checkpoint_file, tmp_path, "config.json", what="draft config")  # as the caller says
    assert named.what == f"cannot read draft config config.json: {reason}", named.what


def test_a_file_opened_as_descriptor_0_is_closed_too(tmp_path):
    """A server started with its standard input closed gets descriptor 0 for the first file it opens."""
    (tmp_path / "config.json").write_bytes(b"{}")
    saved = os.dup(0)
    try:
        os.close(0)
        with open_checkpoint_file(tmp_path, "config.json") as f:
            assert f.fd == 0
        with pytest.raises(OSError):
            os.fstat(0)  # closed by the with block
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_the_library_reads_exactly_the_open_file(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"a": 1}')
    with open_checkpoint_file(tmp_path, "config.json") as f:
        assert f.library_path == f"/proc/self/fd/{f.fd}"  # the inode checked, whatever the name points to later
        (tmp_path / "config.json").unlink()
        with open(f.library_path, "rb") as again:
            assert again.read() == b'{"a": 1}'


def test_a_symlink_loop_is_an_unsafe_file_and_a_missing_directory_is_not(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop = _refusal(open_checkpoint_file, tmp_path, "a")
    assert loop.code == "unsafe-file" and "a symlink loop" in loop.what
    assert loop.found == f"OSError: {os.strerror(errno.ELOOP)}"
    missing = _refusal(safe_io.list_checkpoint_dir, tmp_path / "none")
    assert missing.code == "not-a-checkpoint"  # an errno without words of its own: the system's
    assert missing.what == f"cannot read the checkpoint directory {tmp_path / 'none'}: {os.strerror(errno.ENOENT)}"


def test_a_dangling_link_shows_where_it_points_and_a_missing_file_nothing(tmp_path):
    (tmp_path / "config.json").symlink_to(tmp_path / "gone.json")
    dangling = _refusal(open_checkpoint_file, tmp_path, "config.json")
    assert dangling.what == "file config.json is missing (a dangling link)", dangling.what
    assert dangling.found == f"-> {os.path.realpath(tmp_path)}/gone.json (does not exist)"
    missing = _refusal(open_checkpoint_file, tmp_path, "vocab.txt")
    assert missing.what == "file vocab.txt is missing" and not missing.found, (missing.what, missing.found)


def test_a_large_json_document_of_few_structures_is_parsed_a_deep_one_is_refused():
    big = json.dumps({"k": "x" * ((safe_io.JSON_PARSE_BUDGET // 48) + 1000)}).encode()
    assert 48 * len(big) > safe_io.JSON_PARSE_BUDGET  # over the quick bound: counted, and well within
    assert safe_io.load_json(big, what="config.json", where="w", code="config-json")["k"].startswith("xxx")
    nested = b"[" * (len(big) // 2) + b"]" * (len(big) // 2)
    d = _refusal(safe_io.load_json, nested, what="config.json", where="w", code="config-json")
    assert (
        "too complex to parse" in d.what
        and d.expected == f"<= {safe_io.JSON_PARSE_BUDGET >> 20} MiB (docs/security.md)"
    )
    assert d.found == f"{len(nested)} bytes, estimated {safe_io.json_parse_cost(nested) >> 20} MiB to parse"


def test_a_document_estimated_at_exactly_the_budget_is_parsed():
    at_budget = safe_io.JSON_PARSE_BUDGET // safe_io._PER_BYTE  # bytes; the budget is "at most"
    doc = b'{"k": "' + b"x" * (at_budget - 9) + b'"}'
    assert len(doc) == at_budget and safe_io.json_parse_cost(doc) == safe_io.JSON_PARSE_BUDGET
    assert len(safe_io.load_json(doc, what="config.json", where="w", code="config-json")["k"]) == at_budget - 9


def test_invalid_json_is_refused_with_the_parsers_words():
    d = _refusal(safe_io.load_json, b'{"a": }', what="config.json", where="w", code="config-json")
    assert d.what == "config.json is not valid JSON" and d.found.startswith("Expecting value"), d.found


def test_a_document_that_is_not_utf8_is_refused_with_the_bad_byte():
    d = _refusal(safe_io.load_json, b'{"a": "\xff"}', what="config.json", where="w", code="config-json")
    assert (d.code, d.what) == ("config-json", "config.json is not UTF-8") and "0xff in position 7" in d.found, d.found


def test_numbers_are_bounded_at_their_stated_lengths():
    ok_int, long_int = "9" * safe_io.MAX_INT_DIGITS, "9" * (safe_io.MAX_INT_DIGITS + 1)
    ok_float = "0." + "1" * (safe_io.MAX_FLOAT_CHARS - 2)
    assert safe_io.load_json(f"[{ok_int}, -{ok_int}, {ok_float}]".encode(), what="c", where="w", code="c")[0] == int(
        ok_int
    )
    for raw in (f"[{long_int}]", f"[{ok_float}1]"):
        assert "absurd number" in _refusal(safe_io.load_json, raw.encode(), what="c", where="w", code="c").what
    huge_int, huge_float = "1234567890" * 3, "0." + "1234567890" * 7
    shown = [
        _refusal(safe_io.load_json, f"[{n}]".encode(), what="c", where="w", code="c").found
        for n in (huge_int, huge_float)
    ]
    assert shown[0] == f"an integer with 30 digits (at most {safe_io.MAX_INT_DIGITS} accepted): {huge_int[:24]}..."
    assert shown[1] == f"a number of 72 characters (at most {safe_io.MAX_FLOAT_CHARS} accepted): {huge_float[:24]}..."


@pytest.mark.parametrize("root", ["/proc/self", "/sys/kernel", "/dev"])
def test_kernel_state_is_no_checkpoint_root(root):
    if not os.path.isdir(root):
        pytest.skip(f"no {root} here")
    d = _refusal(safe_io.checked_root, root, "draft")
    assert d.expected == "a checkpoint directory on a real filesystem" and "draft checkpoint" in d.fix


def test_the_budgets_are_the_ones_docs_security_md_states():
    doc = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    assert f"| **{safe_io.RSS_BUDGET >> 20} MiB** |" in doc
    assert f"| {safe_io.JSON_PARSE_BUDGET >> 20} MiB, estimated before parsing |" in doc
    assert safe_io.RSS_BUDGET % (1 << 20) == 0 and safe_io.JSON_PARSE_BUDGET % (1 << 20) == 0
    assert f"(no document costs more than {safe_io._PER_BYTE} bytes per byte)" in doc
    assert (
        f"({safe_io._COST_OBJECT} bytes per `{{`, {safe_io._COST_MEMBER} per `[` or `:`, {safe_io._COST_ITEM} per "
        f"`,`, and {safe_io._COST_BYTE} per byte of text)"
    ) in doc
    assert (
        f"| numbers | integers of at most {safe_io.MAX_INT_DIGITS} digits, float literals of at most "
        f"{safe_io.MAX_FLOAT_CHARS} characters |"
    ) in doc


def test_a_refused_read_says_which_file_of_the_checkpoint_and_its_class_of_problem(tmp_path):
    """The message names the kind of file the caller reads ("safetensors index"), the code is the caller's, and
    the fix says what to do: an oversized file is refused unread, and so is one that cannot be opened."""
    from eagle3_patches.checkpoint.safe_io import CheckpointError, read_checkpoint_bytes

    (tmp_path / "model.safetensors.index.json").write_bytes(b"{" + b" " * 64 + b"}")
    with pytest.raises(CheckpointError) as err:
        read_checkpoint_bytes(
            tmp_path, "model.safetensors.index.json", max_bytes=16, what="safetensors index", code="safetensors-index"
        )
    d = err.value.diagnostic
    assert d.code == "safetensors-index"
    assert d.what == "safetensors index model.safetensors.index.json is implausibly large"
    assert d.fix == "repair or re-download model.safetensors.index.json"


def test_an_unreadable_file_is_named_with_its_kind(tmp_path):
    from eagle3_patches.checkpoint.safe_io import CheckpointError, read_checkpoint_bytes

    (tmp_path / "locked.json").write_bytes(b"{}")
    os.chmod(tmp_path / "locked.json", 0)
    if os.access(tmp_path / "locked.json", os.R_OK):
        pytest.skip("this user reads files whatever their mode (root)")
    with pytest.raises(CheckpointError, match="draft config locked.json"):
        read_checkpoint_bytes(tmp_path, "locked.json", max_bytes=16, what="draft config")
