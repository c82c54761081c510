"""Every accelerator-only name sglang's speculative path reaches on CPU, in every release of the data, is served by an
op of the CPU profile or declared not reached there (``eagle3_patches/cpu/kernel_coverage.py``); and the data
(``tests/data/kernel_symbols.json``, ``tools/kernel_symbols.py``) is what the installed release's own source says.

Static and in seconds: no wheel, no sglang import, no server.  It cannot show an op is right or in place (the ops'
tests and the release matrix do); it shows that no release reaches a kernel where the profile has nothing."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from eagle3_patches.checkpoint.releases import NEWEST_CHECKED, PINNED
from eagle3_patches.cpu import kernel_coverage as K
from eagle3_patches.cpu.stubs import is_stub
from eagle3_patches.sglang_version import base_release, installed_sglang_version

TOOL = Path(__file__).resolve().parents[2] / "tools" / "kernel_symbols.py"


def _tool():
    spec = importlib.util.spec_from_file_location("kernel_symbols", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("kernel_symbols", mod)
    spec.loader.exec_module(mod)
    return mod


T = _tool()
DATA = T.load()
RELEASES = list(DATA["releases"])
REWRITE = "python tools/kernel_symbols.py --write"


def _reached(sites: dict[str, list[str]]) -> list[str]:
    return [*sites["live"], *sites["silent"]]


@pytest.mark.parametrize("release", RELEASES)
def test_every_kernel_the_path_reaches_on_cpu_is_served_or_declared_not_reached(release):
    missing, twice = [], []
    for name, sites in sorted(T.for_release(DATA, release).items()):
        for site in _reached(sites):
            found = K.covering(name, release, site)
            if not found:
                missing.append(f"{name} at {site} ({'live' if site in sites['live'] else 'silent'})")
            elif len(found) > 1:
                twice.append(f"{name} at {site}: {', '.join(map(K.describe, found))}")
    assert not missing, (
        f"sglang {release} reaches these accelerator-only names on CPU, and eagle3_patches/cpu/kernel_coverage.py "
        "says nothing of them there (a CPU op of the profile, or why CPU does not get there):\n  "
        + "\n  ".join(missing)
    )
    assert not twice, "sites more than one entry covers:\n  " + "\n  ".join(twice)


@pytest.mark.parametrize(
    "name, op",
    sorted({(n, e.op) for n, es in K.COVERAGE.items() for e in es if isinstance(e, K.Served)}),
)
def test_each_declared_op_is_the_profiles_own_callable(name, op):
    module, _, attr = op.rpartition(".")
    fn = getattr(importlib.import_module(f"eagle3_patches.cpu.{module}"), attr, None)
    assert callable(fn) and not is_stub(fn), f"{name}: eagle3_patches.cpu.{op} is not a callable of the profile"
    assert getattr(fn, "__module__", "") == f"eagle3_patches.cpu.{module}", f"{op} is {fn.__module__}'s"


def test_every_entry_covers_a_site_of_its_releases():
    stale = []
    for name, es in sorted(K.COVERAGE.items()):
        for e in es:
            used = {
                at
                for r in RELEASES
                if e in K.entries(name, r)
                for site in _reached(T.for_release(DATA, r).get(name, {"live": [], "silent": []}))
                for at in e.at
                if K.covers(at, site)
            }
            stale += [f"{name}: {K.describe(e)} at {at} ({e.releases})" for at in e.at if at not in used]
    assert not stale, "entries that cover no live or silent site of the data (remove them):\n  " + "\n  ".join(stale)


def test_not_reached_gives_a_known_reason_and_a_stand_in_covers_imports_only():
    for name, es in K.COVERAGE.items():
        for e in es:
            if isinstance(e, K.NotReached):
                assert e.why in K.WHY, f"{name}: {e.why!r} is no key of WHY"
            if isinstance(e, K.StandIn):
                for r in RELEASES:
                    for site in _reached(T.for_release(DATA, r).get(name, {"live": [], "silent": []})):
                        if any(K.covers(at, site) for at in e.at) and e in K.entries(name, r):
                            assert "[import" in site, f"{name} at {site} ({r}) is more than an import"


def test_the_data_has_the_pinned_and_the_newest_checked_release():
    assert str(PINNED) in RELEASES and str(NEWEST_CHECKED) in RELEASES, f"refresh the data: {REWRITE}"


def test_the_data_is_what_the_installed_release_says():
    site = T.installed_site()
    version = installed_sglang_version()
    if site is None or version is None:
        pytest.skip("sglang is not installed")
    if str(version) not in DATA["releases"]:
        if base_release(version) > NEWEST_CHECKED:
            pytest.skip(f"sglang {version} is newer than the data (the newest checked is {NEWEST_CHECKED})")
        pytest.fail(f"sglang {version} is not in tests/data/kernel_symbols.json: {REWRITE}")
    found, _ = T.analyse(T.Source.directory(site))
    diff = T.differences(T.for_release(DATA, str(version)), found)
    assert not diff, f"sglang {version}'s own source ({site}) differs from the data: {REWRITE}\n  " + "\n  ".join(diff)


# -- the reading rules, on a made-up tree ---------------------------------------------------------------------------
_UTILS = """
def is_cuda(): ...
def is_cpu(): ...
"""

CASES = {
    # 0.5.13: bound only on CUDA, read by a verify that no platform test guards: a NameError on CPU
    "unbound": (
        """
from sglang.srt.utils import is_cuda
if is_cuda():
    from sgl_kernel import top_k_renorm_prob
def verify(batch):
    if batch.is_all_greedy:
        return 0
    return top_k_renorm_prob(batch)
""",
        {
            "sgl_kernel.top_k_renorm_prob": {
                "live": ["srt.speculative.m:verify [unbound on CPU]"],
                "silent": [],
                "off": ["srt.speculative.m [import]"],
            }
        },
    ),
    # 0.5.16: the greedy test includes _is_cpu, so CPU never gets to the import
    "greedy on CPU": (
        """
from sglang.srt.utils import is_cpu
_is_cpu = is_cpu()
GREEDY = _is_cpu
def verify(batch):
    if batch.is_all_greedy or GREEDY:
        return 0
    else:
        from sgl_kernel import top_k_renorm_prob
        return top_k_renorm_prob(batch)
""",
        {"sgl_kernel.top_k_renorm_prob": {"live": [], "silent": [], "off": ["srt.speculative.m:verify [import]"]}},
    ),
    # 0.5.9's verify_tree_greedy_func: CUDA and NPU branches, none for CPU
    "silent": (
        """
from sglang.srt.utils import is_cuda
_is_cuda = is_cuda()
_is_npu = False
def verify_tree_greedy_func(x):
    if _is_cuda:
        from sgl_kernel import verify_tree_greedy
        verify_tree_greedy(x)
    elif _is_npu:
        torch.ops.npu.verify(x)
    return x
def other(x):
    if _is_cuda:
        import sgl_kernel
        return sgl_kernel.f(x)
    return x
""",
        {
            "sgl_kernel.verify_tree_greedy": {
                "live": [],
                "silent": ["srt.speculative.m:verify_tree_greedy_func [import]"],
                "off": [],
            },
            "torch.ops.npu.verify": {"live": [], "silent": ["srt.speculative.m:verify_tree_greedy_func"], "off": []},
            "sgl_kernel": {"live": [], "silent": [], "off": ["srt.speculative.m:other [import]"]},
            "sgl_kernel.f": {"live": [], "silent": [], "off": ["srt.speculative.m:other"]},
        },
    ),
    # a function of another module, reached by name (followed one step out of the path), and None on CPU
    "followed and None": (
        """
from sglang.srt.mem import assign
from sglang.kernels.ops.renorm import renorm
def step(x):
    if renorm is None:
        return assign(x)
    return renorm(x)
""",
        {
            "sgl_kernel.assign_cpu": {"live": ["srt.mem:assign"], "silent": [], "off": []},
            "flashinfer.sampling.renorm": {"live": ["srt.speculative.m:step [None on CPU]"], "silent": [], "off": []},
        },
    ),
}
_EXTRA = {
    "sglang/srt/mem.py": """
from sglang.srt.utils import is_cpu
if is_cpu():
    from sgl_kernel import assign_cpu
def assign(x):
    return assign_cpu(x)
""",
    "sglang/kernels/ops/renorm.py": """
from sglang.srt.utils import is_cuda
from sglang.utils import LazyImport
if is_cuda():
    renorm = LazyImport("flashinfer.sampling", "renorm")
else:
    renorm = None
""",
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_reading_rules(case):
    source, expected = CASES[case]
    files = {"sglang/srt/utils.py": _UTILS, "sglang/srt/speculative/m.py": source, **_EXTRA}
    for text in files.values():
        ast.parse(text)
    found, _ = T.analyse(T.Source(((p, (lambda t=t: t)) for p, t in files.items()), case))
    assert found == expected


def test_a_post_release_is_held_to_its_base_releases_entries():
    assert K.entries("sgl_kernel.top_k_renorm_prob", "0.5.13.post1") == K.entries(
        "sgl_kernel.top_k_renorm_prob", "0.5.13"
    )
    assert Version("0.5.13") in {base_release(Version(r)) for r in RELEASES}
