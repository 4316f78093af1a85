#!/usr/bin/env bash
# Creates ./.venv (when absent) and installs bertjax with the versions in requirements.lock.
#   bash launch/setup.sh          # the package (training)
#   bash launch/setup.sh demo     # plus the packages whose docstrings the demo's corpus reads
#   bash launch/setup.sh test     # plus the test extra (PyTorch CPU build, transformers, pytest)
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  for c in python3.11 python3.12 python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then py=$c; break; fi
  done
fi
[ -n "$py" ] || { echo "setup: Python 3.11 or newer is needed" >&2; exit 1; }
[ -x .venv/bin/python ] || "$py" -m venv .venv
spec="."
[ -n "$extra" ] && spec=".[$extra]"
stamp=".venv/.bertjax-installed-$extra"
if [ ! -f "$stamp" ] || [ requirements.lock -nt "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
  echo "setup: installing bertjax${extra:+[$extra]} into .venv (pinned by requirements.lock)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c requirements.lock -e "$spec"
  touch "$stamp"
fi
