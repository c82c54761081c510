"""tools/mutation.py: the ordering of a mutant's tests (those that ran the mutated lines first, never fewer
tests) and the release a module's mutants run against."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ["t.py::a", "t.py::b", "u.py::c", "u.py::d"]


@pytest.fixture(scope="module")
def mutation(tool):
    return tool("mutation")


def test_the_tests_that_ran_the_lines_come_first_and_every_test_stays(mutation):
    lines = {10: {"u.py::d"}, 11: {"t.py::b"}, 12: {"u.py::c"}}
    assert mutation.test_order(TESTS, lines, 10, 11) == ["t.py::b", "u.py::d", "t.py::a", "u.py::c"]
    assert mutation.test_order(TESTS, lines, 12, 12) == ["u.py::c", "t.py::a", "t.py::b", "u.py::d"]


def test_the_quickest_of_the_tests_that_ran_the_lines_come_first(mutation):
    lines = {10: {"t.py::a", "u.py::c", "u.py::d"}}
    durations = {"t.py::a": 9.0, "u.py::c": 0.5, "u.py::d": 0.5, "t.py::b": 0.1}
    assert mutation.test_order(TESTS, lines, 10, 10, durations) == ["u.py::c", "u.py::d", "t.py::a", "t.py::b"]
    assert mutation.test_order(TESTS, lines, 10, 10, {}) == ["t.py::a", "u.py::c", "u.py::d", "t.py::b"]


def test_a_line_run_outside_any_test_or_never_seen_keeps_the_usual_order(mutation):
    lines = {10: {"u.py::d", ""}, 11: {"t.py::b"}}
    assert mutation.test_order(TESTS, lines, 10, 11) == TESTS  # module level: imports run it for every test
    assert mutation.test_order(TESTS, lines, 20, 21) == TESTS


def test_covering_only_runs_the_tests_that_ran_the_lines_and_no_other(mutation):
    lines = {10: {"u.py::d"}, 11: {"t.py::b"}, 12: {"u.py::d", ""}}
    durations = {"u.py::d": 0.1, "t.py::b": 2.0}
    assert mutation.test_order(TESTS, lines, 10, 11, durations, covering_only=True) == ["u.py::d", "t.py::b"]
    assert mutation.test_order(TESTS, lines, 20, 21, durations, covering_only=True) == []  # no test runs it
    assert mutation.test_order(TESTS, lines, 12, 12, durations, covering_only=True) == TESTS  # module level


def test_a_later_line_of_a_statement_belongs_to_the_tests_that_ran_its_first(mutation):
    source = (
        "NAMES = (\n    'a',\n    'b',\n)\n\ndef f(x):\n    if x:\n        return [\n            1,\n        ]\n"
        "    return 0\n"
    )
    lines = {1: {""}, 6: {""}, 7: {"t.py::a", "t.py::b"}, 11: {"t.py::b"}}  # line 8 (return [...]) never ran
    got = mutation.statement_lines(lines, source)
    assert got[2] == got[3] == {""}  # the tuple's elements: imports ran them
    assert got[8] == got[9] == {"t.py::a", "t.py::b"}  # never run: the tests of the `if` around it
    assert got[11] == {"t.py::b"} and 5 not in got  # a blank line between statements belongs to none
    assert mutation.test_order(TESTS, got, 9, 9, covering_only=True) == ["t.py::a", "t.py::b"]


def test_plugins_no_test_file_uses_are_not_loaded(mutation):
    """hypothesis' and anyio's pytest plugins stay out of a mutant's run unless its test files use them; the
    command still collects the tests."""
    import subprocess

    module = mutation.ROOT / "eagle3_patches" / "checkpoint" / "convert.py"
    plain = mutation.test_argv(module, [mutation.ROOT / "tests" / "checkpoint" / "test_ckpt_convert.py"])
    fuzz = mutation.test_argv(module, [mutation.ROOT / "tests" / "checkpoint" / "test_ckpt_fuzz.py"])
    assert "no:hypothesispytest" in plain and "no:anyio" in plain
    assert "no:hypothesispytest" not in fuzz
    run = subprocess.run([*plain[:-1], "--co", plain[-1]], cwd=mutation.ROOT, capture_output=True, text=True)
    assert run.returncode == 0 and "test_cli_convert" in run.stdout, run.stdout + run.stderr


def test_a_patch_runs_against_a_release_where_it_applies(mutation):
    """A patch whose range leaves out the pinned release (layer_id_convention: 0.5.13 and later) runs its
    mutants on a release in its range, the newest of the matrix's; every other module on the pinned one."""
    from packaging.version import Version

    from eagle3_patches.patches.layer_id_convention import PATCH
    from eagle3_patches.sglang_version import installed_sglang_version

    patches = mutation.ROOT / "eagle3_patches" / "patches"
    release = mutation.release_for(patches / "layer_id_convention.py")
    if PATCH.covers(installed_sglang_version()):  # a release of the matrix from 0.5.13 on runs the tests
        assert release is None
    else:
        assert PATCH.covers(Version(release))
        assert Version(release) >= Version(mutation.matrix.load_data()["newest_known"])
    assert mutation.release_for(patches / "eagle3_fc_guard.py") is None  # 0.5.9 is in its range
    assert mutation.release_for(mutation.ROOT / "eagle3_patches" / "checkpoint" / "d2t.py") is None
    assert mutation.release_for(patches / "layer_id_convention.py", "0.5.13") == "0.5.13"
    with pytest.raises(SystemExit, match=r"sglang 0\.5\.9 is outside >=0\.5\.13; its mutants would all survive there"):
        mutation.release_for(patches / "layer_id_convention.py", "0.5.9")


MARKED = """\
def f(args, kwargs):
    # pragma: no mutate core/NumberReplacer `> 3`, `> 1`: sglang passes four positional arguments
    return args[2] if len(args) > 2 else kwargs["x"]


def g(x):
    # pragma: no mutate eagle3/DeleteCallStatement: the tests see nothing it registers
    x.add(
        1,
    )
    x.remove(1)
    return "# pragma: no mutate core/AddNot: a string, not a mark"
"""


def test_a_mark_spares_the_mutants_it_names_and_no_other(mutation, operators, tmp_path):
    """The marked mutants of a session are skipped and counted equivalent: only the operator named, only the
    statement below the mark, only the mutants writing the texts named; a mark's text in a string is none."""
    import parso

    module = tmp_path / "m.py"
    module.write_text(MARKED)
    marks = mutation.equivalent_marks(module)
    line = 'return args[2] if len(args) > 2 else kwargs["x"]'
    assert mutation.is_marked(marks, "core/NumberReplacer", 3, 3, line, line.replace("> 2", "> 3"))
    assert mutation.is_marked(marks, "core/NumberReplacer", 3, 3, line, line.replace("> 2", "> 1"))
    assert not mutation.is_marked(marks, "core/NumberReplacer", 3, 3, line, line.replace("[2]", "[ 3]"))
    assert not mutation.is_marked(marks, "core/ReplaceComparisonOperator_Gt_GtE", 3, 3, line, line)
    assert not mutation.is_marked(marks, "core/AddNot", 12, 12)
    # the project's own operator, walked as a session walks the module: the marked call is not run, the other is
    op = operators.DeleteCallStatement()
    stack, spans = [parso.parse(MARKED)], []
    while stack:
        node = stack.pop()
        spans += [(start[0], end[0]) for start, end in op.mutation_positions(node)]
        stack += getattr(node, "children", [])
    run = [span for span in sorted(spans) if not mutation.is_marked(marks, "eagle3/DeleteCallStatement", *span)]
    assert sorted(spans) == [(8, 10), (11, 11)] and run == [(11, 11)]


@pytest.mark.parametrize(
    "text, line",
    [
        ("x = 1\n# pragma: no mutate core/NoSuchOperator: why\ny = 2\n", 2),
        ("x = 1\n# pragma: no mutate core/NumberReplacer\ny = 2\n", 2),
        ("x = 1\ny = 2  # pragma: no mutate core/NumberReplacer: why\n", 2),
        ("x = 1\n# pragma: no mutate core/NumberReplacer: why\n\ny = 2\n", 2),
        ("x = 1\n# pragma: no mutate core/NumberReplacer: why\n", 2),
    ],
    ids=["unknown-operator", "no-reason", "after-code", "blank-line-below", "no-code-below"],
)
def test_a_mark_that_cannot_be_read_stops_the_run_naming_its_line(mutation, tmp_path, text, line):
    module = tmp_path / "m.py"
    module.write_text(text)
    with pytest.raises(SystemExit, match=rf"m\.py:{line}: .*pragma: no mutate"):
        mutation.equivalent_marks(module)


def test_a_mark_no_mutant_answers_is_reported(mutation, tmp_path):
    module = tmp_path / "m.py"
    module.write_text(MARKED)
    marks = mutation.equivalent_marks(module)
    line = 'return args[2] if len(args) > 2 else kwargs["x"]'
    made = [
        ("eagle3/DeleteCallStatement", 8, 10, "", ""),
        ("core/NumberReplacer", 3, 3, line, line.replace("> 2", "> 3")),
    ]
    assert mutation.unused_marks(marks, made) == []
    assert mutation.unused_marks(marks, made[:1]) == [(2, "core/NumberReplacer")]  # the site edited away


def test_the_equivalents_are_marked_in_the_code_and_nowhere_else(mutation):
    """Every mark in scope reads (its operator, its reason, its code below), and no page keeps a table of them."""
    marks = sum(len({e[2] for es in mutation.equivalent_marks(m).values() for e in es}) for m in mutation.scope())
    assert marks > 100
    for page in (ROOT / "docs").glob("*.md"):
        text = page.read_text()
        assert "equivalent mutants -->" not in text and "| mutated to |" not in text, page.name


def test_a_session_writes_its_rows_over_those_it_replaces(mutation):
    module = "eagle3_patches/registry.py"
    old = (
        f"| `{module}` (operators core/AddNot only) | 2026-12-03 | 9 | 0 | 0 | 1 | 0 | 0 | 100% |\n"
        f"| `{module}` (operators eagle3/SwapAnyAll only) | 2026-12-04 | 2 | 0 | 0 | 0 | 0 | 0 | 100% |\n"
        "| `eagle3_patches/gone.py` | 2026-12-03 | 1 | 0 | 0 | 0 | 0 | 0 | 100% |\n"
        "| `eagle3_patches/plugin.py` | 2026-12-04 | 4 | 0 | 0 | 0 | 0 | 0 | 100% |\n"
    )
    partial = f"| `{module}` (operators eagle3/SwapAnyAll only) | 2026-12-07 | 3 | 0 | 0 | 0 | 0 | 0 | 100% |"
    rows = mutation.merged_scores(old, [partial]).splitlines()
    assert rows[2:] == [old.splitlines()[3], old.splitlines()[0], partial]
    whole = f"| `{module}` | 2026-12-07 | 12 | 0 | 0 | 1 | 0 | 0 | 100% |"
    assert mutation.merged_scores(old, [whole]).splitlines()[2:] == [old.splitlines()[3], whole]


def test_a_timed_out_run_leaves_no_process_behind(mutation, tmp_path):
    """A test command that times out is killed with every descendant, also one that started a session of its
    own and writes to a file of its own (as the hostile-input tests' CLI runs do): none keeps a core busy after its
    mutant is scored."""
    import os
    import sys
    import time

    pidfile = tmp_path / "grandchild"
    child = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True,\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    outcome, output = mutation.run_command([sys.executable, "-c", child], tmp_path, dict(os.environ), timeout=3)
    assert (outcome, output) == ("killed", "timeout")
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # SIGKILL is delivered at once; reaping by init may take a moment
        try:
            with open(f"/proc/{grandchild}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"process {grandchild} (started in its own session) outlived the timed-out run")


# ------------------------------------------------------------------------------------------- the project's operators
@pytest.fixture(scope="module")
def operators(tool):
    return tool("mutation_operators")


def test_every_operator_makes_its_examples(operators):
    """Each example is the mutant the operator makes at that occurrence, walked as cosmic-ray walks the tree."""
    for name, cls in operators.OPERATORS.items():
        assert cls.examples(), name
        for pre, post, *occurrence in cls.examples():
            assert operators.mutate_code(pre, cls(), occurrence[0] if occurrence else 0) == post, name


#: the faults found surviving by hand, each on the line of this package it was found on: the operator that now makes
#: it, the line as it is, and the line as the mutant has it
SURVIVOR_KINDS = [
    (
        "DropNormalisation",
        "eagle3_patches/settings.py",
        'value = (raw or "").strip().lower()',
        'value = (raw or "").strip()',
    ),
    (
        "DropPathSeparator",
        "eagle3_patches/checkpoint/safe_io.py",
        "return path == root or path.startswith(root.rstrip(os.sep) + os.sep)",
        "return path == root or path.startswith(root.rstrip(os.sep))",
    ),
    (
        "SwapAnyAll",
        "eagle3_patches/checkpoint/safe_io.py",
        "if not any(_inside(real, r) for r in _allowed_roots(root_real)):",
        "if not all(_inside(real, r) for r in _allowed_roots(root_real)):",
    ),
    (
        "IgnoreArgument",
        "eagle3_patches/settings.py",
        "env = os.environ if environ is None else environ",
        "env = os.environ if environ is None else None",
    ),
    (
        "ShiftEmptinessBoundary",
        "eagle3_patches/patches/eagle3_fc_guard.py",
        "if expected is not None and width != expected and hidden_states.shape[0] > 0:",
        "if expected is not None and width != expected and hidden_states.shape[0] > 1:",
    ),
    # the held-out mistakes of issue 62, each on a line it was made on
    (
        "ShiftReleaseBound",
        "eagle3_patches/patches/mla_draft_fc_guard.py",
        'applies_to = SpecifierSet(">=0.5.12")',
        'applies_to = SpecifierSet(">=0.5.13")',
    ),
    (
        "CloseReleaseBound",
        "eagle3_patches/patches/aux_capture_validation.py",
        'applies_to = SpecifierSet(">=0.5.8,<0.5.13")',
        'applies_to = SpecifierSet(">=0.5.8,<=0.5.13")',
    ),
    (
        "RespellName",
        "eagle3_patches/patches/draft_chunked_prefix_cache.py",
        '"cutlass_mla",',
        '"cutlass-mla",',
    ),
    (
        "DropLiteralElement",
        "eagle3_patches/checkpoint/layer_ids.py",
        "CONVENTIONS = (OUTPUT_OF_LAYER, INPUT_OF_LAYER)",
        "CONVENTIONS = (INPUT_OF_LAYER,)",
    ),
]


@pytest.mark.parametrize("kind", SURVIVOR_KINDS, ids=[k[0] for k in SURVIVOR_KINDS])
def test_each_kind_of_fault_found_by_hand_is_made_by_an_operator(operators, kind):
    """The survivors of the hand-written mutations (a setting compared raw, containment without its separator, any
    made all, an argument ignored for its default, an emptiness check's boundary moved) are among the mutants the
    tool makes of the lines they were found on."""
    import difflib

    name, module, before, after = kind
    source = (ROOT / module).read_text()
    assert before in source, f"{module} no longer holds {before!r}: update SURVIVOR_KINDS"
    made = []
    for mutant in operators.mutants(source, operators.OPERATORS[name]()):
        diff = [line for line in difflib.ndiff(source.splitlines(), mutant.splitlines()) if line[:2] in ("- ", "+ ")]
        made.append((diff[0][2:].strip(), diff[1][2:].strip()) if len(diff) == 2 else tuple(diff))
    assert (before, after) in made


def _changed(source: str, mutant: str) -> tuple[list[str], list[str]]:
    import difflib

    diff = [line for line in difflib.ndiff(source.splitlines(), mutant.splitlines()) if line[:2] in ("- ", "+ ")]
    return [d[2:].strip() for d in diff if d[0] == "-"], [d[2:].strip() for d in diff if d[0] == "+"]


def test_widen_group_renames_the_getter_in_its_import_and_its_calls_alike(operators):
    """dp_attention_aux_gather's held-out mistake: the whole TP group's getter where the attention-TP group's was, as
    a rename makes it (the import and the call together, so the module still imports)."""
    source = (ROOT / "eagle3_patches/patches/dp_attention_aux_gather.py").read_text()
    made = [_changed(source, m) for m in operators.mutants(source, operators.WidenGroup())]
    assert (
        [
            "from sglang.srt.layers.dp_attention import get_attention_tp_group",
            "return get_attention_tp_group().all_gather(input_, dim)",
        ],
        ["from sglang.srt.layers.dp_attention import get_tp_group", "return get_tp_group().all_gather(input_, dim)"],
    ) in made
    assert operators.mutants("get_tp_group()\nget_group()\n", operators.WidenGroup()) == []  # already the widest


def test_drop_guard_removes_an_early_exit_and_leaves_other_ifs(operators):
    """draft_chunked_prefix_cache's guard on a backend that never reads the cache, removed whole."""
    source = (ROOT / "eagle3_patches/patches/draft_chunked_prefix_cache.py").read_text()
    made = [_changed(source, m) for m in operators.mutants(source, operators.DropGuard())]
    assert (
        ["if backend is not None and backend not in CHUNKED_PREFIX_BACKENDS:", "return out"],
        ["pass"],
    ) in made
    kept = "if a:\n    return 1\nelse:\n    x = 2\nif b:\n    x = 3\n    return x\nif c:\n    f(x)\n"
    assert operators.mutants(kept, operators.DropGuard()) == []  # an else, two statements, no exit


def test_release_operators_leave_messages_and_fstrings(operators):
    source = 'a = f">=0.5.8,<{FIXED}"\nb = "upgrade to sglang >= 0.5.10"\nc = "0.5"\n'
    for name in ("ShiftReleaseBound", "CloseReleaseBound"):
        assert operators.mutants(source, operators.OPERATORS[name]()) == [], name
    assert operators.mutants('V = "0.5.0"\n', operators.ShiftReleaseBound()) == ['V = "0.5.1"\n']


def test_respell_name_touches_module_tables_only(operators):
    source = 'def f(x):\n    return x in ("cutlass_mla", "fa3")\nmessage = "not_a_table"\n'
    assert operators.mutants(source, operators.RespellName()) == []
    assert operators.mutants('NAMES = {"two-batch"}\n', operators.RespellName()) == ['NAMES = {"two_batch"}\n']


def test_return_the_other_swaps_between_similar_names_only(operators):
    op = operators.ReturnTheOther()
    source = (
        "def f(path, n):\n    resolved_path = path.resolve()\n    if n:\n        return path\n"
        "    return resolved_path\n"
    )
    made = operators.mutants(source, op)
    assert "        return resolved_path\n    return resolved_path\n" in made[0]
    assert made[1].endswith("    return path\n")
    assert all("return n" not in m for m in made)  # `n` shares no word with either


def test_ignore_argument_leaves_attributes_keywords_and_parameters_without_a_default(operators):
    source = "def f(a, env=None):\n    x.env = g(env=a)\n    return a\n"
    assert operators.mutants(source, operators.IgnoreArgument()) == []


def test_the_emptiness_shift_leaves_flags_and_calls(operators):
    source = "if not self.is_eagle3 or not f(x) or not ready_enabled:\n    pass\n"
    assert operators.mutants(source, operators.ShiftEmptinessBoundary()) == []
    assert operators.mutants("while queue:\n    pass\n", operators.ShiftEmptinessBoundary()) == [
        "while len(queue) > 1:\n    pass\n"
    ]


def test_the_operators_table_in_docs_testing_md_is_the_tools(mutation):
    """docs/testing.md's table of operators is generated (`python tools/mutation.py --operators-table`)."""
    import re

    text = mutation.DOC.read_text()
    table = re.search(r"<!-- BEGIN operators -->\n(.*?)<!-- END operators -->", text, re.S)
    assert table, "docs/testing.md has no operators table"
    assert table.group(1) == mutation.operators_table(), "run python tools/mutation.py --operators-table"
    names = {row[0] for row in mutation.operator_rows()}
    assert {f"eagle3/{n}" for n in mutation.mutation_operators.OPERATORS} <= names


def test_a_line_limited_session_names_its_lines_as_ranges(mutation):
    assert mutation._ranges([418, 419, 420, 430, 7]) == "7, 418-420, 430"
    assert mutation._ranges([5]) == "5"


def test_the_lines_changed_since_a_commit_are_those_a_diff_adds_or_closes_over(mutation):
    diff = (
        "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n"
        "@@ -3 +3 @@ def f():\n-    return 1\n+    return 2\n"  # one line rewritten
        "@@ -10,0 +11,2 @@ def g():\n+    a = 1\n+    b = 2\n"  # two added
        "@@ -20,3 +22,0 @@ def h():\n-    x\n-    y\n-    z\n"  # deleted only: the lines around the gap
    )
    assert mutation.hunk_lines(diff) == [3, 11, 12, 22, 23]
    assert mutation.hunk_lines("@@ -1,2 +0,0 @@\n-a\n-b\n") == [1]  # a deletion at the top: no line 0


def test_changed_since_reads_the_checkouts_history(mutation, tmp_path):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.invalid")
    git("config", "user.name", "t")
    old, new = tmp_path / "old.py", tmp_path / "new.py"
    old.write_text("a = 1\nb = 2\nc = 3\n")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    old.write_text("a = 1\nb = 20\nc = 3\n")
    new.write_text("x = 1\ny = 2\n")
    assert mutation.changed_lines(old, "HEAD", tmp_path) == [2]
    assert mutation.changed_lines(new, "HEAD", tmp_path) == [1, 2]  # not in that commit: every line
    with pytest.raises(SystemExit, match="--changed-since nope: not a commit"):
        mutation.changed_lines(old, "nope", tmp_path)


def test_a_session_survives_a_mark_added_and_nothing_else(mutation):
    """Only comments changed (a mark added, moved or reworded): the mutants are the same and their results are kept;
    a change to the code, however small, starts the session over."""
    code = "def f(x):\n    return x[0]\n"
    marked = "def f(x):\n    # pragma: no mutate core/NumberReplacer: one element\n    return x[0]  # the first\n\n"
    assert mutation.code_tokens(marked) == mutation.code_tokens(code)
    assert mutation.code_tokens("def f(x):\n    return x[1]\n") != mutation.code_tokens(code)
    assert mutation.code_tokens("def f(x):\n    return  x[0]\n") == mutation.code_tokens(code)  # spacing in a line
    assert mutation.code_tokens("def f(x):\n  return x[0]\n") != mutation.code_tokens(code)  # the indentation
    assert mutation.code_tokens("def f(:\n") != mutation.code_tokens(code)  # unreadable: never the same


def test_a_mutant_of_a_statement_over_several_lines_touches_each_of_them(mutation):
    assert mutation.touches(10, 12, [12]) and mutation.touches(10, 12, [10]) and mutation.touches(5, 5, [5])
    assert not mutation.touches(10, 12, [9, 13])


def test_a_retry_reruns_the_part_of_the_module_its_session_ran(mutation, tmp_path):
    """--retry-survivors alone keeps a session of changed lines or of one operator (rather than starting a
    whole-module one over it); a part named on the command line wins; with no session there is nothing to keep."""
    meta = tmp_path / "m.json"
    assert mutation.session_part(meta, [], [], None) == ([], [], None)
    meta.write_text('{"lines": [3, 4], "operators": ["core/AddNot"], "changed_since": "abc"}')
    assert mutation.session_part(meta, [], [], None) == ([3, 4], ["core/AddNot"], "abc")
    assert mutation.session_part(meta, [7], [], None) == ([7], [], None)
    assert mutation.session_part(meta, [], ["eagle3/DropGuard"], None) == ([], ["eagle3/DropGuard"], None)
    assert mutation.session_part(meta, [], [], "def") == ([], [], "def")


def test_a_serving_module_with_an_import_kept_to_type_checking_runs_the_serving_import_test(mutation):
    """`if TYPE_CHECKING:` turned around loads the offline layer into every serving process: only the test of what a
    serving process loads sees that, so such a patch module's mutants run it; an offline module's do not."""
    serving = "test_architecture.py::test_a_serving_process_loads_none_of_the_offline_tools"
    patch = mutation.tests_for(ROOT / "eagle3_patches" / "patches" / "cuda_graph_capture_order.py")
    assert serving in [p.name for p in patch]
    # an offline module, and a patch module without such an import (its mutants cannot reach the offline layer so)
    for other in ("checkpoint/formats.py", "patches/rank_consistency.py"):
        assert serving not in [p.name for p in mutation.tests_for(ROOT / "eagle3_patches" / other)], other
