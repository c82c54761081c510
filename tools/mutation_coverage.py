"""A pytest plugin for tools/mutation.py: which tests execute which lines of one module, in every process.

    EAGLE3_MUTATION_COVERAGE=DATAFILE EAGLE3_MUTATION_INCLUDE=MODULE.py \
        python -m pytest -p mutation_coverage ...        # tools/ on PYTHONPATH

coverage.py (pinned in tools/requirements-mutation.txt) measures MODULE.py in the pytest process, labelling each
line with the test running it (a dynamic context: the test's node id, "" while collecting), and in every Python
process a test starts: coverage's ``a1_coverage.pth`` starts measurement in any interpreter that finds
``COVERAGE_PROCESS_CONFIG`` in its environment, and this plugin rewrites that variable before each test with the
test's node id as the static context, so the ``spawn``-ed sglang children of ``run_isolated`` / ``run_ranks``
label their lines with the test that started them (``patch = _exit`` saves the data of a child that multiprocessing
ends with ``os._exit``).  The collected node ids, in order, go to ``tests.json`` beside DATAFILE, each test's
seconds (setup, call and teardown) to ``durations.json``.

Only tools/mutation.py uses it, to run each mutant's tests in a better order (never fewer tests).
"""

from __future__ import annotations

import json
import os

import coverage
from coverage.config import CoverageConfig

_DATA = os.environ["EAGLE3_MUTATION_COVERAGE"]
_INCLUDE = os.path.abspath(os.environ["EAGLE3_MUTATION_INCLUDE"])

# started when pytest imports the plugin (``-p``), before conftest.py imports the module under test
_cov = coverage.Coverage(data_file=_DATA, data_suffix=True, include=[_INCLUDE], config_file=False)
_cov.start()


def _child_config(context: str) -> str:
    config = CoverageConfig()
    config.data_file = _DATA
    config.parallel = True
    config.run_include = [_INCLUDE]
    config.context = context
    config.patch = ["_exit"]
    return config.serialize()


def pytest_collection_finish(session) -> None:
    with open(os.path.join(os.path.dirname(_DATA), "tests.json"), "w") as fh:
        json.dump([item.nodeid for item in session.items], fh)


def pytest_runtest_setup(item) -> None:
    _cov.switch_context(item.nodeid)
    os.environ["COVERAGE_PROCESS_CONFIG"] = _child_config(item.nodeid)


def pytest_runtest_logfinish(nodeid, location) -> None:
    _cov.switch_context("")
    os.environ.pop("COVERAGE_PROCESS_CONFIG", None)


_durations: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration  # setup + call + teardown


def pytest_sessionfinish(session) -> None:
    with open(os.path.join(os.path.dirname(_DATA), "durations.json"), "w") as fh:
        json.dump(_durations, fh)


def pytest_unconfigure(config) -> None:
    _cov.stop()
    _cov.save()
