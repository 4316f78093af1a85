#!/usr/bin/env bash
# The main job on a fresh machine: set up .venv, build the offline corpus, train a tokenizer, make the
# pre-training data, pre-train a tiny BERT with visible progress, evaluate, fill in some blanks and fine-tune
# (about 7 minutes on 2 cores, installs included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh demo
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
exec .venv/bin/python launch/demo.py "$@"
