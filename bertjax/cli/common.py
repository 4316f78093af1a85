"""How every command-line tool runs: a user's mistake (any `bertjax.errors.Error`, any OSError, a bad flag) ends
the command with one line, `error: ...`, and exit code EXIT_CODE; anything else is a bug and keeps its traceback."""
from __future__ import annotations

import argparse
import difflib
import functools
import importlib.util
import logging
import os
import sys
import threading

from bertjax.errors import EXIT_CODE, USER_ERRORS, one_line


def fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(EXIT_CODE)


def quiet_background_failures() -> None:
  """Keeps the reports of checkpoint I/O that failed in a background thread out of the terminal.

  When a checkpoint read or write fails (a damaged file, a full disk), orbax and tensorstore abandon the array
  reads and writes still pending; Python reports each abandoned coroutine, each unretrieved future and each
  callback posted to the closed event loop as a traceback, dozens of them, after the one error the tool already
  names in a line. Those reports go to the `bertjax.background` logger at DEBUG level instead (absl's log file,
  when one is set); any other unraisable exception is reported as usual.
  """
  if getattr(sys.unraisablehook, "bertjax", False):
    return  # installed already (a tool's main called again in one process)
  log = logging.getLogger("bertjax.background")
  for name in ("asyncio", "concurrent.futures"):
    noisy = logging.getLogger(name)
    noisy.propagate = False
    if not any(isinstance(h, _ToDebug) for h in noisy.handlers):
      noisy.addHandler(_ToDebug(log))
  default = sys.unraisablehook

  def hook(unraisable):
    obj, exc = repr(unraisable.object), unraisable.exc_value
    if "coroutine" in obj or isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc) or (
        unraisable.object is None):
      log.debug("background failure: %s: %r", obj, exc)
    else:
      default(unraisable)
  hook.bertjax = True
  sys.unraisablehook = hook
  default_thread = threading.excepthook

  def thread_hook(args):
    if isinstance(args.exc_value, RuntimeError) and "Event loop is closed" in str(args.exc_value):
      log.debug("background failure in thread %s: %r", getattr(args.thread, "name", "?"), args.exc_value)
    else:
      default_thread(args)
  threading.excepthook = thread_hook


class _ToDebug(logging.Handler):
  def __init__(self, target: logging.Logger):
    super().__init__()
    self.target = target

  def emit(self, record):
    self.target.debug("%s: %s", record.name, record.getMessage())


def guard(main):
  """Wraps a tool's main so that USER_ERRORS end it with one line and EXIT_CODE."""
  @functools.wraps(main)
  def wrapped(*args, **kwargs):
    quiet_background_failures()
    try:
      return main(*args, **kwargs)
    except USER_ERRORS as e:
      fail(one_line(e))
  return wrapped


class ArgumentParser(argparse.ArgumentParser):
  """argparse whose command-line mistakes read like every other error: one `error: ...` line, EXIT_CODE (argparse
  prints its whole usage first, and a line that starts with the program's name)."""

  def error(self, message):
    fail(f"bad command line: {message} (see {self.prog} --help)")


def parse_flags(argv):
  """absl flag parsing whose every failure (an unknown flag, a mistyped `--config.x` key, a config file that
  does not load) is one line: absl lets the config loader's own exceptions out as tracebacks."""
  from absl import flags
  argv = resolve_config_path(argv)
  try:
    return flags.FLAGS(argv)
  except Exception as e:
    fail(f"bad command line: {_unknown_config_field(argv) or _innermost(e)}")


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def resolve_config_path(argv):
  """`--config=configs/x.py[:ARGS]` as given, or, where no such file is here, the checkout's configs/x.py (the
  commands in the docs name configs/ from the checkout's root); a file found nowhere is one line."""
  argv = list(argv or ())
  for i, a in enumerate(argv):
    if not a.startswith("--config="):
      continue
    path, colon, arg = a[len("--config="):].partition(":")
    if not path or os.path.exists(path):
      return argv
    there = os.path.join(REPO, path)
    if not os.path.isabs(path) and os.path.isfile(there):
      argv[i] = f"--config={there}{colon}{arg}"
      return argv
    fail(f"--config {path}: no such config file (the recipes are in the bertjax checkout's configs/: run from "
         "its root or give the file's path)")
  return argv


def _innermost(e: BaseException) -> str:
  """The message of the exception at the bottom of a traceback that ml_collections folds into its own message
  (a config file's get_config raising), else the message itself."""
  text = str(e)
  if "Traceback (most recent call last)" in text:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    flag = lines[0].split(": Error")[0] if lines and lines[0].startswith("flag ") else ""
    last = lines[-1] if lines else text
    return f"{flag}: {last}" if flag else last
  return one_line(e)


def _unknown_config_field(argv) -> str | None:
  """'no such config field ...' with the nearest names, for the first `--config.a.b=v` that names no field of the
  config that `--config=FILE[:ARGS]` builds (None when all exist or the config itself does not build)."""
  argv = list(argv or ())
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if spec is None:
    return None
  path, _, arg = spec.partition(":")
  try:
    loader = importlib.util.spec_from_file_location("_bertjax_config_probe", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
  except Exception:
    return None
  for a in argv:
    if not a.startswith("--config.") or "=" not in a:
      continue
    key = a[len("--config."):].split("=", 1)[0]
    node, parts = config, key.split(".")
    for i, part in enumerate(parts):
      fields = list(node.keys()) if hasattr(node, "keys") else []
      if part not in fields:
        where = ".".join(parts[:i]) or "the config"
        near = difflib.get_close_matches(part, fields, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr('.'.join(parts[:i] + [n])) for n in near)}?" if near else (
            f"; {where} has {sorted(fields)}" if fields else "")
        return f"--config.{key}: no such config field {part!r} in {where}{hint}"
      node = node[part]
  return None


def run_absl(main, argv=None) -> None:
  from absl import app
  app.run(guard(main), argv=argv, flags_parser=parse_flags)
