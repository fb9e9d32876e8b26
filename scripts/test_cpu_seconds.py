"""A pytest plugin that scripts/benchmark_tests.py loads (``-p test_cpu_seconds``): each test's CPU seconds.

A test's reading is the user + system time its worker process and the children it waited for spent between the
test's start and end (setup, call and teardown). Processes nobody waits for in the test (a server that outlives it,
the jobs slurmd starts) are not in it. Each worker writes its readings, as JSON keyed by test id, into the folder
NOISYMLT_TEST_CPU_DIR names; without it the plugin records nothing.
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import pytest

_READINGS: dict[str, float] = {}


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = _cpu_s()
    yield
    _READINGS[item.nodeid] = round(_cpu_s() - start, 2)


def pytest_sessionfinish(session) -> None:
    folder = os.environ.get("NOISYMLT_TEST_CPU_DIR")
    if folder and _READINGS:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (Path(folder) / f"{worker}.json").write_text(json.dumps(_READINGS))
