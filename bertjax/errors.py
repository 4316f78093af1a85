"""The errors a user's input can cause, in one table, and the one way every command-line tool reports them.

Each is a subclass of `Error` and of the built-in type callers already catch (a bad value is a ValueError, a
missing file an OSError). A tool's entry point goes through `guard` (argparse tools) or `run_absl` (absl tools):
any of them, any OSError, and a bad command-line flag print as one line, `error: ...`, with exit code EXIT_CODE,
in pre-training, fine-tuning and every other mode alike. Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import ast
import functools
import sys

EXIT_CODE = 2


class Error(Exception):
  """A problem with what the user gave (config, flags, data, files, workdir), reported in one line."""


class ConfigError(Error, ValueError):
  """Everything wrong with a config, found before compiling."""


class NonFiniteError(Error, FloatingPointError):
  """A non-finite loss or gradient: the run stops and writes no checkpoint from that state."""


class DataError(Error, ValueError):
  """Input data that cannot be used: an empty or binary corpus, a malformed task file, text without [MASK]."""


class DataPathError(Error, OSError):
  """A data location that cannot be reached (remote storage offline, no credentials, no filesystem driver)."""


class CheckpointError(Error, RuntimeError):
  """No usable checkpoint where one was expected, or one that does not fit the model."""


class WorkdirLockedError(Error, RuntimeError):
  """Another run holds this workdir."""


class ConversionError(Error, ValueError):
  """A checkpoint from elsewhere (HF, TF) that cannot be read or does not fit a bertjax model."""


class TokenizerError(Error, ValueError):
  """A vocabulary or sentencepiece model that cannot be loaded or does not fit the data or the model."""


USER_ERRORS = (Error, OSError)


def one_line(e: BaseException) -> str:
  """The message on one line (absl and ml_collections wrap theirs in quotes and newlines)."""
  msg = str(e.args[0]) if isinstance(e, (AttributeError, KeyError)) and e.args else str(e)
  if len(msg) > 1 and msg[0] == msg[-1] and msg[0] in "'\"":  # a repr of a KeyError's message
    try:
      msg = ast.literal_eval(msg)
    except (ValueError, SyntaxError):
      pass
  return "; ".join(" ".join(line.split()) for line in msg.splitlines() if line.strip()) or type(e).__name__


def fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(EXIT_CODE)


def guard(main):
  """Wraps a tool's main so that USER_ERRORS end it with one line and EXIT_CODE."""
  @functools.wraps(main)
  def wrapped(*args, **kwargs):
    try:
      return main(*args, **kwargs)
    except USER_ERRORS as e:
      fail(one_line(e))
  return wrapped


def parse_flags(argv):
  """absl flag parsing whose every failure (an unknown flag, a mistyped `--config.x` key, a config file that
  does not load) is one line: absl lets the config loader's own exceptions out as tracebacks."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    fail(f"bad command line: {one_line(e)}")


def run_absl(main, argv=None) -> None:
  from absl import app  # pylint: disable=import-outside-toplevel
  app.run(guard(main), argv=argv, flags_parser=parse_flags)
