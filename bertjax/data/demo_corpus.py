"""The offline demo corpus: English prose from the documentation that ships with Python itself (standard-library
docstrings, parsed and never imported, and `pydoc_data` topics), written in the original BERT format.
Deterministic and without network."""
from __future__ import annotations

import ast
import logging
import os
import re
import sysconfig
from typing import Iterator

from bertjax.data.corpus import CorpusError, CorpusStats, split_sentences


def _stdlib_docstrings() -> Iterator[tuple[str, list[str]]]:
  """(module name, paragraphs) from the standard library's source, parsed (never imported)."""
  root = sysconfig.get_paths()["stdlib"]
  skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "ensurepip",
          "__pycache__", "tkinter"}
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith(("test", "config-")))
    files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
  for path in sorted(files):
    try:
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError):
      continue
    paragraphs = []
    for node in ast.walk(tree):
      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        doc = ast.get_docstring(node)
        if doc:
          paragraphs += _prose_paragraphs(doc)
    if paragraphs:
      yield os.path.relpath(path, root), paragraphs


def _prose_paragraphs(text: str) -> list[str]:
  out = []
  for para in re.split(r"\n\s*\n", text):
    lines = [ln.strip() for ln in para.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith((">>>", "...", "$", "#", "|", "+-", "=="))]
    para = " ".join(lines)
    letters = sum(c.isalpha() for c in para)
    if len(para) > 40 and letters > 0.6 * len(para) and " " in para:
      out.append(para)
  return out


def _pydoc_topics() -> Iterator[tuple[str, list[str]]]:
  try:
    from pydoc_data import topics
  except ImportError:
    return
  for name in sorted(topics.topics):
    paragraphs = _prose_paragraphs(topics.topics[name])
    if paragraphs:
      yield f"pydoc:{name}", paragraphs


def build_demo_corpus(out_path: str, min_sentences: int = 2) -> CorpusStats:
  """Write the offline demo corpus (Python's own docs) in the original format; deterministic, no network.

  One document per module docstring set / pydoc topic; one sentence per line; blank lines between documents.
  """
  stats = CorpusStats()
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  tmp = out_path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for source in (_stdlib_docstrings(), _pydoc_topics()):
      for _, paragraphs in source:
        sentences = [s for p in paragraphs for s in split_sentences(p)]
        if len(sentences) < min_sentences:
          stats.empty_documents += 1
          continue
        stats.documents += 1
        stats.sentences += len(sentences)
        f.write("\n".join(sentences) + "\n\n")
  os.replace(tmp, out_path)
  if stats.documents == 0:
    raise CorpusError("the demo corpus came out empty: this Python ships no docstrings or pydoc topics")
  logging.info("demo corpus: %d documents, %d sentences -> %s", stats.documents, stats.sentences, out_path)
  return stats
