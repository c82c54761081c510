"""Where the suite's time goes: the recorder (eagle3_patches/testing/costs.py) and its tables (tools/test_costs.py)."""

from __future__ import annotations

import json

import pytest

from eagle3_patches.testing import costs


def _events(directory) -> list[dict]:
    return [json.loads(line) for f in sorted(directory.glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_nothing_is_recorded_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(costs.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    costs.record("server", model="m")
    with costs.timed("process", fn="f"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_each_event_names_the_test_it_ran_in_and_its_seconds(tmp_path, monkeypatch):
    monkeypatch.setenv(costs.ENV, str(tmp_path / "a"))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/e2e/test_server.py::test_x (setup)")
    costs.record("tiny_model", model="tiny-kimi-k25")
    with pytest.raises(RuntimeError), costs.timed("server", model="m"):
        raise RuntimeError("did not start")
    tiny, server = _events(tmp_path / "a")
    assert tiny == {"kind": "tiny_model", "test": "tests/e2e/test_server.py::test_x", "model": "tiny-kimi-k25"}
    assert server["kind"] == "server" and server["ok"] is False and server["seconds"] >= 0


def test_the_tables_sum_each_directory_and_rank_tests_and_fixtures(tool, tmp_path):
    test_costs = tool("test_costs")
    a = tmp_path / "a"
    a.mkdir()
    rows = [
        {"kind": "test", "test": "tests/e2e/test_server.py::t1", "phase": "setup", "seconds": 50.0},
        {"kind": "test", "test": "tests/e2e/test_server.py::t1", "phase": "call", "seconds": 10.0},
        {"kind": "test", "test": "tests/e2e/test_watchdog.py::t2", "phase": "call", "seconds": 30.0},
        {"kind": "test", "test": "tests/unit/test_x.py::t3", "phase": "call", "seconds": 1.0},
        {"kind": "server", "test": "tests/e2e/test_server.py::t1", "seconds": 45.0},
        {"kind": "process", "test": "tests/unit/test_x.py::t3", "seconds": 0.5, "ranks": 2},
        {"kind": "tiny_model", "test": "", "model": "m"},
        {
            "kind": "fixture",
            "test": "tests/e2e/test_server.py::t1",
            "fixture": "eagle3",
            "scope": "session",
            "seconds": 48.0,
        },
    ]
    (a / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "test", "te')  # cut short
    (tmp_path / "modes.jsonl").write_text('{"part": "stream 1: the linters", "seconds": 24}\n')
    text = test_costs.tables(test_costs.read_events(tmp_path), test_costs.read_walls(tmp_path))
    assert "| stream 1: the linters | 0.4 |" in text
    assert "| a | `tests/e2e` | 2 | 1.5 | 0 (0.0) | 1 (0.8) | 0 |" in text
    assert "| a | `tests/unit` | 1 | 0.0 | 2 (0.0) | 0 (0.0) | 0 |" in text
    assert "| a | `(outside a test)` | 0 | 0.0 | 0 (0.0) | 0 (0.0) | 1 |" in text
    assert text.index("`tests/e2e`") < text.index("`tests/unit`")  # the costliest first
    assert "| `eagle3` | session | 1 | 0.8 |" in text
    slowest = text[text.index("slowest") :]
    assert slowest.index("t1") < slowest.index("t2") < slowest.index("t3")


def test_the_docs_take_the_tables_between_their_markers(tool, tmp_path):
    test_costs = tool("test_costs")
    doc = tmp_path / "development.md"
    doc.write_text(f"intro\n{test_costs.BEGIN}\nold table\n{test_costs.END}\nafter\n")
    test_costs.write_docs("| new |\n", doc)
    assert doc.read_text() == f"intro\n{test_costs.BEGIN}\n| new |\n{test_costs.END}\nafter\n"
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        test_costs.write_docs("| new |\n", doc)
    assert test_costs.BEGIN in test_costs.DOCS.read_text() and test_costs.END in test_costs.DOCS.read_text()
