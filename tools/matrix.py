#!/usr/bin/env python3
"""The sglang release matrix: one isolated CPU venv per release, the behavioural suite,
``eagle3-patches status`` and ``eagle3-patches selftest`` in each, and docs/compat.md generated from the results.

    python tools/matrix.py                      # the full matrix (the pinned release to the newest) -> docs/compat.md
    python tools/matrix.py --releases 0.5.9,0.5.13
    python tools/matrix.py --releases 0.5.10..0.5.14
    python tools/matrix.py --ci                 # pinned + newest known -> .matrix/ci-report.md
    python tools/matrix.py --setup-only         # build the venvs only
    python tools/matrix.py --report-only        # regenerate the report from .matrix/results
    python tools/matrix.py --states-only        # only the patch states of docs/compat.md, from this code
    python tools/matrix.py --no-selftest        # leave `eagle3-patches selftest --json` out (quicker)

Each release gets ``.matrix/venv-<release>`` (gitignored): requirements-test.txt with the release's
own ``transformers`` (and ``openai``) pin read from the wheel's METADATA, the extras of
tools/matrix_releases.json (a release inherits those of the nearest listed release before it), torch 2.13.0 (CPU)
everywhere, then the sglang wheel with ``--no-deps`` and a ``.pth`` that puts this checkout on ``sys.path``
(nothing is written into the checkout).
A venv is rebuilt only when its inputs change.  It is built with ``uv`` (``uv venv --seed``, ``uv pip install``
with this machine's pip configuration passed on, and pip's rule of the best match across indexes) when uv is
installed, else with pip (``--installer`` forces one); both keep their cache in ``.matrix/cache`` for every
release.  Measured on this 2-core machine for sglang 0.5.10 (venv + requirements + sglang + torch, 2026-12-01):
pip 120.8 s with an empty cache and 164.9 s again (pip writes no cache here: nothing but torch is local, and
the index's answers are not cached), uv 40.4 s with an empty cache and 5.7 s with a warm one; all 19 releases
from an empty ``.matrix/`` about 2 min (2026-12-02).  uv writes no bytecode and the runs write theirs to
``.matrix/pycache/<release>`` (``PYTHONPYCACHEPREFIX``), once per release: without it every sglang child compiled
torch, transformers and sglang again (the full run took 14.0 min for two releases, 6.3 min with it).  Releases run
two side by side (``--jobs``), each process with one OpenMP thread per core it gets (one each: 5.3 min for the two).
``newest`` means the newest sglang on PyPI
(``pip index versions sglang``; ``newest-known`` when offline); ``newest-known`` is ``NEWEST_CHECKED`` of
eagle3_patches/checkpoint/releases.py, the newest release the library has been checked against, which CI runs (a new
upstream release must not turn CI red under an unrelated change; ``--ci`` says when there is one).

Exit status: 0 when every release ran green (no failed test, no failed patch, no import error, selftest exit 0).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import datetime as _dt
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

try:
    from packaging.version import Version
except ImportError:  # a bare interpreter: release numbers like 0.5.10.post1 compare well enough as tuples

    def Version(text: str) -> tuple:  # noqa: N802
        return tuple(int(x) if x.isdigit() else x for x in re.findall(r"\d+|[a-z]+", text))


ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / ".matrix"
DATA_FILE = ROOT / "tools" / "matrix_releases.json"
RELEASES_MODULE = ROOT / "eagle3_patches" / "checkpoint" / "releases.py"
REQUIREMENTS = ROOT / "requirements-test.txt"
COMPAT = ROOT / "docs" / "compat.md"
CI_REPORT = MATRIX / "ci-report.md"

#: the behavioural suite (tests/checkpoint, tests/fork and tests/distributed are release-independent
#: or need TP 2; the main CI job runs them on the pinned release)
BEHAVIOURAL = [
    "tests/unit",
    "tests/cpu",
    "tests/patches",
    "tests/sglang",
    "tests/probe/test_watchdog_on_sglang.py",
]  # the watchdog finds its hook per release
#: the real servers (tests/e2e): the EAGLE3 server on the tiny Kimi-K2.5 with the trained draft against the
#: server without speculation, --speculative-algorithm EAGLE refused, the speculators draft served as it is,
#: the watchdog, Qwen3-VL; and, from 0.5.11, a plain launch_server with the patches from sglang's plugin entry point
SERVER_FILE = "tests/e2e/test_server.py"
PLUGIN_SERVER_FILE = "tests/e2e/test_plugin_server.py"
#: from 0.5.12, the MLA draft (``Eagle3DeepseekV2ForCausalLM``) in the real server: the outputs of no speculation,
#: fc fed 3 x hidden, a draft missing a tensor refused at start
MLA_SERVER_FILE = "tests/e2e/test_mla_draft_server.py"
#: a prefill/decode pair (mooncake over TCP, sglang's router): the outputs of no speculation at the colocated accept
#: length, a prefill server without speculation refused by the decode server; CI runs it on the pinned release
PD_PAIR_FILE = "tests/e2e/test_pd_pair.py"
#: sampling at temperature 1.0, 0.6 and 0.3: the EAGLE3 server's sequences have the distribution of the server without
#: speculation (a permutation test), and its verify accepts draft tokens
SAMPLING_FILE = "tests/e2e/test_sampling.py"
#: image requests: one greedy batch of two sequences with images and two text-only ones through the sampling check's
#: EAGLE3 server (the tiny Kimi-K2.5 with its vision tower and processor): the outputs of no speculation, and the
#: draft fed each sequence's token embedding at its last prefill row (the probe)
IMAGE_FILE = "tests/e2e/test_image_requests.py"
FC_TEST = "tests/patches/test_kimi_k25_eagle3_delegation.py::test_patched_kimi_eagle3_feeds_3h_to_fc"
LAYER_TEST_FILE = "tests/patches/test_layer_id_convention.py"
#: the selftest checks those two tests assert on (the ``run_check`` fixture): where ``selftest`` runs in the
#: release, its checks give the two columns and the tests are not run a second time
FC_CHECK, LAYER_CHECK = "kimi_k25_eagle3_delegation", "layer_id_convention"
#: the EAGLE3 server's proof (the server without speculation as reference, EAGLE refused at start); the symptom
#: server (guards off) and the speculators draft served as it is stay in CI's pinned run
SERVER_TESTS = [
    f"{SERVER_FILE}::{name}"
    for name in (
        "test_eagle3_greedy_outputs_identical_to_no_speculation",
        "test_eagle3_accept_length_with_trained_draft",
        "test_eagle3_draft_fc_received_3h_inputs",
        "test_eagle_with_guard_on_is_refused_at_start",
    )
]
#: the full matrix, per release: the real servers (two, and the refused start; the plugin server from 0.5.11);
#: the patch states, the bug on stock, the real worker feeding 3 x H to fc and the layer-id convention come from
#: `status` and `selftest` (with --no-selftest the two tests of the same checks run instead: SELFTEST_TWINS).
#: --behavioural adds the behavioural suite (about 15 min more a release)
FULL_SELECTION = [*SERVER_TESTS, SAMPLING_FILE, IMAGE_FILE, PLUGIN_SERVER_FILE, MLA_SERVER_FILE, PD_PAIR_FILE]
SELFTEST_TWINS = {FC_CHECK: FC_TEST, LAYER_CHECK: LAYER_TEST_FILE}
#: --ci (CI's mode (c), the newest known release) runs what runs inside sglang's processes there: the behavioural suite
#: but tests/unit (the library's own logic, proven on the pinned release in mode (a); --behavioural runs it in every
#: release), the plugin server and the MLA draft's server; about 10 min on 2 cores
CI_SELECTION = [*(t for t in BEHAVIOURAL if t != "tests/unit"), PLUGIN_SERVER_FILE, MLA_SERVER_FILE]
TORCH_PIN = "torch==2.13.0"


# -- releases ----------------------------------------------------------------------------------
def release_facts(path: Path = RELEASES_MODULE) -> dict[str, str]:
    """``pinned`` and ``newest_known`` of the matrix: ``PINNED`` and ``NEWEST_CHECKED`` of the library's release
    module, their one place (read from its source, not imported: the matrix runs before any venv exists)."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and len(node.value.args) == 1
            and isinstance(node.value.args[0], ast.Constant)
        ):
            found[node.targets[0].id] = str(node.value.args[0].value)
    missing = [n for n in ("PINNED", "NEWEST_CHECKED") if n not in found]
    if missing:
        raise SystemExit(f'{path}: no `{missing[0]} = Version("...")` line; the matrix reads the releases from there')
    return {"pinned": found["PINNED"], "newest_known": found["NEWEST_CHECKED"]}


def load_data() -> dict:
    """tools/matrix_releases.json, with ``pinned`` and ``newest_known`` from the release module
    (:func:`release_facts`)."""
    data = json.loads(DATA_FILE.read_text())
    twice = sorted({"pinned", "newest_known"} & set(data))
    if twice:
        raise SystemExit(
            f"{DATA_FILE}: {twice[0]!r} is set there; the release module {RELEASES_MODULE.relative_to(ROOT)} is its "
            "one place: remove it from the data file"
        )
    return {**data, **release_facts()}


def host_python() -> str:
    return sys.executable


_PYPI: list[str] | None = None


def pypi_releases() -> list[str] | None:
    """Every final sglang release on PyPI (``pip index versions sglang``: .postN included, pre/dev releases
    left out), oldest first; None when the index cannot be reached."""
    global _PYPI
    if _PYPI is None:
        try:
            out = subprocess.run(
                [host_python(), "-m", "pip", "index", "versions", "sglang"], capture_output=True, text=True, timeout=120
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        m = re.search(r"^Available versions: (.+)$", out, re.M)
        if not m:
            return None
        found = [v.strip() for v in m.group(1).split(",") if re.fullmatch(r"\d+(\.\d+)*(\.post\d+)?", v.strip())]
        _PYPI = sorted(set(found), key=Version)
    return _PYPI


def newest_release(data: dict) -> str:
    live = pypi_releases()
    return live[-1] if live else data["newest_known"]


def _alias(r: str, data: dict, newest: str) -> str:
    if r == "newest":
        return newest_release(data) if newest == "live" else data["newest_known"]
    if r == "newest-known":
        return data["newest_known"]
    if r == "pinned":
        return data["pinned"]
    return r


def _known_offline(data: dict) -> list[str]:
    """The releases this machine knows of without the index: the data file's and those with a wheel in the cache."""
    known = {data["pinned"], data["newest_known"], *data.get("releases", {})}
    known |= {p.name.split("-")[1] for p in (MATRIX / "wheels").glob("sglang-*.whl")}
    return sorted(known, key=Version)


def resolve_releases(spec: list[str], data: dict, newest: str = "live") -> list[str]:
    """Release names, aliases ('pinned', 'newest', 'newest-known') and ranges ``A..B`` (every final release on
    PyPI from A to B, both included; offline: those :func:`_known_offline` knows, with a warning) -> releases.
    ``newest="known"`` reads 'newest' as 'newest-known'."""
    out: list[str] = []
    for r in spec:
        r = r.strip()
        if not r:
            continue
        if ".." in r:
            lo, hi = (Version(_alias(x.strip(), data, newest)) for x in r.split("..", 1))
            listed = pypi_releases()
            if listed is None:
                log(f"NOTE: PyPI unreachable: {r} covers only the releases known here")
                listed = _known_offline(data)
            out += [v for v in listed if lo <= Version(v) <= hi and v not in out]
            continue
        r = _alias(r, data, newest)
        if r not in out:
            out.append(r)
    return out


def release_extras(version: str, data: dict) -> list[str]:
    """The extras of ``version``: those of its own entry in the data file, else of the nearest listed release
    before it that has ``extra`` (a release needs what its predecessor needed until the data file says otherwise)."""
    entries = data.get("releases", {})
    listed = sorted((v for v in entries if "extra" in entries[v] and Version(v) <= Version(version)), key=Version)
    return list(entries[listed[-1]]["extra"]) if listed else []


# -- environments -------------------------------------------------------------------------------
#: this run's log (.matrix/logs/run-<start>.log), kept as the evidence of a generated table; set by main()
RUN_LOG: Path | None = None
#: the cores each of the releases run side by side gets (--jobs): every process of a release runs this many OpenMP
#: threads; set by main()
RELEASE_THREADS: int | None = None


def log(msg: str) -> None:
    line = f"[matrix {time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    if RUN_LOG is not None:
        with open(RUN_LOG, "a") as fh:
            fh.write(line + "\n")


def wheel_for(version: str, pip_python: str) -> Path:
    wheels = MATRIX / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    subprocess.run(
        [pip_python, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={version}", "-d", str(wheels)],
        check=True,
        capture_output=True,
        text=True,
    )
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if not found:
        raise RuntimeError(f"pip download sglang=={version} gave no wheel")
    return found[0]


def metadata_pins(wheel: Path, names: list[str]) -> dict[str, str]:
    """``{name: "name==X"}`` for the unconditional Requires-Dist pins of ``names`` in the wheel's METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    pins: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if ";" in req:  # extras / platform markers: not the base install
            continue
        m = re.match(r"([A-Za-z0-9_.\-]+)\s*(\[[^\]]*\])?\s*(.*)$", req)
        if m and m.group(1).lower() in names and m.group(3):
            pins[m.group(1).lower()] = m.group(1) + m.group(3).replace(" ", "")
    return pins


def _req_name(line: str) -> str | None:
    m = re.match(r"\s*([A-Za-z0-9_.\-]+)", line.split("#", 1)[0])
    return m.group(1).lower() if m else None


def requirements_for(version: str, wheel: Path, data: dict) -> tuple[str, dict]:
    extra = release_extras(version, data)
    bare = [e.lower() for e in extra if re.fullmatch(r"[A-Za-z0-9_.\-]+", e)]
    names = [n.lower() for n in data.get("pins_from_metadata", [])]
    pins = metadata_pins(wheel, names + bare)
    extra = [pins.get(e.lower(), e) if e.lower() in bare else e for e in extra]
    lines = []
    for line in REQUIREMENTS.read_text().splitlines():
        name = _req_name(line)
        if name == "torch":
            lines.append(TORCH_PIN)
        elif name in pins:
            lines.append(pins[name] + f"  # sglang {version}'s pin (wheel METADATA)")
        else:
            lines.append(line)
    if extra:
        lines.append(f"# extras for sglang {version} (tools/matrix_releases.json)")
        lines.extend(extra)
    return "\n".join(lines) + "\n", pins


def venv_python(version: str) -> Path:
    return MATRIX / f"venv-{version}" / "bin" / "python"


def write_checkout_metadata(site: Path) -> Path:
    """The checkout's distribution metadata next to its ``.pth``, as an install writes it: name, version and the
    entry points of pyproject.toml (the console script, and the ``sglang.srt.plugins`` entry point that sglang
    >= 0.5.11 loads in each of its processes), so that ``importlib.metadata`` and sglang's ``load_plugins()``
    find eagle3-patches in the release venv.  The code itself is the checkout's (the ``.pth``)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # the version is dynamic (pyproject.toml reads it from eagle3_patches/version.py, its one place)
    version = re.search(r'^__version__ = "([^"]+)"', (ROOT / "eagle3_patches" / "version.py").read_text(), re.M)
    if version is None:
        raise SystemExit('eagle3_patches/version.py holds no `__version__ = "..."` line')
    project["version"] = version.group(1)
    for old in site.glob("eagle3_patches-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    dist = site / f"eagle3_patches-{project['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    (dist / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in eps.items()) + "\n"
            for group, eps in groups.items()
        )
    )
    (dist / "INSTALLER").write_text("tools/matrix.py (the checkout, through eagle3_patches_checkout.pth)\n")
    (dist / "RECORD").write_text("")
    return dist


CACHE = MATRIX / "cache"  # shared by every release's set-up: .matrix/cache/pip, .matrix/cache/uv


def uv_binary() -> str | None:
    """The ``uv`` executable (PATH, or next to this interpreter), None when it is not installed."""
    found = shutil.which("uv")
    if found:
        return found
    beside = Path(host_python()).with_name("uv")
    return str(beside) if beside.exists() else None


def pip_config_for_uv() -> list[str]:
    """This machine's pip configuration (find-links, constraints, index URLs: ``pip config list``, which reads
    the config files and the ``PIP_*`` variables) as ``uv pip install`` options: uv reads neither."""
    try:
        out = subprocess.run(
            [host_python(), "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    values: dict[str, str] = {}
    for line in out.splitlines():
        m = re.match(r"^[^.]*\.([a-z-]+)='(.*)'$", line.strip())
        if m:
            values.setdefault(m.group(1), m.group(2))  # pip lists the environment (which wins) first
    args = ["--index-strategy", "unsafe-best-match"]  # pip's rule: the best match across every index
    for key, flag in (
        ("index-url", "--index-url"),
        ("extra-index-url", "--extra-index-url"),
        ("find-links", "--find-links"),
        ("constraint", "--constraint"),
    ):
        for item in values.get(key, "").split():
            local = item[7:] if item.startswith("file://") else (item if "://" not in item else None)
            if local is not None and not Path(local).exists():
                continue  # pip notes and skips a missing local location; uv would fail on it
            args += [flag, item]
    return args


def installer_commands(py: Path, req_file: Path, wheel: Path, installer: str) -> list[list[str]]:
    """The install steps of a release venv, with uv or with pip (both with their cache under .matrix/cache)."""
    if installer == "uv":
        base = [
            uv_binary(),
            "pip",
            "install",
            "-q",
            "--python",
            str(py),
            "--cache-dir",
            str(CACHE / "uv"),
            *pip_config_for_uv(),
        ]
        return [
            base + ["-r", str(req_file)],
            base + ["--no-deps", "--reinstall", str(wheel)],
            base + [TORCH_PIN],
        ]  # nothing may have replaced it
    base = [str(py), "-m", "pip", "install", "-q", "--cache-dir", str(CACHE / "pip")]
    return [base + ["-r", str(req_file)], base + ["--no-deps", "--force-reinstall", str(wheel)], base + [TORCH_PIN]]


def choose_installer(requested: str = "auto") -> str:
    """``uv`` when it is installed (measured faster here: docs/compat.md), else ``pip``; ``requested`` forces one."""
    if requested == "auto":
        return "uv" if uv_binary() else "pip"
    if requested == "uv" and not uv_binary():
        raise SystemExit("--installer uv: uv is not installed (pip install uv)")
    return requested


def setup_release(version: str, data: dict, installer: str = "pip") -> dict:
    """Create (or reuse) the release's venv; returns {ok, seconds, pins, installer, error}."""
    t0 = time.time()
    venv = MATRIX / f"venv-{version}"
    logs = MATRIX / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    logfile = logs / f"setup-{version}.log"
    py = venv_python(version)
    try:
        wheel = wheel_for(version, host_python())
        req_text, pins = requirements_for(version, wheel, data)
        pyproject = (ROOT / "pyproject.toml").read_text()
        digest = hashlib.sha256((req_text + wheel.name + str(ROOT) + pyproject).encode()).hexdigest()[:16]
        stamp = venv / f".matrix-env-{digest}"
        if stamp.exists() and py.exists():
            return {"ok": True, "seconds": round(time.time() - t0, 1), "pins": pins, "reused": True}
        req_file = MATRIX / f"requirements-{version}.txt"
        req_file.write_text(req_text)
        log(
            f"{version}: installing with {installer} ({', '.join(pins.values()) or 'no pins'}) -> "
            f"{venv.relative_to(ROOT)}"
        )
        with open(logfile, "w") as fh:
            if not py.exists():
                cmd = (
                    [uv_binary(), "venv", "-q", "--seed", "--python", host_python(), str(venv)]
                    if installer == "uv"
                    else [host_python(), "-m", "venv", str(venv)]
                )
                fh.write("$ " + " ".join(cmd) + "\n")
                fh.flush()
                subprocess.run(cmd, check=True, stdout=fh, stderr=subprocess.STDOUT, text=True)
            venv_s = round(time.time() - t0, 1)
            for cmd in installer_commands(py, req_file, wheel, installer):
                fh.write("$ " + " ".join(cmd) + "\n")
                fh.flush()
                r = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, text=True)
                if r.returncode:
                    raise RuntimeError(
                        f"`{' '.join(Path(c).name if i == 0 else c for i, c in enumerate(cmd[:5]))} ...` "
                        f"failed (see {logfile.relative_to(ROOT)})"
                    )
        site = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        Path(site, "eagle3_patches_checkout.pth").write_text(str(ROOT) + "\n")
        write_checkout_metadata(Path(site))
        for old in venv.glob(".matrix-env-*"):
            old.unlink()
        stamp.touch()
        return {
            "ok": True,
            "seconds": round(time.time() - t0, 1),
            "venv_seconds": venv_s,
            "pins": pins,
            "reused": False,
            "installer": installer,
        }
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return {
            "ok": False,
            "seconds": round(time.time() - t0, 1),
            "pins": {},
            "installer": installer,
            "error": f"{type(exc).__name__}: {exc}",
        }


# -- running ------------------------------------------------------------------------------------
def _env(version: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")
    }
    # bytecode in a tree of the release's own under .matrix/, written by the first process that imports a module:
    # nothing is written into the checkout, and no process compiles torch, transformers and sglang from source
    # again (uv installs no bytecode; without it importing sglang's model runner took 11.4 s a process, with it 3.5 s)
    env["PYTHONPYCACHEPREFIX"] = str(MATRIX / "pycache" / version)
    # tiny checkpoints are release-independent, but releases run side by side (--jobs): one cache each
    env["EAGLE3_TINY_CACHE"] = str(MATRIX / "tiny" / version)
    if RELEASE_THREADS:  # torch's default is a thread per core in every process: two releases side by side then
        # oversubscribe the cores (measured on 2 cores, two releases: 6.3 min with the default, 5.3 min with one each)
        env.setdefault("OMP_NUM_THREADS", str(RELEASE_THREADS))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    return env


def run_status(version: str) -> dict:
    py = venv_python(version)
    t0 = time.time()
    r = subprocess.run(
        [str(py), "-m", "eagle3_patches", "status", "--cpu-profile", "--json"],
        capture_output=True,
        text=True,
        cwd=str(MATRIX),
        env=_env(version),
        timeout=600,
    )
    try:
        report = json.loads(r.stdout)
    except ValueError:
        tail = (r.stderr or r.stdout).strip().splitlines()
        return {
            "ok": False,
            "error": tail[-1] if tail else f"exit {r.returncode}",
            "seconds": round(time.time() - t0, 1),
        }
    report["ok"] = r.returncode == 0
    report["seconds"] = round(time.time() - t0, 1)
    return report


def run_selftest(version: str, timeout: int) -> dict:
    """``eagle3-patches selftest --json`` in the release's venv (CPU: the GPU checks are skipped, with the reason)."""
    py = venv_python(version)
    t0 = time.time()
    try:
        r = subprocess.run(
            [str(py), "-m", "eagle3_patches", "selftest", "--json"],
            capture_output=True,
            text=True,
            cwd=str(MATRIX),
            env=_env(version),
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"did not finish within {timeout} s", "seconds": round(time.time() - t0, 1)}
    try:
        report = json.loads(r.stdout)
    except ValueError:
        tail = (r.stderr or r.stdout).strip().splitlines()
        return {
            "ok": False,
            "error": tail[-1] if tail else f"exit {r.returncode}",
            "seconds": round(time.time() - t0, 1),
        }
    report["ok"] = r.returncode == 0 and report.get("exit_code") == 0
    report["rc"] = r.returncode
    report["wall_seconds"] = round(time.time() - t0, 1)
    return report


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line[:300]
    return ""


def _why(case: ET.Element) -> str:
    """The first line of the failure: the exception line of the report (E ...), else the message."""
    for tag in ("failure", "error"):
        el = case.find(tag)
        if el is None:
            continue
        body = el.text or ""
        e_lines = [ln[1:].strip() for ln in body.splitlines() if ln.startswith("E ")]
        # the innermost exception is the last "E   SomeError: ..." line that names a type
        named = [ln for ln in e_lines if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt|Failed)\b", ln)]
        if named:
            return named[-1][:300]
        if e_lines:
            return e_lines[0][:300]
        return _first_line(el.get("message")) or _first_line(body)
    return ""


def run_suite(version: str, selection: list[str], timeout: int) -> dict:
    py = venv_python(version)
    out_dir = MATRIX / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    junit = out_dir / f"junit-{version}.xml"
    log_file = MATRIX / "logs" / f"pytest-{version}.log"
    if junit.exists():
        junit.unlink()
    (MATRIX / "tiny" / version).mkdir(parents=True, exist_ok=True)
    cmd = [
        str(py),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "junit_family=xunit1",
        f"--junitxml={junit}",
        "--timeout=600",
        *selection,
    ]
    t0 = time.time()
    with open(log_file, "w") as fh:
        try:
            r = subprocess.run(
                cmd, cwd=str(ROOT), env=_env(version), stdout=fh, stderr=subprocess.STDOUT, timeout=timeout
            )
            rc = r.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    seconds = round(time.time() - t0, 1)
    result = {
        "rc": rc,
        "seconds": seconds,
        "passed": 0,
        "failed": 0,
        "skipped": 0,
        "errors": 0,
        "failures": [],
        "skips": {},
        "log": str(log_file.relative_to(ROOT)),
        "tests": {},
    }
    if not junit.exists():
        tail = log_file.read_text().strip().splitlines()
        result["failures"].append({"test": "(pytest)", "why": tail[-1] if tail else f"pytest exit {rc}"})
        result["errors"] = 1
        return result
    root = ET.parse(junit).getroot()
    for case in root.iter("testcase"):
        cls = case.get("classname", "")
        file = case.get("file") or (cls.replace(".", "/") + ".py")
        name = f"{file}::{case.get('name')}"
        if case.find("skipped") is not None:
            result["skipped"] += 1
            reason = _first_line(case.find("skipped").get("message"))
            result["skips"][reason] = result["skips"].get(reason, 0) + 1
            state = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            kind = "failed" if case.find("failure") is not None else "errors"
            result[kind] += 1
            result["failures"].append({"test": name, "why": _why(case)})
            state = "failed"
        else:
            result["passed"] += 1
            state = "passed"
        result["tests"][name] = state
    return result


def run_release(
    version: str,
    data: dict,
    selection: list[str],
    timeout: int,
    setup_only: bool,
    selftest: bool = True,
    installer: str = "pip",
) -> dict:
    res: dict = {"release": version, "started": _dt.datetime.now().isoformat(timespec="seconds")}
    log(f"{version}: set-up")
    res["setup"] = setup_release(version, data, installer)
    if not res["setup"]["ok"]:
        log(f"{version}: set-up failed: {res['setup']['error']}")
        return res
    if setup_only:
        return res
    log(f"{version}: eagle3-patches status --cpu-profile --json")
    res["status"] = run_status(version)
    if selftest:
        log(f"{version}: eagle3-patches selftest --json")
        res["selftest"] = run_selftest(version, timeout)
        st = res["selftest"]
        log(
            f"{version}: selftest "
            + (
                f"{st['summary']['passed']} passed, {st['summary']['failed']} failed, "
                f"{st['summary']['skipped']} skipped in {st['seconds']}s"
                if "summary" in st
                else f"did not report: {st.get('error')}"
            )
        )
    log(f"{version}: pytest {' '.join(selection)}")
    res["suite"] = run_suite(version, selection, timeout)
    s = res["suite"]
    log(
        f"{version}: {s['passed']} passed, {s['failed']} failed, {s['errors']} errors, {s['skipped']} skipped "
        f"in {s['seconds']}s"
    )
    (MATRIX / "results" / f"{version}.json").write_text(json.dumps(res, indent=2))
    return res


# -- the report ---------------------------------------------------------------------------------
SHORT = {
    "applied": "applied",
    "upstream": "upstream",
    "not-applicable": "not-applicable",
    "failed": "FAILED",
    "not-selected": "not-selected",
    "disabled": "disabled",
    "pending": "pending",
    "in-source": "in-source",
}


def _check_verdict(res: dict, check: str) -> str:
    """The selftest check ``check`` where selftest ran in the release, else its twin test in the suite."""
    found = next((c for c in (res.get("selftest") or {}).get("checks", []) if c["name"] == check), None)
    if found is None:
        return _file_verdict(res, SELFTEST_TWINS[check])
    if found["status"] == "passed":
        return "yes"
    return f"{'no' if found['status'] == 'failed' else found['status']} (selftest: {_md(found['reason'])[:200]})"


def _file_verdict(res: dict, path: str) -> str:
    """yes (every test of ``path`` passed, or passed and skipped), skipped (why), no (what failed) or not run."""
    suite = res.get("suite") or {}
    tests = {k: v for k, v in suite.get("tests", {}).items() if path in k}
    if not tests:
        return "not run"
    states = set(tests.values())
    if states == {"skipped"}:
        why = next((r for r in suite.get("skips", {}) if r), "")
        return "skipped" + (f" ({why})" if why and len(suite.get("skips", {})) == 1 else "")
    if states <= {"passed", "skipped"}:
        return "yes"
    failed = [k for k, v in tests.items() if v == "failed"]
    why = next((f["why"] for f in suite.get("failures", []) if f["test"] in failed), "")
    return f"no ({len(failed)} failed{': ' + why if why else ''})"


def _selftest_cell(res: dict) -> str:
    st = res.get("selftest")
    if st is None:
        return "not run"
    if "summary" not in st:
        return f"no report ({_md(st.get('error', '?'))})"
    s = st["summary"]
    return f"{s['passed']}/{s['failed']}/{s['skipped']}"


def _selftest_section(res: dict) -> list[str]:
    """The release's ``eagle3-patches selftest --json``: one row per check."""
    st = res.get("selftest")
    if st is None:
        return []
    if "checks" not in st or st.get("error"):
        return [f"`eagle3-patches selftest` did not report: `{_md(st.get('error', '?'))}`", ""]
    out = [
        f"`eagle3-patches selftest --json` ({st['device_text']}): exit {st['exit_code']} in {st['seconds']} s.",
        "",
        "| check | patch state | bug on stock | result | with the patch set on / why skipped |",
        "|---|---|---|---|---|",
    ]
    for c in st["checks"]:
        detail = c["reason"] if c["status"] != "passed" else c["patched"]
        out.append(f"| `{c['name']}` | {c['state'] or '-'} | {c['bug'] or '-'} | {c['status']} | {_md(detail)[:220]} |")
    return out + [""]


def _upstream_section(results: list[dict], names: list[str]) -> list[str]:
    """Per patch, the releases of this run in each state, and the first where the installed sglang had the fix:
    what each release's upstream probe reported (``status``), not a version written in a patch's range."""
    ran = [r for r in results if (r.get("status") or {}).get("patches")]
    if not ran:
        return []
    out = [
        "### Where each fix is upstream, as the probe saw it",
        "",
        "| patch | first release with the fix upstream | applied in | not-applicable in | other |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        seen = [
            (r["release"], next((p["state"] for p in r["status"]["patches"] if p["name"] == name), "-")) for r in ran
        ]
        first = next((v for v, st in seen if st == "upstream"), None)
        later = [v for v, st in seen if first and st == "applied" and Version(v) > Version(first)]
        first_cell = (first or "none in this run") + (f" (applied again in {', '.join(later)}: look)" if later else "")
        by = {st: [v for v, s2 in seen if s2 == st] for st in dict.fromkeys(s2 for _, s2 in seen)}
        other = ", ".join(
            f"{st}: {_span(vs, ran)}" for st, vs in by.items() if st not in ("applied", "not-applicable", "upstream")
        )
        out.append(
            f"| `{name}` | {first_cell} | {_span(by.get('applied', []), ran)} | "
            f"{_span(by.get('not-applicable', []), ran)} | "
            f"{other or '-'} |"
        )
    return out + [""]


def _span(versions: list[str], ran: list[dict]) -> str:
    """Releases as runs of consecutive releases of this run: ``0.5.9-0.5.12, 0.5.15``."""
    order = [r["release"] for r in ran]
    if not versions:
        return "-"
    runs: list[list[str]] = []
    for v in versions:
        if runs and order.index(v) == order.index(runs[-1][-1]) + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _started(results: list[dict]) -> str:
    """When the run began (its first release's start; now when none has run yet)."""
    stamps = [r["started"] for r in results if r.get("started")]
    when = _dt.datetime.fromisoformat(min(stamps)) if stamps else _dt.datetime.now()
    return when.strftime("%Y-%m-%d %H:%M")


def render(results: list[dict], command: str, selection: list[str], total_s: float) -> str:
    names: list[str] = []
    for res in results:
        for p in (res.get("status") or {}).get("patches", []):
            if p["name"] not in names:
                names.append(p["name"])
    lines = [
        "# Compatibility across sglang releases",
        "",
        "Generated by `tools/matrix.py`; do not edit by hand. Regenerate with:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Run {_started(results)} on {platform.machine()} "
        f"({os.cpu_count()} cores, no GPU, CPU profile), Python {platform.python_version()}, torch 2.13.0 CPU in "
        f"every venv; {total_s / 60:.1f} min in all. Test selection: `{' '.join(selection)}`.",
        "",
        "States are `eagle3-patches status --cpu-profile --json` in each release's venv: **applied** (patched "
        "here), **upstream** (the installed sglang has the fix), **not-applicable** (the release is outside "
        "the patch's range, or the code it targets is not what it was written for; sglang left untouched), "
        "**not-selected** (an opt-in patch, not asked for). *3 x H at fc*: the real EAGLE worker (`EAGLEWorker`; "
        "`EAGLEWorkerV2`, the only one from 0.5.13) on the tiny Kimi-K2.5 "
        f"fed `[tokens, 3 x hidden]` to the draft's `fc` (selftest's check `{FC_CHECK}`, which `{FC_TEST}` asserts "
        f"on; that test instead with --no-selftest). *Layer ids*: draft ids `[2, 3, 4]` (library convention, output "
        "of layer i) captured exactly the outputs of layers 2, 3, 4, compared with forward hooks on the decoder "
        f"layers (selftest's check `{LAYER_CHECK}`; `{LAYER_TEST_FILE}` with --no-selftest). *selftest*: "
        "`eagle3-patches selftest --json` in the release's venv (per patch, the bug observed on stock sglang and "
        "the behaviour with the patch set on; the GPU checks are skipped on this CPU machine, each with its reason). "
        f"*EAGLE3 server*: `{SERVER_FILE}` - the real `sglang.launch_server` on CPU: EAGLE3 with the trained draft "
        "gives the outputs of the server without speculation at accept length >= 2.0, the probe sees `fc` fed 3 x "
        "hidden, `--speculative-algorithm EAGLE` is refused at start (the tests of that file in the selection). "
        f"*sampling*: `{SAMPLING_FILE}` - an EAGLE3 server at temperature 1.0 (top-k 4), 0.6 (top-p 0.95, "
        "top-k 4) and 0.3 (top-k 4): its sequences have the distribution of the server without speculation (a "
        "permutation test, false-alarm rate 1e-3), and its verify accepts draft tokens. "
        f"*images*: `{IMAGE_FILE}` - a batch of two image and two text sequences through that EAGLE3 server: the "
        "outputs of no speculation, and the draft fed each sequence's token embedding at its last prefill row. "
        f"*plugin server*: `{PLUGIN_SERVER_FILE}` - a plain `python -m sglang.launch_server` (no "
        "`eagle3-patches run`) gets the patch set from sglang's plugin entry point in every process (0.5.11+). "
        f"*PD pair*: `{PD_PAIR_FILE}` - a prefill and a decode server behind sglang's router, mooncake over TCP: "
        "the outputs of no speculation at the colocated EAGLE3 accept length, a prefill server without speculation "
        "refused by the decode server.",
        "",
    ]
    head = [
        "sglang",
        "transformers",
        *names,
        "suite (pass/fail/skip)",
        "selftest (pass/fail/skip)",
        "3 x H at fc",
        "layer ids",
        "EAGLE3 server",
        "sampling",
        "images",
        "plugin server",
        "PD pair",
    ]
    lines.append("| " + " | ".join(f"`{h}`" if h in names else h for h in head) + " |")
    lines.append("|" + "---|" * len(head))
    for res in results:
        v = res["release"]
        pins = (res.get("setup") or {}).get("pins", {})
        tf = pins.get("transformers", "").split("==")[-1] or "?"
        if not (res.get("setup") or {}).get("ok"):
            rest = " | ".join(["set-up failed", *["-"] * (len(head) - len(names) - 3)])
            lines.append(f"| {v} | {tf} | " + " | ".join("-" for _ in names) + f" | {rest} |")
            continue
        states = {p["name"]: p for p in (res.get("status") or {}).get("patches", [])}
        cells = [SHORT.get(states[n]["state"], states[n]["state"]) if n in states else "-" for n in names]
        s = res.get("suite") or {}
        suite = f"{s.get('passed', 0)}/{s.get('failed', 0) + s.get('errors', 0)}/{s.get('skipped', 0)}"
        lines.append(
            f"| {v} | {tf} | "
            + " | ".join(cells)
            + f" | {suite} | {_selftest_cell(res)} | {_check_verdict(res, FC_CHECK)} | "
            f"{_check_verdict(res, LAYER_CHECK)} | {_file_verdict(res, SERVER_FILE)} | "
            f"{_file_verdict(res, SAMPLING_FILE)} | {_file_verdict(res, IMAGE_FILE)} | "
            f"{_file_verdict(res, PLUGIN_SERVER_FILE)} | "
            f"{_file_verdict(res, PD_PAIR_FILE)} |"
        )
    lines.append("")
    lines += _upstream_section(results, names)
    lines += [
        "## Appendix: the evidence, release by release",
        "",
        "What each release's venv held, what `status` said and what the suite and `selftest` did there.",
        "",
    ]
    for res in results:
        v = res["release"]
        setup = res.get("setup") or {}
        lines += [f"### sglang {v}", ""]
        if not setup.get("ok"):
            lines += [f"Set-up failed: `{_md(setup.get('error', '?'))}`", ""]
            continue
        pins = ", ".join(f"`{p}`" for p in setup.get("pins", {}).values())
        how = "reused" if setup.get("reused") else f"built with {setup.get('installer', 'pip')}"
        lines.append(f"venv `.matrix/venv-{v}` ({pins}; set-up {setup.get('seconds')} s, {how}).")
        lines.append("")
        note = load_data().get("releases", {}).get(v, {}).get("note")
        if note:
            lines += [f"Note: {note}", ""]
        status = res.get("status") or {}
        if not status.get("patches"):
            lines += [f"`eagle3-patches status` failed: `{_md(status.get('error', '?'))}`", ""]
        else:
            lines += ["| patch | state | reason |", "|---|---|---|"]
            for p in status["patches"]:
                lines.append(f"| `{p['name']}` | {p['state']} | {_md(p['reason'])} |")
            for err, modules in (status.get("import_errors") or {}).items():
                lines.append(f"| (import `{'`, `'.join(modules)}`) | error | {_md(err)} |")
            lines.append("")
        lines += _selftest_section(res)
        s = res.get("suite") or {}
        lines.append(
            f"Suite: {s.get('passed', 0)} passed, {s.get('failed', 0)} failed, {s.get('errors', 0)} errors, "
            f"{s.get('skipped', 0)} skipped in {s.get('seconds', 0)} s (log `{s.get('log', '')}`)."
        )
        lines.append("")
        if s.get("failures"):
            lines += ["| failing test | why (first line of the failure) |", "|---|---|"]
            for f in s["failures"]:
                lines.append(f"| `{_md(f['test'])}` | {_md(f['why'])} |")
            lines.append("")
        if s.get("skips"):
            lines += ["| skipped | tests |", "|---|---|"]
            for reason, n in sorted(s["skips"].items(), key=lambda kv: -kv[1]):
                lines.append(f"| {_md(reason)} | {n} |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


STATES_NOTE = "Patch states refreshed"
_CELL = re.compile(r"(?<!\\)\|")


def _cells(line: str) -> list[str]:
    """A markdown table row's cells (escaped pipes kept inside their cell)."""
    return [c.strip() for c in _CELL.split(line.strip())[1:-1]]


def refresh_states(page: str, results: list[dict], command: str, commit: str) -> str:
    """``page`` (a report :func:`render` wrote) with what ``eagle3-patches status`` says now in each release of
    ``results``: the state columns of the table, the upstream table and the appendix's state tables.  Every other
    cell (the suite, selftest, the servers) stays what the run that wrote the page measured, and the page says so.
    A patch added since that run gets its column; its states are what this code reports on each release."""
    names: list[str] = []
    for res in results:
        for p in (res.get("status") or {}).get("patches", []):
            if p["name"] not in names:
                names.append(p["name"])
    fresh = {r["release"]: {p["name"]: p for p in (r.get("status") or {}).get("patches", [])} for r in results}
    lines = page.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| sglang | transformers |"))
    header = _cells(lines[start])
    old = [h.strip("`") for h in header[2:] if h.startswith("`")]
    rest_head = header[2 + len(old) :]
    out = lines[:start]
    out.append("| " + " | ".join(["sglang", "transformers", *(f"`{n}`" for n in names), *rest_head]) + " |")
    out.append("|" + "---|" * (2 + len(names) + len(rest_head)))
    i = start + 2
    while i < len(lines) and lines[i].startswith("|"):
        cells = _cells(lines[i])
        v, tf, rest = cells[0], cells[1], cells[2 + len(old) :]
        states = fresh.get(v)
        if states is None:
            raise SystemExit(f"{v} is in the page but was not refreshed: refresh every release of the page")
        cells_now = [SHORT.get(states[n]["state"], states[n]["state"]) if n in states else "-" for n in names]
        out.append("| " + " | ".join([v, tf, *cells_now, *rest]) + " |")
        i += 1
    # the upstream table: from this refresh alone
    end_up = next(j for j in range(i, len(lines)) if lines[j].startswith("## Appendix"))
    out += [""] + _upstream_section(results, names)
    # the appendix: each release's state table replaced
    j = end_up
    release = None
    while j < len(lines):
        ln = lines[j]
        if ln.startswith("### sglang "):
            release = ln.removeprefix("### sglang ").strip()
        if ln.startswith("| patch | state | reason |") and release in fresh:
            out += ["| patch | state | reason |", "|---|---|---|"]
            out += [f"| `{p['name']}` | {p['state']} | {_md(p['reason'])} |" for p in fresh[release].values()]
            j += 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            continue
        out.append(ln)
        j += 1
    note = (
        f"{STATES_NOTE} {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')} at commit {commit} (`{command}`): the "
        "state columns, the upstream table and the appendix's state tables are `eagle3-patches status` of that "
        "code; the other columns and the appendix's suite and selftest figures are the run above's."
    )
    out = [ln for ln in out if not ln.startswith(STATES_NOTE)]
    run_line = next(k for k, ln in enumerate(out) if ln.startswith("Run "))
    out[run_line + 1 : run_line + 1] = ["", note]
    return "\n".join(out).rstrip() + "\n"


def states_only(args: argparse.Namespace, data: dict, installer: str, output: Path) -> int:
    """``--states-only``: the releases of the page (or ``--releases``), each venv set up and ``status`` run in it,
    and the page's patch states refreshed (:func:`refresh_states`)."""
    page = COMPAT.read_text(encoding="utf-8")
    in_page = [
        _cells(ln)[0] for ln in page.splitlines() if ln.startswith("| ") and re.match(r"\| \d", ln) and "|---" not in ln
    ]
    releases = resolve_releases(args.releases.split(","), data) if args.releases else list(dict.fromkeys(in_page))

    def one(version: str) -> dict:
        res: dict = {"release": version, "setup": setup_release(version, data, installer)}
        if res["setup"]["ok"]:
            log(f"{version}: eagle3-patches status --cpu-profile --json")
            res["status"] = run_status(version)
        return res

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(one, releases))
    failed = [r["release"] for r in results if not (r.get("status") or {}).get("patches")]
    if failed:
        log(f"no states from {', '.join(failed)}: the page is left as it was")
        return 1
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=str(ROOT)
    ).stdout.strip()
    output.write_text(refresh_states(page, results, "python tools/matrix.py --states-only", commit or "?"))
    log(f"wrote {output}")
    return 0 if all(p["state"] != "failed" for r in results for p in r["status"]["patches"]) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--releases", help="comma list (default: the data file's full list); 'pinned', 'newest', 'newest-known' allowed"
    )
    ap.add_argument("--ci", action="store_true", help="pinned + newest known release; report to .matrix/ci-report.md")
    ap.add_argument("--tests", help="pytest selection (space separated) instead of the default")
    ap.add_argument("--output", help="report path (default docs/compat.md; --ci: .matrix/ci-report.md)")
    ap.add_argument("--setup-only", action="store_true")
    ap.add_argument("--report-only", action="store_true", help="render the report from .matrix/results/*.json")
    ap.add_argument(
        "--states-only",
        action="store_true",
        help="rerun `eagle3-patches status` in every release of docs/compat.md and refresh its patch states only",
    )
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per release for pytest (and for selftest)")
    ap.add_argument(
        "--installer",
        choices=("auto", "uv", "pip"),
        default="auto",
        help="what builds the venvs (default: uv when installed, else pip)",
    )
    ap.add_argument("--no-selftest", action="store_true", help="leave `eagle3-patches selftest --json` out")
    ap.add_argument(
        "--behavioural", action="store_true", help="the behavioural suite too (about 15 min more a release)"
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="releases run side by side (default 2: each keeps about one "
        "core busy; its set-up waits mostly on the network and the disk)",
    )
    args = ap.parse_args(argv)

    data = load_data()
    spec = args.releases.split(",") if args.releases else (data["ci"] if args.ci else data["full"])
    releases = resolve_releases(spec, data)
    selection = args.tests.split() if args.tests else (CI_SELECTION if args.ci else FULL_SELECTION)
    if args.no_selftest and not args.tests and not args.ci:
        selection = [*SELFTEST_TWINS.values(), *selection]
    if args.behavioural:
        selection = [*BEHAVIOURAL, *(t for t in selection if t not in BEHAVIOURAL)]
    output = Path(args.output) if args.output else (CI_REPORT if args.ci else COMPAT)
    command = (
        "python tools/matrix.py"
        + (" --ci" if args.ci else "")
        + (f" --releases {','.join(releases)}" if args.releases or not args.ci else "")
        + (" --behavioural" if args.behavioural else "")
        + (" --no-selftest" if args.no_selftest else "")
    )
    MATRIX.mkdir(exist_ok=True)
    global RUN_LOG, RELEASE_THREADS
    RELEASE_THREADS = max(1, (os.cpu_count() or 1) // max(1, args.jobs))
    if not args.report_only:
        (MATRIX / "logs").mkdir(exist_ok=True)
        RUN_LOG = MATRIX / "logs" / f"run-{time.strftime('%Y%m%d-%H%M%S')}.log"
        log(f"{command}: {', '.join(releases)} ({' '.join(selection)}); this log: {RUN_LOG.relative_to(ROOT)}")
    if args.ci and not args.report_only:
        live = newest_release(data)
        if Version(live) > Version(data["newest_known"]):
            log(
                f"NOTE: sglang {live} is on PyPI, newer than NEWEST_CHECKED {data['newest_known']} in "
                f"{RELEASES_MODULE.relative_to(ROOT)}: run `python tools/matrix.py --releases {live}`, then set it "
                "there (docs/development.md, a new sglang release)"
            )
    installer = "pip" if args.report_only else choose_installer(args.installer)
    t0 = time.time()
    if args.states_only:
        return states_only(args, data, installer, output)
    if args.report_only:
        results = []
        for version in releases:
            path = MATRIX / "results" / f"{version}.json"
            results.append(
                json.loads(path.read_text())
                if path.exists()
                else {"release": version, "setup": {"ok": False, "error": "no results yet: run tools/matrix.py"}}
            )
    else:
        done: dict[str, dict] = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {
                pool.submit(
                    run_release,
                    version,
                    data,
                    selection,
                    args.timeout,
                    args.setup_only,
                    not args.no_selftest,
                    installer,
                ): version
                for version in releases
            }
            for fut in concurrent.futures.as_completed(futures):
                done[futures[fut]] = fut.result()
                if not args.setup_only:  # the report so far (release order), after every release
                    output.parent.mkdir(parents=True, exist_ok=True)
                    output.write_text(
                        render([done[v] for v in releases if v in done], command, selection, time.time() - t0)
                    )
        results = [done[v] for v in releases]
    if args.setup_only:
        return 0 if all(r["setup"]["ok"] for r in results) else 1
    total = time.time() - t0
    if args.report_only:
        total = sum(
            (r.get("setup") or {}).get("seconds", 0)
            + (r.get("suite") or {}).get("seconds", 0)
            + (r.get("status") or {}).get("seconds", 0)
            + (r.get("selftest") or {}).get("seconds", 0)
            for r in results
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render(results, command, selection, total))
    log(f"wrote {output} ({total / 60:.1f} min)")
    green = all(
        r.get("setup", {}).get("ok")
        and not (r.get("suite") or {}).get("failed")
        and not (r.get("suite") or {}).get("errors")
        and (r.get("suite") or {}).get("rc") in (0, 5)
        and not (r.get("status") or {}).get("import_errors")
        and (r.get("selftest") or {"ok": True}).get("ok")
        and all(p["state"] != "failed" for p in (r.get("status") or {}).get("patches", []))
        for r in results
    )
    for r in results:
        for f in (r.get("suite") or {}).get("failures", []):
            log(f"{r['release']}: FAILED {f['test']}: {f['why']}")
        if not (r.get("setup") or {}).get("ok", True):
            log(f"{r['release']}: set-up failed: {r['setup'].get('error')}")
        for c in (r.get("selftest") or {}).get("checks", []):
            if c["status"] == "failed":
                log(f"{r['release']}: selftest check {c['name']} FAILED: {c['reason']}")
    return 0 if green else 1


if __name__ == "__main__":
    sys.exit(main())
