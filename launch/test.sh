#!/usr/bin/env bash
# Sets up .venv with the test extra and runs the test suite on 8 fake CPU devices.
# Default selection: the linter (ruff), then fast tests plus the end-to-end checks marked `ci`, spread over the
# cores (pytest-xdist).
# Extra pytest args pass through instead, e.g. `bash launch/test.sh -m slow` for every heavier check.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh test,tpu
export JAX_PLATFORMS=cpu
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
  # One pytest worker per core, at most one per 8 GiB of memory (the heaviest checks start 8-device subprocesses);
  # most tests are compile-bound, and XLA compiles a program on one core.
  cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
  mem_gib=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo 2>/dev/null || echo 8)
  workers=${BERTJAX_TEST_WORKERS:-$(( cores < mem_gib / 8 ? cores : mem_gib / 8 ))}
  [ "$workers" -ge 1 ] || workers=1
  args=(-m "not slow or ci" -n "$workers" --dist worksteal)
  # The linter first (settings in pyproject.toml): a few seconds.
  .venv/bin/ruff check bertjax configs launch benchmarks tests
fi
exec .venv/bin/python -m pytest "${args[@]}"
