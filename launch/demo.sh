#!/usr/bin/env bash
# The main job on a fresh machine: set up .venv, build the offline corpus, train a tokenizer, make the
# pre-training data, pre-train a tiny BERT with visible progress, evaluate and fill in some blanks (~5 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
exec .venv/bin/python launch/demo.py "$@"
