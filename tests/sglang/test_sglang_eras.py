"""The harness's sglang API era (``eagle3_patches.testing.sglang_eras``): chosen by probing sglang's own
API, it must be the era whose releases hold the installed sglang (each era's ``first`` release)."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version
from support.releases import sglang_version

from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.sglang_eras import ERAS, V1Worker

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[2]
#: the released wheels tools/matrix.py keeps (``pip download --no-deps``)
WHEELS = ROOT / ".matrix" / "wheels"
#: from this release the decode side's transfer commit reads the transfer backend from the scheduler process's
#: published config (``disaggregation/utils.py``: ``_is_fake_transfer`` calls ``get_disagg()``; 0.5.18 passes it
#: the scheduler's ``server_args``), read in the 0.5.9 - 0.5.23 wheels
COMMIT_READS_PUBLISHED_CONFIG = Version("0.5.19")


def declared_era(version: Version) -> type[V1Worker]:
    """The era whose releases hold ``version``, from the eras' declared first releases."""
    return [era for era in ERAS if Version(era.first) <= version][-1]


def test_eras_are_one_chain_oldest_first():
    assert ERAS[0] is V1Worker and V1Worker.probe()
    for older, newer in zip(ERAS, ERAS[1:]):
        assert newer.__bases__ == (older,), newer
        assert Version(older.first) < Version(newer.first), newer
    assert declared_era(Version("0.5.9")) is V1Worker
    assert declared_era(Version("0.5.10.post1")).first == "0.5.10"


def _chosen() -> tuple[str, str, bool]:
    from eagle3_patches.testing import sglang_eras

    chosen = sglang_eras.current()
    return type(chosen).__name__, sglang_eras.detect().__name__, sglang_eras.current() is chosen


def test_the_installed_release_gets_the_era_of_its_release():
    version = sglang_version()
    if version is None:
        pytest.skip("sglang is not installed")
    chosen, detected_again, cached = run_isolated(_chosen)
    assert chosen == detected_again == declared_era(version).__name__, f"sglang {version}"
    assert cached


def test_every_era_whose_commit_reads_the_published_config_publishes_the_server_args():
    """``sglang_harness.pd_commit`` commits a transfer outside a scheduler process: where sglang's commit reads the
    published config, the era must publish the decode server's arguments (without it, on 0.5.19 - 0.5.20, the commit
    raised ``config namespace 'disagg' not published`` and every case of the selftest's check failed)."""
    first = declared_era(COMMIT_READS_PUBLISHED_CONFIG)
    for era in ERAS[ERAS.index(first) :]:
        assert era.publish_server_args is not V1Worker.publish_server_args, era.__name__
    for era in ERAS[: ERAS.index(first)]:
        assert era.publish_server_args is V1Worker.publish_server_args, era.__name__


def commit_reads_published_config(wheel: Path) -> bool:
    """Whether the release's ``_is_fake_transfer`` (the decode commit's test for the fake backend) calls
    ``get_disagg``; False where the release has no such function."""
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read("sglang/srt/disaggregation/utils.py").decode("utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "_is_fake_transfer":
            return any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "get_disagg"
                for n in ast.walk(node)
            )
    return False


def test_the_published_config_release_is_the_wheels_own():
    """:data:`COMMIT_READS_PUBLISHED_CONFIG` against the released wheels at hand (``.matrix/wheels``)."""
    wheels = {Version(w.name.split("-")[1]): w for w in sorted(WHEELS.glob("sglang-*.whl"))}
    if not wheels:
        pytest.skip(f"no released sglang wheel in {WHEELS} (tools/matrix.py downloads them)")
    seen = {str(v): commit_reads_published_config(w) for v, w in sorted(wheels.items())}
    assert seen == {v: Version(v) >= COMMIT_READS_PUBLISHED_CONFIG for v in seen}
