"""python -m bertjax COMMAND [ARGS]: the command-line tools (`bertjax.cli`); `python -m bertjax` lists them."""
import importlib
import os
import sys

import bertjax
from bertjax.cli import COMMANDS
from bertjax.core import hostmem


def usage() -> str:
  width = max(len(c) for c in COMMANDS)
  return "usage: python -m bertjax COMMAND [ARGS]   (COMMAND --help for its arguments)\n\n" + "\n".join(
      f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items())


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(usage())
    return 0 if argv else 2
  name, rest = argv[0], argv[1:]
  if name not in COMMANDS:
    print(f"error: unknown command {name!r}; one of {', '.join(COMMANDS)} (python -m bertjax lists them)",
          file=sys.stderr, flush=True)
    return 2
  # Compiled programs persist across runs (read when jax is first imported): ~/.cache/bertjax-xla unless
  # JAX_COMPILATION_CACHE_DIR names another folder (an empty value turns it off). Every program is kept, not only
  # those that took jax's default 1 s to compile: an inference command's programs (a small encoder at a few padded
  # lengths) compile in about that time each on a 2-core CPU (less on a faster one), and those under it would be
  # compiled again by every command.
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", bertjax.COMPILE_CACHE)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  if hostmem.cpu_only_with_libtpu():  # no TPU here: libtpu's start-up errors would precede every command's output
    os.environ["JAX_PLATFORMS"] = "cpu"
  sys.argv = [f"{os.path.basename(sys.executable)} -m bertjax {name}", *rest]
  return importlib.import_module(COMMANDS[name][0]).main(rest) or 0


if __name__ == "__main__":
  sys.exit(main())
