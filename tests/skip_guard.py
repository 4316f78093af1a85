"""Under CI=true a check that did not run because something the test extra provides is missing fails instead of
skipping: a skip there means a check silently did not run. conftest.py imports the two hooks; tests/test_skip_guard.py
runs them on throwaway modules.

A skip reaches pytest by two roads, and each has its hook: a test's own skip (`pytest.importorskip` inside a test
or fixture) becomes a test report (`pytest_runtest_makereport`), and a module-level one, in the test module or in
a module it imports, becomes the module's collection report (`pytest_make_collect_report`), which the first hook
never sees."""
import os

import pytest

MISSING = ("could not import", "No module named")


def ci() -> bool:
  return os.environ.get("CI") == "true"


def _fail_if_missing(report) -> None:
  if ci() and report.skipped and isinstance(report.longrepr, tuple):
    reason = str(report.longrepr[2])
    if any(m in reason for m in MISSING):
      report.outcome = "failed"
      report.longrepr = f"skipped for a missing package under CI=true: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  _fail_if_missing(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
  outcome = yield
  _fail_if_missing(outcome.get_result())


def skip_unless_ci(reason: str) -> None:
  """Skips the calling test, or fails it under CI=true, where whatever it lacks (a package, a clone's history) is
  provided."""
  if ci():
    pytest.fail(f"{reason}; under CI=true it is provided, so this is a failure")
  pytest.skip(reason)
