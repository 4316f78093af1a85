#!/usr/bin/env bash
# The main job on a fresh machine: set up .venv, then run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
exec .venv/bin/python -m bertjax.demo "$@"
