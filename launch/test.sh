#!/usr/bin/env bash
# Sets up .venv with the test extra and runs the test suite on 8 fake CPU devices.
# Default selection: fast tests plus the end-to-end checks marked `ci`. Extra pytest args pass through,
# e.g. `bash launch/test.sh -m slow` for every heavier check.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh test,tpu
export JAX_PLATFORMS=cpu
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(-m "not slow or ci")
exec .venv/bin/python -m pytest "${args[@]}"
