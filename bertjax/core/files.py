"""Reading users' text and writing files whole: the habits every reader and writer of bertjax shares."""
from __future__ import annotations

import json
import os


def utf8_text(path: str, error: type[Exception]) -> str:
  """A text file's contents (a leading byte-order mark dropped, as spreadsheet programs write one); bytes that
  are not UTF-8 are `error` naming the line, not characters silently replaced."""
  with open(path, "rb") as f:
    raw = f.read()
  try:
    return raw.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    line = raw[:e.start].count(b"\n") + 1
    raise error(f"{path}:{line}: not UTF-8 ({e.reason} at byte {e.start}); save the file as UTF-8") from None


def json_object(text: str, where: str, error: type[Exception]) -> dict:
  """One JSONL record as a dict; anything else is `error` naming `where` (path:line)."""
  try:
    row = json.loads(text)
  except json.JSONDecodeError as e:
    raise error(f"{where}: not a JSON object ({e.msg} at column {e.colno})") from None
  if not isinstance(row, dict):
    raise error(f"{where}: not a JSON object (a {type(row).__name__})")
  return row


def write_whole(path: str, text: str) -> None:
  """`text` into `path`, written whole, then renamed: a killed run leaves the previous file, not half of one."""
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)
