"""`python -m bertjax.bench` is now `python benchmarks/bench.py` (benchmarks live beside the library, with their
results in benchmarks/results); this module only says so."""
import shlex
import sys

from bertjax import errors

if __name__ == "__main__":
  errors.fail("the benchmark is a script beside the library now: python benchmarks/bench.py "
              + " ".join(shlex.quote(a) for a in sys.argv[1:]))
