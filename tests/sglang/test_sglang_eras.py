"""The harness's sglang API era (``eagle3_patches.testing.sglang_eras``): chosen by probing sglang's own
API, it must be the era whose releases hold the installed sglang (each era's ``first`` release)."""

from __future__ import annotations

import pytest
from packaging.version import Version

from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.releases import sglang_version
from eagle3_patches.testing.sglang_eras import ERAS, V1Worker

pytestmark = pytest.mark.sglang


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
