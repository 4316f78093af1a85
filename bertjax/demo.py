"""`python -m bertjax.demo` is now `python launch/demo.py` (or `bash launch/demo.sh`, which sets up first); this
module only says so."""
import shlex
import sys

from bertjax import errors

if __name__ == "__main__":
  errors.fail("the demo is launched from launch/ now: bash launch/demo.sh "
              + " ".join(shlex.quote(a) for a in sys.argv[1:]))
