"""The wheel, installed the ways users install it: a fresh venv, ``--user``, ``--target``, editable.

The wheel is built once for the module (``pip wheel --no-deps --no-build-isolation`` with this
environment's setuptools, from a copy of the files the build needs: nothing is written into the
checkout, no network).  Each layout is a temporary environment holding the wheel and only its
declared dependencies (read from the wheel's metadata and linked from this environment: no
torch, transformers or sglang).  In each, the CLI must find the fork-path series inside the
install (``apply --check`` against this environment's sglang 0.5.9, read-only), print a shipped
docs page, and the LICENSE must be in the dist-info.  The fresh venv also runs ``status``,
``convert`` and ``doctor`` without torch.  About 15 s on 2 cores.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from eagle3_patches import fork

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]
#: what the build reads (pyproject.toml: readme, license-files, packages, package-dir)
BUILD_INPUTS = ["pyproject.toml", "README.md", "LICENSE", "eagle3_patches", "patches", "docs"]
SERIES = fork.load_series(fork.DEFAULT_SERIES)


# --------------------------------------------------------------------------- helpers
def _env(**extra: str) -> dict[str, str]:
    """This process's environment without Python/pip/eagle3 settings (no PYTHONPATH onto the checkout,
    no machine pip config), plus ``extra``."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "EAGLE3_"))}
    return {**keep, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", **extra}


def _run(args, *, env: dict[str, str] | None = None, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, env=env or _env(), cwd=cwd, timeout=300
    )
    if check:
        assert out.returncode == 0, f"{args}: rc {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


def _pip(*args, cwd: Path) -> None:
    _run([sys.executable, "-m", "pip", *args], cwd=cwd)


def _closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` need in this environment, transitively (markers evaluated)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if (req.marker and not req.marker.evaluate({"extra": ""})) or req.name.lower() in seen:
            continue
        seen.add(req.name.lower())
        todo.extend(Requirement(r) for r in importlib.metadata.requires(req.name) or [])
    return seen


def _link_distributions(names: set[str], dest: Path) -> Path:
    """A directory of symlinks to the installed files of ``names`` (each distribution's top-level entries)."""
    dest.mkdir()
    for name in names:
        dist = importlib.metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if not (dest / top).exists() and Path(dist.locate_file(top)).exists():
                (dest / top).symlink_to(Path(dist.locate_file(top)))
    return dest


def _purelib(python: Path) -> Path:
    return Path(
        _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=python.parent).stdout.strip()
    )


def _venv(path: Path, *deps: Path, system_site_packages: bool = False) -> Path:
    """A venv without pip whose only packages are the links in ``deps``; returns its python."""
    args = [sys.executable, "-m", "venv", "--without-pip", path] + (
        ["--system-site-packages"] if system_site_packages else []
    )
    _run(args, cwd=path.parent)
    python = path / "bin" / "python"
    (_purelib(python) / "_eagle3_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    return python


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("packaging")


@pytest.fixture(scope="module")
def source(work) -> Path:
    src = work / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    return src


@pytest.fixture(scope="module")
def wheel(work, source) -> Path:
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", work / "dist", source, cwd=work)
    (built,) = (work / "dist").glob("eagle3_patches-*.whl")
    return built


@pytest.fixture(scope="module")
def requirements(wheel) -> list[str]:
    """The wheel's unconditional Requires-Dist."""
    with zipfile.ZipFile(wheel) as zf:
        meta = Parser().parsestr(zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode())
    return [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]


@pytest.fixture(scope="module")
def deps(work, requirements) -> Path:
    return _link_distributions(_closure(requirements), work / "deps")


@pytest.fixture(scope="module")
def sglang_root() -> Path:
    """This environment's sglang 0.5.9, pointed at read-only (`apply --check`)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.origin:
        pytest.skip("sglang is not installed in the test environment")
    root = Path(spec.origin).parent
    version, _ = fork.sglang_tree_version(root)
    if version != SERIES.sglang_version:
        pytest.skip(f"the installed sglang is {version}; the series is for {SERIES.sglang_version}")
    return root


def _check_layout(cli: list, python: Path, install: Path, env: dict[str, str], cwd: Path, sglang_root: Path) -> None:
    """The series and the docs come from inside ``install``; apply --check, docs and the dist-info's LICENSE work."""
    found = _run(
        [
            python,
            "-c",
            "from eagle3_patches import fork, _shipped\n"
            "print(fork.find_series()); print(_shipped.shipped_dir(_shipped.DOCS_PACKAGE))",
        ],
        env=env,
        cwd=cwd,
    )
    series_dir, docs_dir = map(Path, found.stdout.split())
    assert series_dir.is_relative_to(install) and series_dir.name == fork.DEFAULT_SERIES, found.stdout
    assert docs_dir.is_relative_to(install), found.stdout

    check = _run([*cli, "apply", "--check", "--sglang-root", sglang_root], env=env, cwd=cwd)
    for patch in SERIES.patches:
        assert patch.filename in check.stdout and ("would apply" in check.stdout or "already applied" in check.stdout)

    page = _run([*cli, "docs", "doctor"], env=env, cwd=cwd)
    assert page.stdout.rstrip("\n") == (REPO / "docs" / "doctor.md").read_text().rstrip("\n")

    license_text = _run(
        [
            python,
            "-c",
            "import importlib.metadata as m\n"
            "print(m.distribution('eagle3-patches').read_text('licenses/LICENSE'), end='')",
        ],
        env=env,
        cwd=cwd,
    )
    assert license_text.stdout == (REPO / "LICENSE").read_text()


# --------------------------------------------------------------------------- the wheel itself
def test_the_wheel_ships_every_module(wheel):
    """pyproject.toml lists the packages (a package-dir mapping rules out packages.find): none forgotten."""
    with zipfile.ZipFile(wheel) as zf:
        modules = {n for n in zf.namelist() if n.endswith(".py")} - {
            n for n in zf.namelist() if n.startswith(("eagle3_patches/series/", "eagle3_patches/docs/"))
        }
    source = {
        p.relative_to(REPO).as_posix() for p in (REPO / "eagle3_patches").rglob("*.py") if "__pycache__" not in p.parts
    }
    assert modules == source


def test_the_wheel_ships_the_series_docs_and_license_from_their_single_copies(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        shipped = {n: zf.read(n) for n in names}
    series = {p.name for p in (REPO / "patches" / fork.DEFAULT_SERIES).iterdir()}
    for name in series:
        member = f"eagle3_patches/series/{fork.DEFAULT_SERIES}/{name}"
        assert shipped[member] == (REPO / "patches" / fork.DEFAULT_SERIES / name).read_bytes(), member
    for page in (REPO / "docs").glob("*.md"):
        assert shipped[f"eagle3_patches/docs/{page.name}"] == page.read_bytes()
    (license_member,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert shipped[license_member] == (REPO / "LICENSE").read_bytes()
    assert not [n for n in names if "__pycache__" in n or n.startswith("share/") or ".data/" in n]


def test_the_dependencies_are_what_the_library_imports(requirements):
    assert sorted(Requirement(r).name for r in requirements) == ["numpy", "packaging", "safetensors", "wrapt"]


# --------------------------------------------------------------------------- the layouts
def test_fresh_venv_without_torch(work, wheel, deps, sglang_root, tiny):
    venv = work / "venv"
    python = _venv(venv, deps)
    # pip resolves the declared dependencies from the linked ones: nothing else is needed
    _pip("--python", python, "install", "--no-index", "-q", wheel, cwd=work)
    missing = _run(
        [
            python,
            "-c",
            "import importlib.util as u; print([m for m in ('torch', 'transformers', 'sglang') if u.find_spec(m)])",
        ],
        cwd=work,
    )
    assert missing.stdout.strip() == "[]"
    cli = [venv / "bin" / "eagle3-patches"]
    _check_layout(cli, python, _purelib(python), _env(), work, sglang_root)

    status = _run([*cli, "status"], cwd=work)
    assert "sglang (not installed)" in status.stdout and "not-applicable" in status.stdout
    converted = work / "converted-draft"
    _run([*cli, "convert", tiny["speculators_draft"], converted], cwd=work)
    doctor = _run(
        [
            *cli,
            "doctor",
            "--target",
            tiny["kimi_k25"],
            "--draft",
            converted,
            "--sglang-version",
            "0.5.9",
            "--with-patches",
        ],
        cwd=work,
    )
    assert "OK: 0 error(s)" in doctor.stdout


def test_pip_install_user(work, wheel, deps, sglang_root):
    # --user needs a Python whose user site is on (a venv that sees the system site-packages)
    python = _venv(work / "venv-user", deps, system_site_packages=True)
    userbase = work / "userbase"
    env = _env(PYTHONUSERBASE=str(userbase))
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--user",
            "--no-index",
            "-q",
            "--no-warn-script-location",
            wheel,
        ],
        env=env,
        cwd=work,
    )
    _check_layout([userbase / "bin" / "eagle3-patches"], python, userbase, env, work, sglang_root)


def test_pip_install_target(work, wheel, deps, sglang_root):
    python = _venv(work / "venv-target", deps)
    target = work / "target"
    _pip("--python", python, "install", "--target", target, "--no-deps", "--no-index", "-q", wheel, cwd=work)
    env = _env(PYTHONPATH=str(target))
    _check_layout([target / "bin" / "eagle3-patches"], python, target, env, work, sglang_root)


def test_editable_install(work, source, deps, sglang_root):
    # the editable build runs setuptools in the venv's Python: link it in next to the dependencies
    python = _venv(
        work / "venv-editable", deps, _link_distributions(_closure(["setuptools"]), work / "deps-setuptools")
    )
    _pip("--python", python, "install", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-e", source, cwd=work)
    mapped = _run(
        [
            python,
            "-c",
            "import importlib.resources as r\nprint(r.files('eagle3_patches.series')); "
            "print(r.files('eagle3_patches.docs'))",
        ],
        cwd=work,
    )
    assert mapped.stdout.split() == [str(source / "patches"), str(source / "docs")]
    _check_layout([work / "venv-editable" / "bin" / "eagle3-patches"], python, source, _env(), work, sglang_root)
