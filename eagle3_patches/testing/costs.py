"""Where the test suite's time goes: a record of what each test cost, read by ``tools/test_costs.py``.

Off unless ``EAGLE3_TEST_COSTS`` names a directory (``tools/run_tests.sh`` sets it for each mode).  Each process
appends JSON lines to ``<dir>/<pid>.jsonl``, one per event:

- ``test``: a test's setup, call and teardown seconds (``pytest_runtest_logreport``);
- ``fixture``: a fixture set up, its scope and seconds (``pytest_fixture_setup``);
- ``process``: an sglang child process run to its end (:func:`~.isolation.run_isolated`, a TP rank of
  :func:`~.isolation.run_ranks`), its seconds;
- ``server``: a real server started (:class:`~.server.Server`): seconds to ready, or to its refusal;
- ``tiny_model``: a tiny checkpoint written (:mod:`.tiny_models`; one found already built is not an event).

Every event carries the test it ran in: pytest's ``PYTEST_CURRENT_TEST``, which child processes inherit.
The ``test`` and ``fixture`` events come from the hooks in ``tests/conftest.py``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ENV = "EAGLE3_TEST_COSTS"


def _directory() -> Path | None:
    value = os.environ.get(ENV)
    return Path(value) if value else None


def current_test() -> str:
    """The node id of the running test (``PYTEST_CURRENT_TEST`` less its phase), or ``""`` outside pytest."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]


def record(kind: str, **fields: Any) -> None:
    """Append one event; nothing when recording is off.  A failure to write never fails a test."""
    directory = _directory()
    if directory is None:
        return
    event = {"kind": kind, "test": current_test(), **fields}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(event, sort_keys=True) + "\n")
    except OSError:
        pass


@contextmanager
def timed(kind: str, **fields: Any) -> Iterator[None]:
    """Record ``kind`` with the seconds the block took (also when it raised: ``ok`` false)."""
    if _directory() is None:
        yield
        return
    start = time.monotonic()
    ok = False
    try:
        yield
        ok = True
    finally:
        record(kind, seconds=round(time.monotonic() - start, 3), ok=ok, **fields)
