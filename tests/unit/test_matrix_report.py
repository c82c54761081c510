"""tools/matrix.py's report: the first release with each upstream fix comes from what the probe reported per
release (``status``), and a fix that goes away again is flagged."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def matrix(tool):
    return tool("matrix")


def _release(version: str, **states: str) -> dict:
    return {
        "release": version,
        "setup": {"ok": True},
        "status": {"patches": [{"name": n, "state": s, "reason": ""} for n, s in states.items()]},
    }


def _row(section: list[str], patch: str) -> list[str]:
    line = next(ln for ln in section if ln.startswith(f"| `{patch}` "))
    return [c.strip() for c in line.strip("|").split("|")]


def test_first_upstream_release_is_the_first_where_the_probe_saw_the_fix(matrix):
    results = [
        _release("0.5.9", a="applied", b="applied"),
        _release("0.5.10", a="upstream", b="applied"),
        _release("0.5.10.post1", a="upstream", b="applied"),
        _release("0.5.11", a="upstream", b="not-applicable"),
    ]
    section = matrix._upstream_section(results, ["a", "b"])
    assert _row(section, "a")[1:4] == ["0.5.10", "0.5.9", "-"]
    assert _row(section, "b")[1:4] == ["none in this run", "0.5.9-0.5.10.post1", "0.5.11"]


def test_a_fix_that_goes_away_again_is_flagged(matrix):
    results = [_release("0.5.9", a="applied"), _release("0.5.10", a="upstream"), _release("0.5.11", a="applied")]
    row = _row(matrix._upstream_section(results, ["a"]), "a")
    assert row[1].startswith("0.5.10") and "applied again in 0.5.11" in row[1]
    assert row[2] == "0.5.9, 0.5.11"


def test_releases_that_did_not_report_are_left_out(matrix):
    results = [_release("0.5.9", a="applied"), {"release": "0.5.10", "setup": {"ok": False, "error": "x"}}]
    assert _row(matrix._upstream_section(results, ["a"]), "a")[2] == "0.5.9"
    assert matrix._upstream_section([results[1]], ["a"]) == []


def test_the_fc_and_layer_columns_come_from_selftest_where_it_ran(matrix):
    passed = {"name": matrix.FC_CHECK, "status": "passed", "reason": "needed: it fixes it"}
    failed = {"name": matrix.LAYER_CHECK, "status": "failed", "reason": "with the patch set on: layers [1, 2, 3]"}
    res = {
        "release": "0.5.13",
        "selftest": {"checks": [passed, failed]},
        "suite": {"tests": {matrix.FC_TEST: "failed", f"{matrix.LAYER_TEST_FILE}::test_x": "passed"}},
    }
    assert matrix._check_verdict(res, matrix.FC_CHECK) == "yes"  # the check, not the suite's stale result
    assert matrix._check_verdict(res, matrix.LAYER_CHECK).startswith("no (selftest: with the patch set on: layers")


def test_without_selftest_the_twin_tests_give_the_columns_and_run(matrix):
    res = {
        "release": "0.5.9",
        "suite": {"tests": {matrix.FC_TEST: "passed", f"{matrix.LAYER_TEST_FILE}::t": "passed"}, "failures": []},
    }
    assert matrix._check_verdict(res, matrix.FC_CHECK) == matrix._check_verdict(res, matrix.LAYER_CHECK) == "yes"
    assert matrix._check_verdict({"release": "0.5.9", "suite": {"tests": {}}}, matrix.FC_CHECK) == "not run"
    assert set(matrix.SELFTEST_TWINS.values()).isdisjoint(matrix.FULL_SELECTION)  # selftest runs the same checks


def test_the_release_processes_get_their_share_of_the_cores(matrix, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(matrix, "RELEASE_THREADS", 1)
    env = matrix._env("0.5.9")
    assert env["OMP_NUM_THREADS"] == "1"
    # bytecode goes to the release's own tree, never into the checkout or the venv, and is written
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPYCACHEPREFIX"].endswith("pycache/0.5.9")


def _page(matrix, results) -> str:
    for r in results:
        r["suite"] = {"passed": 7, "failed": 1, "errors": 0, "skipped": 2, "tests": {}}
    return matrix.render(results, "python tools/matrix.py", ["tests/x.py"], 60.0)


def test_refreshed_states_keep_what_the_run_measured(matrix):
    """--states-only: the state columns, the upstream table and the appendix's state tables are the new status; the
    suite's figures stay the run's, a patch added since gets its column, and the page says which is which."""
    page = _page(matrix, [_release("0.5.9", a="applied"), _release("0.5.10", a="applied")])
    fresh = [_release("0.5.9", a="applied", c="applied"), _release("0.5.10", a="upstream", c="not-applicable")]
    out = matrix.refresh_states(page, fresh, "python tools/matrix.py --states-only", "abc1234")
    rows = [matrix._cells(ln) for ln in out.splitlines() if ln.startswith("| 0.5.")]
    header = next(matrix._cells(ln) for ln in out.splitlines() if ln.startswith("| sglang | transformers |"))
    assert header[2:4] == ["`a`", "`c`"] and header[4] == "suite (pass/fail/skip)"
    assert [r[:4] for r in rows] == [
        ["0.5.9", "?", "applied", "applied"],
        ["0.5.10", "?", "upstream", "not-applicable"],
    ]
    assert all(r[4] == "7/1/2" for r in rows)
    assert _row(out.splitlines(), "c")[1:4] == ["none in this run", "0.5.9", "0.5.10"]
    assert "| `c` | not-applicable |  |" in out
    assert out.count(matrix.STATES_NOTE) == 1 and "abc1234" in out
    again = matrix.refresh_states(out, fresh, "python tools/matrix.py --states-only", "abc1234")
    assert again.count(matrix.STATES_NOTE) == 1 and again.count("| `c` | not-applicable |  |") == 1


def test_a_release_left_out_of_the_refresh_is_refused(matrix):
    page = _page(matrix, [_release("0.5.9", a="applied"), _release("0.5.10", a="applied")])
    with pytest.raises(SystemExit, match="0.5.10"):
        matrix.refresh_states(page, [_release("0.5.9", a="applied")], "cmd", "abc")
