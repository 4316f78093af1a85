"""The errors a user's input can cause, in one table.

Each is a subclass of `Error` and of the built-in type callers already catch (a bad value is a ValueError, a
missing file an OSError). Every command-line tool (`bertjax.cli`) reports any of them, any OSError and a bad
command-line flag as one line, `error: ...`, with exit code EXIT_CODE; anything else is a bug and keeps its
traceback.
"""
from __future__ import annotations

import ast

EXIT_CODE = 2


class Error(Exception):
  """A problem with what the user gave (config, flags, data, files, workdir), reported in one line."""


class ConfigError(Error, ValueError):
  """Everything wrong with a config, found before compiling."""


class NonFiniteError(Error, FloatingPointError):
  """A non-finite loss or gradient: the run stops and writes no checkpoint from that state."""


class DataError(Error, ValueError):
  """Input data that cannot be used: an empty or binary corpus, a malformed task file, text without [MASK]."""


class TaskDataError(DataError):
  """Fine-tuning data that cannot be used as given: names the file, line and what is wrong."""


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
  """The message on one line (absl and ml_collections wrap theirs in quotes and newlines); an operating system's
  error as "PATH: what went wrong" rather than Python's "[Errno 13] Permission denied: 'PATH'"."""
  if isinstance(e, OSError) and e.strerror and e.filename is not None:
    target = f"{e.filename} -> {e.filename2}" if e.filename2 is not None else str(e.filename)
    return f"{target}: {e.strerror}"
  msg = str(e.args[0]) if isinstance(e, (AttributeError, KeyError)) and e.args else str(e)
  if len(msg) > 1 and msg[0] == msg[-1] and msg[0] in "'\"":  # a repr of a KeyError's message
    try:
      msg = ast.literal_eval(msg)
    except (ValueError, SyntaxError):
      pass
  return "; ".join(" ".join(line.split()) for line in msg.splitlines() if line.strip()) or type(e).__name__
