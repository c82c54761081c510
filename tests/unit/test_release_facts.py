"""The release facts have one place (``eagle3_patches/checkpoint/releases.py``): no library string retypes the
newest checked release, and the tools read the pinned and the newest checked release from the module."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from eagle3_patches.checkpoint import releases
from eagle3_patches.sglang_version import base_release

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "eagle3_patches"
#: a release number as sglang writes them (``0.5.23``, ``0.5.10.post1``, ``0.5.13rc1``); not part of a longer
#: dotted number (an IP address)
RELEASE = re.compile(r"(?<![\w.])\d+\.\d+\.\d+(?:\.post\d+|rc\d+)?(?![.\w]?\d)")

HISTORY = "what that release's code does or did (history: true whatever release comes next)"
READ_IN = "the releases whose wheels a table or an era was read from (history of the reading)"
#: (file under eagle3_patches/, a text of the string that holds the literal): why it may name the newest checked
#: release (or a later one) itself.  Every other string formats it from ``releases.NEWEST_CHECKED``.
ALLOWED = {
    ("checkpoint/expected_accept.py", "read in the 0.5.23 wheel"): READ_IN,
    ("cpu/cache_loc_ops.py", "from 0.5.23, ``assign_draft"): HISTORY,
    ("cpu/cache_loc_ops.py", "only from 0.5.23, where"): HISTORY,
    ("cpu/kernel_coverage.py", ">=0.5.23"): HISTORY,
    ("cpu/spec_kernels.py", "sglang 0.5.23 and later: the same CPU branch"): HISTORY,
    ("cpu/spec_sampling.py", "0.5.23 on: ``eagle_utils`` binds them at module level"): HISTORY,
    ("cpu/spec_sampling.py", "module globals (0.5.23 on)"): HISTORY,
    ("doctor/pair.py", "0.5.23 the KV dtype"): HISTORY,
    ("instruments/accept_watchdog.py", "(from 0.5.23 sglang passes"): HISTORY,
    ("instruments/accept_watchdog.py", "0.5.15, 0.5.23): 0.5.9"): READ_IN,
    ("instruments/accept_watchdog.py", "0.5.23 adds ``num_accept_tokens``"): HISTORY,
    ("patches/aux_capture_validation.py", "(0.5.23 raises for too few states"): HISTORY,
    ("patches/disaggregation_fingerprint.py", "(0.5.23 also the KV dtype)"): HISTORY,
    ("patches/disaggregation_fingerprint.py", "in 0.5.9 and 0.5.23); sglang"): READ_IN,
    ("patches/eagle3_algorithm_guard.py", "``resolve_once`` from sglang\n0.5.23"): HISTORY,
    ("patches/eagle3_draft_config_fields.py", "``resolve_once`` from 0.5.23"): HISTORY,
    ("patches/eagle3_target_capability.py", "``resolve_once`` from 0.5.23"): HISTORY,
    ("patches/eagle3_draft_norms.py", "what sglang 0.5.23 has for each"): HISTORY,
    ("patches/eagle3_draft_norms.py", "sglang 0.5.23's stock outputs (computed in the 0.5.23"): READ_IN,
    ("patches/eagle3_draft_norms.py", "What sglang 0.5.23's ``LlamaModel"): HISTORY,
    ("patches/eagle3_draft_norms.py", "(0.5.23's order)"): HISTORY,
    ("patches/eagle3_fc_guard.py", "and 0.5.23's leaves"): HISTORY,
    ("patches/speculators_draft_config.py", "``speculators`` 0.9.0"): "the speculators library's version",
    ("plugin.py", "from 0.5.23, in the detokenizer"): HISTORY,
    ("plugin.py", "0.5.23: in the launcher"): HISTORY,
    ("sglang_runtime.py", "from sglang 0.5.23 on (where"): HISTORY,
    ("sglang_runtime.py", "get_server_args()`` from sglang 0.5.23 on"): HISTORY,
    ("sglang_runtime.py", "From sglang 0.5.23 the resolved"): HISTORY,
    ("sglang_version.py", "``0.6`` is ``0.6.0``"): "an example of the normalisation",
    ("testing/cpu_pools.py", "0.5.23\n``KVCacheConf"): HISTORY,
    ("testing/sglang_eras.py", "released wheels of 0.5.9 - 0.5.23"): READ_IN,
    ("testing/sglang_eras.py", "``ExtendEnd``         0.5.22 - 0.5.23"): READ_IN,
    ("testing/sglang_eras.py", "sglang 0.5.22 - 0.5.23: ``req.extend_end``"): READ_IN,
    ("testing/sglang_harness.py", "{prefill,decode}`` of 0.5.13 - 0.5.23"): READ_IN,
    ("testing/sglang_harness.py", "uses it (0.5.23)"): HISTORY,
    ("testing/sglang_harness.py", "0.5.23: ``req.kv.kv_committed_len``"): HISTORY,
    ("testing/tiny_models.py", "``speculators`` library (0.9.0)"): "the speculators library's version",
    ("testing/tiny_models.py", "0.9.0"): "the speculators library's version (the fixture's metadata)",
}


def strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant of ``source``: docstrings, plain strings and the literal parts of
    f-strings (a formatted ``{releases.NEWEST_CHECKED}`` is no constant)."""
    return [
        (n.lineno, n.value)
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def newest_literals(source: str, newest: Version = releases.NEWEST_CHECKED) -> list[tuple[int, str, str, int]]:
    """(line, literal, the string, where in it) of each release number from ``newest`` on written in ``source``'s
    strings."""
    return [
        (line, m.group(), text, m.start())
        for line, text in strings(source)
        for m in RELEASE.finditer(text)
        if base_release(Version(m.group())) >= newest
    ]


def covers(snippet: str, text: str, start: int, literal: str) -> bool:
    """``snippet`` occurs in ``text`` around the literal at ``start`` (an entry excuses one place, not its string)."""
    at = text.find(snippet)
    while at != -1:
        if at <= start and start + len(literal) <= at + len(snippet):
            return True
        at = text.find(snippet, at + 1)
    return False


def test_no_library_string_retypes_the_newest_checked_release():
    found, used = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "checkpoint/releases.py":  # the one place
            continue
        for line, literal, text, start in newest_literals(path.read_text(encoding="utf-8")):
            allowed = [k for k in ALLOWED if k[0] == rel and covers(k[1], text, start, literal)]
            used.update(allowed)
            if not allowed:
                found.append(f"eagle3_patches/{rel}:{line}: {literal!r} in {text.strip()[:80]!r}")
    assert not found, (
        "the newest checked release is retyped; format it from eagle3_patches.checkpoint.releases.NEWEST_CHECKED "
        "(or, for history, add the string to ALLOWED with its reason):\n" + "\n".join(found)
    )
    assert not set(ALLOWED) - used, f"ALLOWED entries that match nothing any more: {sorted(set(ALLOWED) - used)}"


def release_boundaries(source: str) -> list[tuple[int, str]]:
    """(line, name) of every module-level name bound to a ``Version("...")`` literal: a release boundary."""
    out = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            call = node.value
            if getattr(call.func, "id", getattr(call.func, "attr", "")) == "Version" and any(
                isinstance(a, ast.Constant) for a in call.args
            ):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                out += [(node.lineno, ast.unparse(t)) for t in targets]
    return out


def test_every_release_boundary_is_declared_in_the_release_module():
    """A maintainer who declares "from release X sglang does Y" beside the code that reads it (the doctor's flag
    rules, measure-accept) gives the fact a second home that the release module's readers never see."""
    found = [
        f"eagle3_patches/{path.relative_to(PACKAGE).as_posix()}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).as_posix() != "checkpoint/releases.py"
        for line, name in release_boundaries(path.read_text(encoding="utf-8"))
    ]
    assert not found, "declare these in eagle3_patches/checkpoint/releases.py and import them:\n" + "\n".join(found)
    assert {"SPEC_V2_DEFAULT_ON_FROM", "ONE_WORKER_FROM"} <= {
        n for _, n in release_boundaries((PACKAGE / "checkpoint/releases.py").read_text(encoding="utf-8"))
    }


def test_the_boundary_scan_finds_a_version_constant():
    assert release_boundaries('ONE_WORKER_FROM = Version("0.5.13")\nX: Version = packaging.version.Version("1")\n')
    assert not release_boundaries("def f():\n    v = Version('0.5.13')\nNOW = Version(x)\n")


@pytest.mark.parametrize(
    "source",
    [
        'MESSAGE = "no release through 0.5.23 serves it"\n',
        'def f():\n    """Fixed in 0.5.24."""\n',
        'x = f"{a} up to 0.5.23.post1, {b}"\n',
        'x = "0.5.23rc1"\n',
    ],
)
def test_the_scan_finds_a_retyped_release(source):
    assert newest_literals(source, Version("0.5.23"))


@pytest.mark.parametrize(
    "source",
    [
        'MESSAGE = f"no release through {releases.NEWEST_CHECKED} serves it"\n',
        'x = "from 0.5.12 on, and 0.5.22"\n',
        'URL = "http://127.0.0.1:30000"\n',
        "# through 0.5.23, a comment\n",
    ],
)
def test_the_scan_leaves_formatted_and_older_releases_alone(source):
    assert not newest_literals(source, Version("0.5.23"))


def _matrix():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import matrix
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return matrix


def test_the_matrix_reads_pinned_and_newest_known_from_the_release_module():
    data = _matrix().load_data()
    assert (data["pinned"], data["newest_known"]) == (str(releases.PINNED), str(releases.NEWEST_CHECKED))


def test_the_serve_extra_pins_the_pinned_release():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (pin,) = [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["serve"] if r.startswith("sglang")]
    assert str(pin.specifier) == f"=={releases.PINNED}"


def test_the_matrix_refuses_a_second_copy_of_a_release_fact(tmp_path, monkeypatch):
    matrix = _matrix()
    data = tmp_path / "matrix_releases.json"
    data.write_text('{"full": ["pinned..newest"], "newest_known": "0.5.23"}')
    monkeypatch.setattr(matrix, "DATA_FILE", data)
    with pytest.raises(SystemExit, match=r"matrix_releases.json: 'newest_known' is set there; .* remove it"):
        matrix.load_data()
    data.write_text('{"full": ["pinned..newest"]}')
    assert matrix.load_data()["newest_known"] == str(releases.NEWEST_CHECKED)


def test_the_matrix_names_the_module_without_the_release(tmp_path):
    module = tmp_path / "releases.py"
    module.write_text('from packaging.version import Version\nPINNED = Version("0.5.9")\n')
    with pytest.raises(SystemExit, match=r'releases.py: no `NEWEST_CHECKED = Version\("..."\)` line'):
        _matrix().release_facts(module)
