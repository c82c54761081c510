#!/usr/bin/env python3
"""Mutation testing of the code whose failure is silent in production (docs/testing.md).

    python tools/mutation.py                      # every module in scope (hours on 2 cores)
    python tools/mutation.py --module eagle3_patches/patches/eagle3_fc_guard.py [--module ...]
    python tools/mutation.py --list               # the scope, each module's test files, its mutant count
    python tools/mutation.py --report             # the scores of the sessions run so far (no test runs)
    python tools/mutation.py --module M --line N  # only the mutants on line N of M (a partial session)
    python tools/mutation.py --module M --changed-since REV  # only the statements of M changed since commit REV
    python tools/mutation.py --module M --retry-survivors   # after a test got stronger: M's survivors again

The tool is cosmic-ray (pinned in tools/requirements-mutation.txt with coverage.py, installed into .venv on first
use; not a test or CI dependency): its operators make the mutants, its session database keeps them, and each
mutant is written into the source file on disk before the tests run, so it reaches every process the tests
start: the ``spawn``-ed sglang children of ``run_isolated`` / ``run_ranks`` and the real servers.  Tools that
switch mutants in-process (mutmut 3's trampolines, selected by an environment variable in a copied tree) do not
reach those children reliably.  This script schedules the mutants itself (cosmic-ray's own ``exec`` runs one
command for every mutant, one at a time): ``--workers`` of them side by side (default 2), each in its own copy of
the checkout (``.mutation/worker-K``; the checkout itself is never mutated), whose tests and sglang children import
eagle3_patches from that copy; and each mutant's tests in the order that kills it soonest: the module's tests run
once with coverage.py in every process (tools/mutation_coverage.py), and a mutant's tests start with those that
ran its lines, the quickest first.  Every test still runs for a survivor, so the order changes the time, never
the verdict.
``--covering-only`` runs only the tests that ran the mutant's lines (a test that never runs a line cannot see it
change; a line no test runs survives at once): much quicker where one slow test covers little (the converter's
sglang load), but it trusts the coverage run to have seen every process, so its survivors are provisional until
``--retry-survivors`` without it has run them on every test.

Each module's mutants run against that module's own test files, derived, not kept by hand: the test files
named after the module (``test_<stem>.py``, ``test_ckpt_<stem>*.py``), else those that import it, name its
patch or (a CLI module) run its subcommand, else the tests of its package (tests/ mirrors the library); a patch
module with a doctor rule (``preflight``) adds the doctor's tests, first; one that sets ``in_fork_series`` adds
the fork series' mirror test (tests/fork, the membership it declares); a patch or instrument module with an
import kept to type checking adds the test that a serving process loads none of the offline layer; a module in
``TESTED_THROUGH`` (kept by hand) adds the tests of the commands that reach it.  Tests of stock sglang
(``-m "not stock"``) are left out for patch modules: they run without the patch.  ``pytest -x`` stops at the
first failure.  A patch module runs against the pinned sglang (``.venv``) when its range covers it, else against
the newest release of the matrix in its range (``.matrix/venv-<release>``, built by ``tools/matrix.py``;
``--release`` chooses another): a patch that does not apply on the pinned release would have every mutant of
its runtime path survive.  Sessions (one sqlite file per module under ``.mutation/``) resume where they stopped;
``--fresh`` starts over.  A mutant is *equivalent* when the code marks it: cosmic-ray's pragma on a comment line
right above the statement, naming the operator, then why (docs/testing.md, "Equivalent mutants")::

    # pragma: no mutate core/NumberReplacer: ``order`` only sorts the patches, and 59 and 61 sort them as 60 does
    order = 60

A session skips the marked mutants and counts them apart; the score is killed / (mutants - equivalent), a
timeout counting as killed (as cosmic-ray counts it) and shown apart.

The operators (``--operators-table`` writes their table into docs/testing.md): cosmic-ray's comparison swaps
limited to negation and boundary shifts, boolean keywords, ``not`` added and removed, numbers, zero-iteration
loops, exception types, plus this project's (tools/mutation_operators.py): the faults real refactors make and
cosmic-ray does not (a call statement deleted, a case dropped from a literal list, a setting compared raw, a
containment check without its separator, any/all swapped, an argument ignored for its default, an emptiness
check's boundary moved, the other of two values returned, a release bound moved by one or its end opened or closed,
an early-exit guard removed, a group getter widened, a table's name spelt with - for _).  cosmic-ray's arithmetic
swaps (ten per operator, mostly in message formatting) are left out.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tokenize
from collections.abc import Iterable
from pathlib import Path

import matrix  # tools/matrix.py: the release venvs, their environment
import mutation_operators  # tools/mutation_operators.py: this project's operators

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".venv" / "bin" / "python"
STATE = ROOT / ".mutation"
DOC = ROOT / "docs" / "testing.md"
SCOPE_GLOBS = (
    "eagle3_patches/patches/*.py",
    "eagle3_patches/checkpoint/*.py",
    "eagle3_patches/acceptance/*.py",
    "eagle3_patches/doctor/*.py",
    "eagle3_patches/convert.py",
    "eagle3_patches/registry.py",
    "eagle3_patches/fork/*.py",
    "eagle3_patches/cli/apply_cmd.py",
    "eagle3_patches/settings.py",
    "eagle3_patches/plugin.py",
    "eagle3_patches/instruments/accept_watchdog.py",
)
TEST_ROOT = ROOT / "tests"
#: test directories too slow for per-mutant runs (real servers, TP 2, the wheel in fresh venvs, the whole selftest)
HEAVY_TEST_DIRS = ("e2e", "distributed", "packaging", "selftest")

# comparison swaps kept: negation and the boundary shifts (cosmic-ray alone makes every pair of 8 operators)
COMPARISONS = {
    "Eq": ("NotEq",),
    "NotEq": ("Eq", "Lt", "Gt"),
    "Lt": ("LtE", "GtE"),
    "LtE": ("Lt", "Gt"),
    "Gt": ("GtE", "LtE"),
    "GtE": ("Gt", "Lt"),
    "In": ("NotIn",),
    "NotIn": ("In",),
    "Is": ("IsNot",),
    "IsNot": ("Is",),
}
SYMBOLS = {
    "Eq": "==",
    "NotEq": "!=",
    "Lt": "<",
    "LtE": "<=",
    "Gt": ">",
    "GtE": ">=",
    "In": "in",
    "NotIn": "not in",
    "Is": "is",
    "IsNot": "is not",
}
#: cosmic-ray's other operators kept: the fault each makes and an example (docs/testing.md's table)
CORE_KEPT = {
    "AddNot": ("a condition negated", "`if ok:` to `if not ok:`"),
    "ReplaceTrueWithFalse": ("a flag's value flipped", "`True` to `False`"),
    "ReplaceFalseWithTrue": ("a flag's value flipped", "`False` to `True`"),
    "ReplaceAndWithOr": ("a conjunction made a disjunction", "`a and b` to `a or b`"),
    "ReplaceOrWithAnd": ("a disjunction made a conjunction", "`a or b` to `a and b`"),
    "ReplaceUnaryOperator_Delete_Not": ("a negation dropped", "`not ok` to `ok`"),
    "ReplaceBreakWithContinue": ("a loop that no longer stops", "`break` to `continue`"),
    "ReplaceContinueWithBreak": ("a loop that stops early", "`continue` to `break`"),
    "ExceptionReplacer": ("a handler that catches nothing", "`except OSError:` to `except CosmicRayTestingException:`"),
    "NumberReplacer": ("a number one off", "`3` to `2` and `4`"),
    "ZeroIterationForLoop": ("a loop that never runs", "`for x in xs:` to `for x in []:`"),
}


# ---------------------------------------------------------------------------------------------------- environment
def ensure_environment() -> None:
    """Run under .venv's python with cosmic-ray and coverage.py installed (tools/setup_env.sh, then the pinned
    tools)."""
    try:
        in_venv = Path(sys.prefix).resolve() == (ROOT / ".venv").resolve()
    except OSError:
        in_venv = False
    if in_venv:
        import importlib.util

        if all(importlib.util.find_spec(name) is not None for name in ("cosmic_ray", "coverage")):
            return
    subprocess.run(["bash", str(ROOT / "tools" / "setup_env.sh")], check=True)
    probe = subprocess.run([str(VENV_PY), "-c", "import cosmic_ray, coverage"], capture_output=True)
    if probe.returncode != 0:
        subprocess.run(
            [str(VENV_PY), "-m", "pip", "install", "-q", "-r", str(ROOT / "tools" / "requirements-mutation.txt")],
            check=True,
        )
    os.execv(str(VENV_PY), [str(VENV_PY), str(Path(__file__).resolve()), *sys.argv[1:]])


# ---------------------------------------------------------------------------------------------------- operators
def project_operators():
    """This project's operators (tools/mutation_operators.py), as a cosmic-ray operator provider."""
    from cosmic_ray.operators.operator import Example, Operator

    def adapt(cls):
        def examples(_cls):
            return tuple(Example(pre, post, *rest) for pre, post, *rest in cls.examples())

        return type(cls.__name__, (cls, Operator), {"examples": classmethod(examples)})

    ops = {name: adapt(cls) for name, cls in mutation_operators.OPERATORS.items()}

    class Provider:
        def __iter__(self):
            return iter(ops)

        def __getitem__(self, name):
            return ops[name]

    return Provider()


def operator_rows() -> list[tuple[str, str, str]]:
    """The operators a session runs, as (name, the fault it makes, an example): docs/testing.md's generated table."""
    rows = [
        (
            f"core/ReplaceComparisonOperator_{a}_{b}",
            "a comparison negated or its boundary moved",
            f"`{SYMBOLS[a]}` to `{SYMBOLS[b]}`",
        )
        for a, bs in COMPARISONS.items()
        for b in bs
    ]
    rows += [(f"core/{name}", fault, example) for name, (fault, example) in CORE_KEPT.items()]
    for name, cls in mutation_operators.OPERATORS.items():
        pre, post, *_ = cls.examples()[0]
        changed = [(a, b) for a, b in zip(pre.splitlines(), post.splitlines()) if a != b]
        a, b = changed[0] if changed else (pre.strip(), post.strip())
        rows.append((f"eagle3/{name}", cls.fault, f"`{a.strip()}` to `{b.strip()}`"))
    return rows


def operators_table() -> str:
    lines = ["| operator | the fault it makes | example |", "|---|---|---|"]
    lines += [
        f"| `{name}` | {fault} | {example.replace('|', chr(92) + '|')} |" for name, fault, example in operator_rows()
    ]
    return "\n".join(lines) + "\n"


def install_operators() -> list[str]:
    """Register the project's operators with cosmic-ray; the names of the operators a session uses."""
    import cosmic_ray.plugins

    cosmic_ray.plugins.OPERATOR_PROVIDERS["eagle3"] = project_operators()
    kept = []
    for name in cosmic_ray.plugins.operator_names():
        provider, _, op = name.partition("/")
        if provider == "eagle3":
            kept.append(name)
        elif provider == "core":
            m = re.fullmatch(r"ReplaceComparisonOperator_(\w+?)_(\w+)", op)
            if (m and m.group(2) in COMPARISONS.get(m.group(1), ())) or op in CORE_KEPT:
                kept.append(name)
    return kept


# ---------------------------------------------------------------------------------------------------- scope and tests
def scope() -> list[Path]:
    found: list[Path] = []
    for pattern in SCOPE_GLOBS:
        found += sorted(p for p in ROOT.glob(pattern) if p.name != "__init__.py")
    return found


def _test_files(heavy: bool = False) -> list[Path]:
    return sorted(
        p for p in TEST_ROOT.rglob("test_*.py") if heavy or p.relative_to(TEST_ROOT).parts[0] not in HEAVY_TEST_DIRS
    )


#: modules whose tests reach them through the commands built on them rather than by name: those commands' test
#: files too (formats: every config, index and shard the doctor and the converter read goes through it; its own
#: unit tests alone left 204 of 254 mutants alive; the registry: what it records of a patch's touches is tested
#: by the drift report's tests, the selection by the settings by the activation tests, the fork series' members
#: and the in-source state by the fork tests)
TESTED_THROUGH = {
    # the storage tier's verdicts, per release and backend, are the patch's too (its launcher check and its rule)
    "eagle3_patches/patches/hicache_draft_kv.py": ["test_hicache_draft_storage.py"],
    # its rule stands aside for the MLA draft, which the doctor's MLA tests judge
    "eagle3_patches/patches/eagle3_draft_norms.py": ["test_doctor_mla_draft.py"],
    "eagle3_patches/checkpoint/formats.py": ["test_ckpt_doctor.py", "test_ckpt_convert.py"],
    "eagle3_patches/checkpoint/conversion_plan.py": [
        "test_ckpt_convert.py",
        "test_ckpt_doctor.py",
        "test_speculators_draft_config.py",
    ],
    "eagle3_patches/registry.py": [
        "test_drift_report.py",
        "test_activation.py",
        "test_adding_a_patch.py",
        "test_fork.py",
    ],
    "eagle3_patches/checkpoint/draft_fields.py": ["test_doctor_fields.py", "test_eagle3_draft_config_fields.py"],
    "eagle3_patches/checkpoint/d2t.py": ["test_ckpt_doctor.py"],
    # the doctor's verdict on every draft layout, served, served after convert or not served
    "eagle3_patches/doctor/draft_checks.py": ["test_draft_layouts.py"],
    "eagle3_patches/checkpoint/expected_accept.py": [
        "test_measure_accept.py",
        "test_accept_watchdog.py",
        "test_doctor_runtime.py",
        "test_ckpt_convert.py",
    ],
    "eagle3_patches/acceptance/target_states.py": ["test_measure_accept.py"],
    "eagle3_patches/plugin.py": ["test_doctor_verdicts.py", "test_doctor_launch_environ.py"],
    "eagle3_patches/settings.py": ["test_settings_as_typed.py", "test_plugin.py", "test_activation.py"],
    # the watchdog on sglang's real scheduler classes, and its judging of windows served at another temperature
    "eagle3_patches/instruments/accept_watchdog.py": [
        "test_watchdog_on_sglang.py",
        "test_measure_accept_temperature.py",
    ],
}


#: packages whose modules share the package's tests (the doctor: its checks, its report and its entry point are
#: tested through ``doctor()``, by tests/checkpoint/test_ckpt_doctor.py; the fork-path applier: its diff engine,
#: series, atomic write and planning by tests/fork/test_fork.py and test_fork_units.py)
SPLIT_PACKAGES = ("doctor", "fork")


def tests_for(module: Path) -> list[Path]:
    """The module's own test files (module docstring: derived from names, imports and the patch name), and those
    of :data:`TESTED_THROUGH`."""
    stem = module.stem
    rel = module.relative_to(ROOT)
    dotted = ".".join(rel.with_suffix("").parts)
    files = _test_files()
    # a file named after the module is its test even in a slow directory (rank_consistency: tests/distributed),
    # though not one that starts real servers (expected_accept: tests/e2e; its unit tests are found by import)
    named = [
        p
        for p in _test_files(heavy=True)
        if re.fullmatch(rf"test_(ckpt_)?{re.escape(stem)}(_\w+)?\.py", p.name)
        and p.relative_to(TEST_ROOT).parts[0] != "e2e"
    ]
    if not named and module.parent.name in SPLIT_PACKAGES:  # a module of a package its tests are named after
        named = [
            p
            for p in _test_files(heavy=True)
            if re.fullmatch(rf"test_(ckpt_)?{re.escape(module.parent.name)}(_\w+)?\.py", p.name)
        ]
    source = module.read_text()
    if not named:
        patch_name = re.search(r'^\s*(?:name|NAME) = "(\w+)"', source, re.M)
        needles = [dotted, f"import {stem}"] + ([f'"{patch_name.group(1)}"'] if patch_name else [])
        if module.parent.name == "cli" and stem.endswith("_cmd"):  # a subcommand: the tests that run it
            needles.append(f'"{stem.removesuffix("_cmd")}"')
        named = [p for p in files if any(n in p.read_text() for n in needles)]
    if not named:  # tests/ mirrors the library: the tests of the module's package
        named = [p for p in files if p.parent == TEST_ROOT / module.parent.name]
    through = TESTED_THROUGH.get(rel.as_posix(), [])
    named += [p for p in files if p.name in through and p not in named]
    if re.search(r"^\s*in_fork_series = ", source, re.M):
        # a patch kept out of the fork series (or put in it): the series must mirror the registry (1 s, no sglang)
        named.insert(0, TEST_ROOT / "fork" / "test_fork.py::test_series_mirrors_the_registry_and_carries_the_markers")
    if rel.parts[1:2] in (("patches",), ("instruments",)) and re.search(r"^if TYPE_CHECKING:", source, re.M):
        # an import kept to type checking: a serving process must not load the offline layer it names (2 s)
        named.append(
            TEST_ROOT / "unit" / "test_architecture.py::test_a_serving_process_loads_none_of_the_offline_tools"
        )
    if "/patches/" in f"/{rel.as_posix()}" and "def preflight" in source:
        # first: a mutant of the doctor rule dies there in seconds, before the patch's sglang tests start
        named = [p for p in files if p.name == "test_ckpt_doctor.py"] + [
            p for p in named if p.name != "test_ckpt_doctor.py"
        ]
    return named


def release_for(module: Path, wanted: str | None = None) -> str | None:
    """The sglang release a module's mutants run against: None for ``.venv``'s pinned one, which every module
    uses whose code runs there (the checkpoint tools, the registry, the applier, a patch whose range covers
    it); for a patch whose range leaves it out, the newest release of the matrix in the patch's range (or
    ``wanted``), whose venv ``tools/matrix.py`` builds under ``.matrix/``."""
    if module.parent.name != "patches":
        return wanted
    import importlib

    from packaging.version import Version

    from eagle3_patches.sglang_version import installed_sglang_version

    patch = importlib.import_module(f"eagle3_patches.patches.{module.stem}").PATCH
    if wanted is None:
        if patch.covers(installed_sglang_version()):
            return None
        data = matrix.load_data()
        known = sorted({data["pinned"], data["newest_known"], *_built_releases()}, key=Version)
        covered = [v for v in known if patch.covers(Version(v))]
        if not covered:
            raise SystemExit(f"{module.relative_to(ROOT)}: no release of the matrix is in {patch.applies_to}")
        built = [v for v in covered if v in _built_releases()]
        wanted = (built or covered)[-1]
    elif not patch.covers(Version(wanted)):
        raise SystemExit(
            f"{module.relative_to(ROOT)}: sglang {wanted} is outside {patch.applies_to}; "
            "its mutants would all survive there"
        )
    return wanted


def _built_releases() -> list[str]:
    return [p.name.removeprefix("venv-") for p in (ROOT / ".matrix").glob("venv-*") if (p / "bin" / "python").exists()]


def test_python(release: str | None) -> Path:
    """The python that runs the tests: ``.venv``'s, or the matrix's venv of ``release`` with coverage.py added
    (the pinned version, for the coverage-ordered tests)."""
    if release is None:
        return VENV_PY
    py = ROOT / ".matrix" / f"venv-{release}" / "bin" / "python"
    if not py.exists():
        raise SystemExit(
            f"no venv for sglang {release}: build it with `python3 tools/matrix.py --releases {release} --setup-only`"
        )
    if subprocess.run([str(py), "-c", "import coverage"], capture_output=True).returncode != 0:
        pin = next(
            line.split("#")[0].strip()
            for line in (ROOT / "tools" / "requirements-mutation.txt").read_text().splitlines()
            if line.startswith("coverage==")
        )
        installer = (
            ["uv", "pip", "install", "--python", str(py)] if shutil.which("uv") else [str(py), "-m", "pip", "install"]
        )
        subprocess.run([*installer, "-q", pin], check=True)
    return py


def test_argv(module: Path, files: list[Path], python: Path = VENV_PY) -> list[str]:
    """The module's test command; its test files (or node ids) come last.  The pytest plugins of hypothesis and
    anyio are left out where no test file names them: importing them is a third of a checkpoint-tool mutant's
    start-up (about 2.5 s of CPU each time)."""
    marker = ["-m", "not stock"] if module.parent.name == "patches" else []
    text = "\n".join(p.read_text() for p in files if p.is_file())
    unused = [
        arg
        for plugin, name in (("hypothesispytest", "hypothesis"), ("anyio", "anyio"))
        if name not in text
        for arg in ("-p", f"no:{plugin}")
    ]
    return [
        str(python),
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        *unused,
        "--no-header",
        "-W",
        "ignore",
        *marker,
        *(str(p.relative_to(ROOT)) for p in files),
    ]


def slug(module: Path) -> str:
    return module.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")


# ---------------------------------------------------------------------------------------------------- equivalents
#: a mark of equivalent mutants: cosmic-ray's pragma on a comment line right above the code it marks, naming the
#: operator (and, where it makes other mutants there too, what its equivalent ones write), then why
PRAGMA = re.compile(r"#\s*pragma:\s*no mutate\b\s*(?P<op>\S*?)(?P<texts>(?:[\s,]*`[^`]+`)*)\s*(?::\s*(?P<why>.*))?$")
#: a session's record of a mutant it skipped for its mark
EQUIVALENT = "equivalent: marked in the code"


def _squeeze(text: str) -> str:
    return "".join(text.split())


def equivalent_marks(module: Path) -> dict[int, list[tuple[str, tuple[str, ...], int]]]:
    """line -> (operator, texts, the mark's line) for each ``# pragma: no mutate OP [`text`, ...]: why`` comment of
    the module (read as comments: the text of a string is not one), on its own line right above the code it marks:
    a statement, all its lines (a formatter may split it), or a line inside one, that line.  The reason may go on
    over the comment lines below it.  A mark naming no operator of the tool, without its reason, after code on its
    line or above no code stops the run, naming the file and line."""
    rel = module.relative_to(ROOT).as_posix() if module.is_relative_to(ROOT) else str(module)
    known = {name for name, _, _ in operator_rows()}
    marks: dict[int, list[tuple[str, tuple[str, ...], int]]] = {}
    pending: list[tuple[int, str, tuple[str, ...]]] = []  # the marks of the comment lines above, not yet placed
    placed: list[tuple[int, str, tuple[str, ...], int]] = []  # (the statement's first line, ...) until its end
    starts = True  # the next token begins a statement
    for tok in tokenize.generate_tokens(io.StringIO(module.read_text()).readline):
        if tok.type == tokenize.COMMENT:
            m = PRAGMA.match(tok.string)
            if m is None:
                continue
            if m["op"] not in known or not (m["why"] or "").strip() or not tok.line.lstrip().startswith("#"):
                raise SystemExit(
                    f"{rel}:{tok.start[0]}: {tok.string[:60]!r}... is not a mark of equivalent mutants; expected "
                    "`# pragma: no mutate OPERATOR: why` (an operator of docs/testing.md's table, then `text` where "
                    "it makes other mutants there too) on its own line, above the code"
                )
            pending.append((tok.start[0], m["op"], tuple(re.findall(r"`([^`]+)`", m["texts"]))))
        elif tok.type == tokenize.NL and not tok.line.strip() and pending:
            break  # a blank line under a mark: refused below
        elif tok.type in (tokenize.INDENT, tokenize.DEDENT):
            starts = True
        elif tok.type not in (tokenize.NL, tokenize.ENDMARKER):
            for at, op, texts in pending:  # a statement: all of it; a line inside one: that line
                if starts:
                    placed.append((tok.start[0], op, texts, at))
                else:
                    marks.setdefault(tok.start[0], []).append((op, texts, at))
            pending, starts = [], tok.type == tokenize.NEWLINE
            if starts:  # the end of the statement
                for first, op, texts, at in placed:
                    for n in range(first, tok.start[0] + 1):
                        marks.setdefault(n, []).append((op, texts, at))
                placed = []
    if pending:
        raise SystemExit(
            f"{rel}:{pending[0][0]}: `# pragma: no mutate` marks no statement; expected it in the comment lines "
            "right above the statement whose mutants it names (no blank line between)"
        )
    return marks


def is_marked(marks: dict, operator: str, first: int, last: int, before: str = "", after: str = "") -> bool:
    """Whether the mutant ``operator`` makes of lines ``first``-``last`` (``before`` to ``after``, whitespace
    aside) is marked equivalent: a mark of the operator on one of those lines, without texts or with one that the
    mutant writes and the line did not hold."""
    b, a = _squeeze(before), _squeeze(after)
    return any(
        op == operator and (not texts or any(_squeeze(t) in a and _squeeze(t) not in b for t in texts))
        for n in range(first, last + 1)
        for op, texts, _ in marks.get(n, ())
    )


def needs_text(marks: dict, operator: str, first: int, last: int) -> bool:
    """Whether a mark on those lines names ``operator`` by what its mutant writes (the mutant must be made)."""
    return any(op == operator and texts for n in range(first, last + 1) for op, texts, _ in marks.get(n, ()))


def unused_marks(marks: dict, made: list[tuple[str, int, int, str, str]]) -> list[tuple[int, str]]:
    """The marks (the mark's line, operator) no mutant in ``made`` ((operator, first line, last line, before, after)
    each) answers: left by an edit that took the operator's site away or changed what its mutant writes."""
    each: dict[tuple[int, str], dict] = {}
    for n, entries in marks.items():
        for op, texts, at in entries:
            each.setdefault((at, op), {}).setdefault(n, []).append((op, texts, at))
    return sorted(key for key, own in each.items() if not any(is_marked(own, *m) for m in made))


def marked_mutants(module: Path, specs: list, operators: list[str]) -> list[tuple[str, int, int, str, str]]:
    """(operator, first line, last line, before, after) for the mutants ``specs`` (cosmic-ray's) of the kept
    ``operators``; a mutant's text only where a mark names its operator by it.  Prints the marks no mutant answers."""
    from cosmic_ray.mutating import _make_diff, mutate_code
    from cosmic_ray.plugins import get_operator

    marks, source, made = equivalent_marks(module), module.read_text(), []
    for spec in specs:
        if spec.operator_name not in operators:
            continue
        first, last, before, after = spec.start_pos[0], spec.end_pos[0], "", ""
        if needs_text(marks, spec.operator_name, first, last):
            mutated = mutate_code(source, get_operator(spec.operator_name)(**spec.operator_args), spec.occurrence)
            before, after = diff_lines("\n".join(_make_diff(source, mutated or source, module)))
        made.append((spec.operator_name, first, last, before, after))
    for n, op in unused_marks(marks, made):
        print(f"   {module.relative_to(ROOT)}:{n}: the mark of {op}'s equivalent mutants answers no mutant there")
    return made


def diff_lines(diff: str) -> tuple[str, str]:
    minus = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    return " / ".join(minus), " / ".join(plus)


# ---------------------------------------------------------------------------------------------------- sessions
def _live_run() -> int | None:
    """The pid of a mutation run still going in this checkout, if any."""
    try:
        pid = int((STATE / "lock").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


# ---------------------------------------------------------------------------------------------------- workers
def worker_roots(n: int) -> list[Path]:
    """Where each of ``n`` workers writes its mutants and runs its tests: copies of this checkout
    (``.mutation/worker-K``: every file git tracks or does not ignore, as it is now; made afresh each run, so a
    run stopped mid-mutant leaves nothing behind, and the checkout itself is never mutated: work and commits go
    on during a run).  A worker's tests import eagle3_patches from its own root (it is their working directory
    and ``PYTHONPATH``, ahead of the editable install), and so do the sglang processes they start."""
    roots = []
    listed = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    for k in range(n):
        copy = STATE / f"worker-{k}"
        shutil.rmtree(copy, ignore_errors=True)
        for rel in filter(None, listed):
            src = ROOT / rel
            if src.is_file():
                (copy / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, copy / rel)
        roots.append(copy)
    return roots


def worker_env(root: Path, k: int, release: str | None = None) -> dict[str, str]:
    if release is None:
        env = dict(os.environ)
    else:  # the matrix's environment of that release (its bytecode cache of torch and sglang, no PYTHONPATH)
        env = matrix._env(release)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
    env["EAGLE3_TINY_CACHE"] = str(STATE / f"tiny-{k}")  # tiny checkpoints are built on first use: one cache a worker
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no stale .pyc may hide a mutant written within the same second
    return env


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant (psutil, which sglang requires, walks the tree; the descendants are
    listed before anyone dies, so none is reparented out of reach), then the process group for what forked
    meanwhile."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(pid, 9)
    except OSError:
        pass


def run_command(argv: list[str], root: Path, env: dict[str, str], timeout: float) -> tuple[str, str]:
    """``(outcome, output)``: "survived" when the tests pass, "killed" when they fail or time out (the test
    command's whole process tree is killed: its process group, sglang's children with it, and the descendants
    that started sessions of their own, e.g. the CLI runs of the hostile-input tests), cosmic-ray's meaning of
    both."""
    proc = subprocess.Popen(
        argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.communicate()
        return "killed", "timeout"
    return ("survived" if proc.returncode == 0 else "killed"), out.decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------------- coverage
def coverage_map(module: Path, argv: list[str], root: Path, timeout: float, release: str | None = None) -> dict:
    """The module's tests run once with coverage in every process (tools/mutation_coverage.py): whether they
    pass, how long they took (in all and per test), the node ids in order, and for each line of the module the
    tests that ran it ("" for the pytest process outside any test: collection, imports)."""
    import coverage

    data_dir = STATE / "coverage" / slug(module)
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    data_dir.chmod(0o1777)  # a test's child that drops to another uid (test_ckpt_hostile's setpriv) writes here too
    env = worker_env(root, 0, release)
    env.update(
        {
            "EAGLE3_MUTATION_COVERAGE": str(data_dir / "cov"),
            "EAGLE3_MUTATION_INCLUDE": str(module),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), env["PYTHONPATH"]]),
        }
    )
    t0 = time.monotonic()
    outcome, output = run_command([*argv[:3], "-p", "mutation_coverage", *argv[3:]], root, env, timeout)
    seconds = time.monotonic() - t0
    tests_file = data_dir / "tests.json"
    tests = json.loads(tests_file.read_text()) if tests_file.exists() else []
    durations_file = data_dir / "durations.json"
    durations = json.loads(durations_file.read_text()) if durations_file.exists() else {}
    cov = coverage.Coverage(data_file=str(data_dir / "cov"), config_file=False)  # combines cov.* into cov
    cov.combine([str(data_dir)], keep=True)
    data = cov.get_data()
    lines: dict[int, set[str]] = {}
    for measured in data.measured_files():
        if Path(measured).resolve() == module.resolve():
            lines = {n: set(c) for n, c in data.contexts_by_lineno(measured).items()}
    lines = statement_lines(lines, module.read_text())
    return {
        "passed": outcome == "survived",
        "seconds": seconds,
        "output": output,
        "tests": tests,
        "lines": lines,
        "durations": durations,
    }


def statement_lines(lines: dict[int, set[str]], source: str) -> dict[int, set[str]]:
    """coverage.py records a statement on its first line only; a mutant on a later line of it (an element of a
    literal spread over lines) belongs to the tests that ran that first line.  Each line no test is recorded on
    gets the tests of the innermost statement around it that has some (a line never run inside a block gets
    the block's: more tests than can kill it, never fewer)."""
    import ast

    spans = sorted(
        ((n.lineno, n.end_lineno or n.lineno) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.stmt)),
        key=lambda se: se[1] - se[0],
    )  # innermost first
    out = dict(lines)
    for n in range(1, len(source.splitlines()) + 1):
        if n not in lines:
            for start, end in spans:
                if start <= n <= end and start in lines:
                    out[n] = lines[start]
                    break
    return out


def test_order(
    tests: list[str],
    lines: dict[int, set[str]],
    first: int,
    last: int,
    durations: dict[str, float] | None = None,
    covering_only: bool = False,
) -> list[str]:
    """Every test, those that ran lines ``first``..``last`` first, the quickest of them first (``durations``: the
    coverage run's seconds per test): a mutant there dies at the first test that notices it (``pytest -x``), and
    a survivor still runs all of them.  A line run outside any test (imports, collection) or never seen keeps
    the usual order.  ``covering_only``: the tests that ran the lines and no other (none for a line never seen;
    every test for one run outside any test)."""
    ran: set[str] = set()
    for n in range(first, last + 1):
        ran |= lines.get(n, set())
    if "" in ran or (not ran and not covering_only):
        return tests
    first_ones = [t for t in tests if t in ran]
    if durations:
        first_ones.sort(key=lambda t: durations.get(t, float("inf")))  # stable: ties keep the file order
    return first_ones if covering_only else first_ones + [t for t in tests if t not in ran]


def session_meta(module: Path) -> Path:
    """Where a module's session records its part and source (beside its cosmic-ray database)."""
    return STATE / f"{slug(module)}.json"


def session_part(
    meta_path: Path, lines: list[int], operators: list[str], changed_since: str | None
) -> tuple[list[int], list[str], str | None]:
    """The part of a module ``--retry-survivors`` reruns: the one named on the command line, else the one its session
    ran (``--line``, ``--operator`` and ``--changed-since`` from the session's record), so that a retry reruns that
    session's survivors instead of starting a whole-module session over it."""
    if lines or operators or changed_since or not meta_path.exists():
        return lines, operators, changed_since
    meta = json.loads(meta_path.read_text())
    return list(meta.get("lines") or []), list(meta.get("operators") or []), meta.get("changed_since")


def run_module(
    module: Path,
    operators: list[str],
    *,
    fresh: bool,
    timeout_factor: float,
    lines: list[int],
    only: list[str] | None = None,
    retry_survivors: bool = False,
    workers: int = 1,
    release: str | None = None,
    covering_only: bool = False,
    changed_since: str | None = None,
) -> None:
    """``lines``: only the mutants on those lines (``--line``), or, with ``changed_since``, the mutants of a statement
    that has a line changed since that commit (its lines, from :func:`changed_lines`)."""
    import concurrent.futures
    import queue

    from cosmic_ray.commands import init
    from cosmic_ray.mutating import _make_diff, use_mutation
    from cosmic_ray.plugins import get_operator
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    files = tests_for(module)
    if not files:
        print(f"{module.relative_to(ROOT)}: no test files found; skipped")
        return
    release = release_for(module, release)
    argv = test_argv(module, files, test_python(release))
    files_at = len(argv) - len(files)
    command = shlex.join(argv)
    db_path = STATE / f"{slug(module)}.sqlite"
    meta_path = session_meta(module)
    source = module.read_text()
    carry, started = False, time.strftime("%Y-%m-%d")
    if db_path.exists() and not fresh and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        same_part = (
            meta.get("operators", []) == (only or [])
            and meta.get("release") == release
            and meta.get("changed_since") == changed_since
            and (changed_since is not None or meta.get("lines", []) == lines)  # --changed-since: derived, may shift
        )
        if same_part and meta.get("source") != source and code_tokens(meta.get("source", "")) == code_tokens(source):
            carry, started = True, meta.get("started", started)
            print(
                f"{module.relative_to(ROOT)}: only comments changed since the session began (a mark added or moved): "
                "its mutants are the same, their results kept, the marks read again"
            )
        elif not same_part or meta.get("source") != source:
            print(
                f"{module.relative_to(ROOT)}: the module (or --line, --changed-since, --operator, or the release) "
                "changed since the session began; starting over"
            )
            fresh = True
    else:
        fresh = True
    print(
        f"== {module.relative_to(ROOT)} (sglang {release or 'pinned, .venv'})\n   tests: {shlex.join(argv[files_at:])}"
        + (' (-m "not stock")' if "not stock" in argv else ""),
        flush=True,
    )
    cov = coverage_map(module, argv, ROOT, 3600, release)
    if not cov["passed"]:  # the unmutated tests must pass
        print(f"   baseline FAILED: the unmutated tests do not pass; module skipped\n{cov['output'][-3000:]}")
        return
    timeout = max(120.0, cov["seconds"] * timeout_factor)
    print(
        f"   baseline {cov['seconds']:.0f} s with coverage ({len(cov['tests'])} tests, {len(cov['lines'])} lines "
        f"run); per-mutant timeout {timeout:.0f} s",
        flush=True,
    )
    if fresh or carry:
        kept_results = _results_by_mutant(db_path) if carry else {}
        seeded = db_path.with_name(db_path.name + ".new") if carry else db_path
        seeded.unlink(missing_ok=True)
        with use_db(str(seeded), WorkDB.Mode.create) as db:
            init([module], db, {})
            # operators outside the kept set or the session's, and mutants that change nothing in the code (a no-op
            # edit), are skipped; so are those marked equivalent in the code, recorded as such
            items = [(item.job_id, item.mutations[0]) for item in db.pending_work_items]
            marks = equivalent_marks(module)
            kept = [(job, spec) for job, spec in items if spec.operator_name in operators]
            made = dict(zip([job for job, _ in kept], marked_mutants(module, [spec for _, spec in kept], operators)))
            for job, spec in items:
                if (
                    spec.operator_name not in operators
                    or (lines and not changed_since and spec.start_pos[0] not in lines)
                    or (changed_since and not touches(spec.start_pos[0], spec.end_pos[0], lines))
                    or (only and spec.operator_name not in only)
                ):
                    db.set_result(job, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
                elif is_marked(marks, *made[job]):
                    db.set_result(job, WorkResult(output=EQUIVALENT, worker_outcome=WorkerOutcome.SKIPPED))
                elif (spec.operator_name, spec.occurrence) in kept_results:
                    db.set_result(job, kept_results[spec.operator_name, spec.occurrence])
        if carry:
            seeded.replace(db_path)
        meta_path.write_text(
            json.dumps(
                {
                    "source": source,
                    "command": command,
                    "lines": lines,
                    "operators": only or [],
                    "release": release,
                    "changed_since": changed_since,
                    "started": started,
                }
            )
        )
    if retry_survivors and not fresh:  # the tests got stronger: the survivors run again, the rest is kept
        import sqlite3

        with sqlite3.connect(db_path) as con:
            rows = con.execute("SELECT job_id FROM work_results WHERE upper(test_outcome) = 'SURVIVED'").fetchall()
            con.executemany("DELETE FROM work_results WHERE job_id = ?", rows)
    roots = worker_roots(workers)
    free: queue.Queue[int] = queue.Queue()
    for k in range(len(roots)):
        free.put(k)

    def one(item) -> WorkResult:
        k = free.get()
        try:
            spec = item.mutations[0]
            target = roots[k] / module.relative_to(ROOT)
            with use_mutation(target, get_operator(spec.operator_name)(**spec.operator_args), spec.occurrence) as (
                original,
                mutated,
            ):
                if mutated is None:
                    return WorkResult(worker_outcome=WorkerOutcome.NO_TEST)
                order = test_order(
                    cov["tests"], cov["lines"], spec.start_pos[0], spec.end_pos[0], cov["durations"], covering_only
                )
                if order:
                    outcome, output = run_command(
                        [*argv[:files_at], *order], roots[k], worker_env(roots[k], k, release), timeout
                    )
                else:
                    outcome, output = "survived", "no test runs these lines (--covering-only)"
            diff = "\n".join(_make_diff(original, mutated, module))
            return WorkResult(
                output=output, diff=diff, test_outcome=TestOutcome(outcome), worker_outcome=WorkerOutcome.NORMAL
            )
        except Exception as exc:  # noqa: BLE001 - recorded as cosmic-ray records a broken worker
            return WorkResult(
                output=f"{type(exc).__name__}: {exc}",
                test_outcome=TestOutcome.INCOMPETENT,
                worker_outcome=WorkerOutcome.EXCEPTION,
            )
        finally:
            free.put(k)

    with use_db(str(db_path), WorkDB.Mode.open) as db:
        pending = list(db.pending_work_items)
        print(f"   {len(pending)} mutants to run on {len(roots)} worker(s)", flush=True)
        t1 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(roots)) as pool:
            futures = {pool.submit(one, item): item for item in pending}
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                db.set_result(futures[future].job_id, future.result())  # sqlite: this thread only
                if done % 10 == 0 or done == len(pending):
                    print(f"   {done}/{len(pending)} ({time.monotonic() - t1:.0f} s)", flush=True)
        print(f"   ran in {time.monotonic() - t1:.0f} s", flush=True)


def code_tokens(source: str) -> list[tuple[int, str]]:
    """The tokens of ``source`` that make its code: comments and blank lines left out, so a mark added, moved or
    reworded leaves them as they were (and cosmic-ray's mutants, numbered per operator over the code, too)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return [(-1, source)]
    return [(t.type, t.string) for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL)]


def _results_by_mutant(db_path: Path) -> dict:
    """(operator, occurrence) -> the result of each mutant a session ran (not those it skipped)."""
    from cosmic_ray.work_db import WorkDB, use_db

    with use_db(str(db_path), WorkDB.Mode.open) as db:
        return {
            (item.mutations[0].operator_name, item.mutations[0].occurrence): result
            for item, result in db.completed_work_items
            if result.worker_outcome.value != "skipped"
        }


def results(module: Path) -> dict | None:
    from cosmic_ray.work_db import WorkDB, use_db

    db_path = STATE / f"{slug(module)}.sqlite"
    if not db_path.exists():
        return None
    out = {"killed": 0, "timeouts": 0, "survived": [], "equivalent": 0, "pending": 0, "incompetent": 0}
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome.value in ("skipped", "no-test"):
                out["equivalent"] += result.output == EQUIVALENT
                continue
            if result.test_outcome is None or result.test_outcome.value == "incompetent":
                out["incompetent"] += 1
                continue
            if result.test_outcome.value == "killed":
                timed_out = "timeout" in (result.output or "").lower() and "Timeout" in (result.output or "")
                out["timeouts" if timed_out else "killed"] += 1
                continue
            before, after = diff_lines(result.diff or "")
            spec = item.mutations[0]
            out["survived"].append(
                {"line": spec.start_pos[0], "operator": spec.operator_name, "before": before, "after": after}
            )
        out["pending"] = sum(1 for _ in db.pending_work_items)
    counted = out["killed"] + out["timeouts"] + len(out["survived"])
    out["score"] = (out["killed"] + out["timeouts"]) / counted if counted else None
    return out


TABLE = re.compile(r"(<!-- BEGIN operators -->\n).*?(<!-- END operators -->)", re.S)


def write_operators_table() -> None:
    text = DOC.read_text()
    DOC.write_text(TABLE.sub(lambda m: m.group(1) + operators_table() + m.group(2), text))


HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.M)


def hunk_lines(diff: str) -> list[int]:
    """The lines of the new side that a ``git diff -U0`` changed: those it added or rewrote, and for a hunk that
    only deletes, the lines on either side of the gap (the code that now runs where the deleted lines ran)."""
    out: set[int] = set()
    for m in HUNK.finditer(diff):
        start, count = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
        out.update(range(start, start + count) if count else (start, start + 1))
    return sorted(n for n in out if n > 0)


def changed_lines(module: Path, rev: str, root: Path = ROOT) -> list[int]:
    """The lines of ``module`` changed since commit ``rev`` (:func:`hunk_lines`); every line of a module added
    since.  ``rev`` not a commit of the checkout: SystemExit naming it."""
    git = ["git", "-C", str(root)]
    if subprocess.run([*git, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], capture_output=True).returncode:
        raise SystemExit(f"--changed-since {rev}: not a commit of {root}; expected a revision `git log` shows")
    rel = module.relative_to(root).as_posix()
    if subprocess.run([*git, "cat-file", "-e", f"{rev}:{rel}"], capture_output=True).returncode:
        return list(range(1, len(module.read_text().splitlines()) + 1))  # added since
    diff = subprocess.run(
        [*git, "diff", "-U0", "--no-color", "--no-ext-diff", rev, "--", rel], capture_output=True, text=True, check=True
    ).stdout
    return hunk_lines(diff)


def touches(first: int, last: int, lines: Iterable[int]) -> bool:
    """Whether a mutant of lines ``first``..``last`` (a statement may span several) touches one of ``lines``."""
    return any(first <= n <= last for n in lines)


def _ranges(lines: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``3-5, 9``."""
    spans: list[list[int]] = []
    for n in sorted(lines):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


SCORES_HEADER = (
    "| module | session | killed | timeouts | survived | equivalent | incompetent | not run | score |\n"
    "|---|---|---|---|---|---|---|---|---|\n"
)
#: a row of the table: the module, what part of it the session ran (lines, operators, release), the rest
SCORE_ROW = re.compile(r"\| `(?P<module>[^`]+)`(?P<part>[^|]*)\|")


def score_rows(modules: list[Path]) -> tuple[list[str], list[tuple[Path, dict]]]:
    """A table row for each session of ``modules`` (those that have one), and their survivors."""
    rows, survivors = [], []
    for module in modules:
        r = results(module)
        if r is None:
            continue
        score = f"{100 * r['score']:.0f}%" if r["score"] is not None else "-"
        meta = json.loads(session_meta(module).read_text())
        part = f" (lines {_ranges(meta['lines'])} only)" if meta.get("lines") else ""
        part = f" (lines changed since {meta['changed_since']} only)" if meta.get("changed_since") else part
        part += f" (operators {', '.join(meta['operators'])} only)" if meta.get("operators") else ""
        part += f" (sglang {meta['release']})" if meta.get("release") else ""
        rows.append(
            f"| `{module.relative_to(ROOT).as_posix()}`{part} | {meta.get('started', '-')} | {r['killed']} | "
            f"{r['timeouts']} | {len(r['survived'])} | {r['equivalent']} | {r['incompetent']} | {r['pending']} | "
            f"{score} |"
        )
        survivors += [(module, s) for s in r["survived"]]
    return rows, survivors


def merged_scores(old: str, new: list[str]) -> str:
    """The table of scores: the ``new`` rows, and the ``old`` rows they leave standing.  A session replaces its
    module's row of the same part, and a session of the whole module every row of it; a row of a module that is
    no longer in the checkout is dropped."""
    fresh = [SCORE_ROW.match(row) for row in new]
    kept = []
    for row in old.splitlines():
        m = SCORE_ROW.match(row)
        if m is None or m["module"] == "module" or not (ROOT / m["module"]).is_file():
            continue
        if any(f and f["module"] == m["module"] and (not f["part"].strip() or f["part"] == m["part"]) for f in fresh):
            continue
        kept.append(row)
    return SCORES_HEADER + "".join(f"{row}\n" for row in sorted(kept + new, key=lambda r: r.split("|")[1]))


def fault_kinds(modules: list[Path]) -> list[tuple[str, str, int, int, int]]:
    """Per operator over the sessions of ``modules``: (operator, the fault it makes, killed (timeouts included),
    survived, equivalent); what ``--kinds`` prints, the figures docs/testing.md's note on what the suite catches
    quotes."""
    from cosmic_ray.work_db import WorkDB, use_db

    faults = {name: fault for name, fault, _ in operator_rows()}
    counts: dict[str, list[int]] = {}
    for module in modules:
        db_path = STATE / f"{slug(module)}.sqlite"
        if not db_path.exists():
            continue
        with use_db(str(db_path), WorkDB.Mode.open) as db:
            for item, result in db.completed_work_items:
                row = counts.setdefault(item.mutations[0].operator_name, [0, 0, 0])
                if result.worker_outcome.value in ("skipped", "no-test"):
                    row[2] += result.output == EQUIVALENT
                elif result.test_outcome is not None and result.test_outcome.value == "killed":
                    row[0] += 1
                elif result.test_outcome is not None and result.test_outcome.value == "survived":
                    row[1] += 1
    return [(name, faults.get(name, "-"), *counts[name]) for name in sorted(counts) if any(counts[name])]


def report(modules: list[Path]) -> None:
    rows, survivors = score_rows(modules)
    print(SCORES_HEADER + "".join(f"{row}\n" for row in rows), end="")
    for module, s in survivors:
        print(
            f"SURVIVED {module.relative_to(ROOT).as_posix()}:{s['line']} {s['operator']}\n"
            f"    - {s['before']}\n    + {s['after']}"
        )


SCORES = re.compile(r"(<!-- BEGIN scores -->\n)(.*?)(<!-- END scores -->)", re.S)


def write_scores_table(modules: list[Path]) -> None:
    """docs/testing.md's table of scores: the sessions in ``.mutation/`` written over the rows they replace."""
    text = DOC.read_text()
    if not SCORES.search(text):
        raise SystemExit(f"{DOC.relative_to(ROOT)} has no <!-- BEGIN scores --> ... <!-- END scores --> section")
    rows, _ = score_rows(modules)
    DOC.write_text(SCORES.sub(lambda m: m.group(1) + merged_scores(m.group(2), rows) + m.group(3), text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", action="append", default=[], help="a module in scope (repeatable); default: all")
    parser.add_argument("--list", action="store_true", help="print the scope, the test files and mutant counts")
    parser.add_argument("--report", action="store_true", help="print the scores of the sessions so far")
    parser.add_argument(
        "--kinds", action="store_true", help="print, per operator, the mutants the sessions so far killed and missed"
    )
    parser.add_argument("--fresh", action="store_true", help="discard the sessions of these modules and start over")
    parser.add_argument(
        "--line",
        action="append",
        type=int,
        default=[],
        help="only the mutants on this line of the module (repeatable; a partial session, so said in --report)",
    )
    parser.add_argument(
        "--changed-since",
        metavar="REV",
        help="only the mutants of statements changed since commit REV (git diff; every mutant of a module added "
        "since); a partial session, so said in --report",
    )
    parser.add_argument(
        "--operator",
        action="append",
        default=[],
        help="only this operator's mutants, e.g. eagle3/SwapAnyAll (repeatable; a partial session, so said in "
        "--report)",
    )
    parser.add_argument(
        "--operators-table",
        action="store_true",
        help="write the table of the operators a session runs into docs/testing.md (no test runs)",
    )
    parser.add_argument(
        "--scores-table",
        action="store_true",
        help="write the table of the sessions' scores (what --report prints first) into docs/testing.md",
    )
    parser.add_argument(
        "--retry-survivors",
        action="store_true",
        help="run the surviving mutants of the existing sessions again (after the tests got stronger), each in the "
        "part of its module its session ran unless --line, --operator or --changed-since names another",
    )
    parser.add_argument("--timeout-factor", type=float, default=3.0, help="per-mutant timeout = factor x baseline")
    parser.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="mutants run side by side, each worker in its own copy of the checkout (default: "
        "2 or the number of cores, if fewer)",
    )
    parser.add_argument(
        "--release",
        help="the sglang release (a venv of tools/matrix.py) the patch modules' tests run on; "
        "default: the pinned one (.venv) where the patch applies, else the newest "
        "release of the matrix in the patch's range",
    )
    parser.add_argument(
        "--covering-only",
        action="store_true",
        help="run only the tests that ran the mutant's lines (quicker; its survivors are provisional "
        "until --retry-survivors without this flag)",
    )
    args = parser.parse_args(argv)
    if args.line and args.changed_since:
        parser.error("--line and --changed-since both choose the lines: give one")
    if args.operators_table:
        write_operators_table()
        return 0
    ensure_environment()
    os.chdir(ROOT)
    all_modules = scope()
    modules = all_modules
    if args.module:
        modules = [(ROOT / m).resolve() for m in args.module]
        unknown = [m for m in modules if m not in all_modules]
        if unknown:
            parser.error(f"not in scope: {', '.join(str(m) for m in unknown)}")
    STATE.mkdir(exist_ok=True)
    operators = install_operators()
    unknown_ops = sorted(set(args.operator) - set(operators))
    if unknown_ops:
        parser.error(f"unknown operator(s): {', '.join(unknown_ops)}; the operators: {', '.join(operators)}")
    if args.report:
        report(modules)
        return 0
    if args.kinds:
        print("| operator | the fault it makes | killed | survived | equivalent |\n|---|---|---|---|---|")
        for name, fault, killed, survived, equivalent in fault_kinds(modules):
            print(f"| `{name}` | {fault} | {killed} | {survived} | {equivalent} |")
        return 0
    if args.scores_table:
        write_scores_table(modules)
        return 0
    if args.list:
        from cosmic_ray.commands.init import _all_work_items

        for module in modules:
            marks = equivalent_marks(module)
            made = marked_mutants(module, [w.mutations[0] for w in _all_work_items([module], {})], operators)
            if args.changed_since:
                changed = changed_lines(module, args.changed_since)
                made = [m for m in made if touches(m[1], m[2], changed)]
            marked = sum(is_marked(marks, *m) for m in made)
            tests = ", ".join(str(p.relative_to(ROOT)) for p in tests_for(module)) or "(none)"
            print(f"{module.relative_to(ROOT)}: {len(made)} mutants ({marked} marked equivalent); tests: {tests}")
        return 0
    live = _live_run()
    if live is not None:
        parser.error(f"a mutation run (pid {live}) is still going in this checkout; one at a time")
    (STATE / "lock").write_text(str(os.getpid()))
    for module in modules:
        line, only, since = args.line, args.operator, args.changed_since
        if args.retry_survivors and not args.fresh:
            line, only, since = session_part(session_meta(module), line, only, since)
        run_module(
            module,
            operators,
            fresh=args.fresh,
            timeout_factor=args.timeout_factor,
            lines=changed_lines(module, since) if since else line,
            only=only,
            retry_survivors=args.retry_survivors,
            workers=max(1, args.workers),
            release=args.release,
            covering_only=args.covering_only,
            changed_since=since,
        )
    report(modules)
    return 0


if __name__ == "__main__":
    sys.exit(main())
