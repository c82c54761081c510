"""tools/mutation.py's ordering of a mutant's tests: those that ran the mutated lines first, never fewer tests."""

from __future__ import annotations

import pytest

TESTS = ["t.py::a", "t.py::b", "u.py::c", "u.py::d"]


@pytest.fixture(scope="module")
def mutation(tool):
    return tool("mutation")


def test_the_tests_that_ran_the_lines_come_first_and_every_test_stays(mutation):
    lines = {10: {"u.py::d"}, 11: {"t.py::b"}, 12: {"u.py::c"}}
    assert mutation.test_order(TESTS, lines, 10, 11) == ["t.py::b", "u.py::d", "t.py::a", "u.py::c"]
    assert mutation.test_order(TESTS, lines, 12, 12) == ["u.py::c", "t.py::a", "t.py::b", "u.py::d"]


def test_a_line_run_outside_any_test_or_never_seen_keeps_the_usual_order(mutation):
    lines = {10: {"u.py::d", ""}, 11: {"t.py::b"}}
    assert mutation.test_order(TESTS, lines, 10, 11) == TESTS  # module level: imports run it for every test
    assert mutation.test_order(TESTS, lines, 20, 21) == TESTS
