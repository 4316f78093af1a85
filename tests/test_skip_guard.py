"""The skip guard (tests/skip_guard.py, the hooks conftest.py imports) on throwaway test modules in a pytest of
their own: under CI=true a skip for a missing package fails, whether the module skipped at import (collection) or a
test inside it, and so does a test that calls `skip_unless_ci`; a skip for any other reason stays a skip, and
without CI=true every one of them is a skip."""
import os
import subprocess
import sys
from xml.etree import ElementTree

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = {
  # the road the old guard missed: a module-level importorskip skips the module's collection
  "test_module_level.py": 'import pytest\npytest.importorskip("no_such_package_xyz")\n\n\n'
                          "def test_never_runs():\n  assert False\n",
  "test_inside.py": 'import pytest\n\n\ndef test_inside():\n  pytest.importorskip("no_such_package_xyz")\n',
  "test_history.py": 'import skip_guard\n\n\ndef test_history():\n  skip_guard.skip_unless_ci("commit x is not in '
                     "this clone's history\")\n",
  "test_platform.py": 'import pytest\npytest.skip("glibc only", allow_module_level=True)\n',
  "test_runs.py": "def test_runs():\n  pass\n",
  "conftest.py": "from skip_guard import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401\n",
  "pytest.ini": "[pytest]\n",
}


def _outcomes(folder, ci):
  """{module: "passed" | "skipped" | "failure" | "error"} of a pytest run over `folder` (its JUnit XML, which names
  a module's collection report too), with or without CI=true; and the run."""
  env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("PYTEST_")}
  env["PYTHONPATH"] = HERE  # the guard itself, not a copy
  if ci:
    env["CI"] = "true"
  xml = folder / f"ci-{ci}.xml"
  plugins = [a for p in ("cacheprovider", "hypothesispytest", "anyio", "xdist") for a in ("-p", f"no:{p}")]  # fast
  done = subprocess.run([sys.executable, "-m", "pytest", *plugins, "--rootdir", str(folder),
                         "--continue-on-collection-errors", f"--junitxml={xml}", str(folder)], capture_output=True,
                        text=True, env=env, cwd=folder, timeout=120)
  got = {}
  for case in ElementTree.parse(xml).iter("testcase"):
    got[case.get("classname") or case.get("name")] = case[0].tag if len(case) else "passed"
  return got, done


def test_a_skip_for_a_missing_package_fails_under_ci_even_at_collection(tmp_path):
  for name, text in MODULES.items():
    (tmp_path / name).write_text(text)
  got, done = _outcomes(tmp_path, ci=True)
  assert got == {"test_module_level": "error", "test_inside": "failure", "test_history": "failure",
                 "test_platform": "skipped", "test_runs": "passed"}, done.stdout[-3000:]
  assert done.returncode == 1 and "skipped for a missing package under CI=true" in done.stdout
  got, done = _outcomes(tmp_path, ci=False)
  assert got == {"test_module_level": "skipped", "test_inside": "skipped", "test_history": "skipped",
                 "test_platform": "skipped", "test_runs": "passed"}, done.stdout[-3000:]
  assert done.returncode == 0
