"""Offline English corpora in the original BERT format, deterministic and without network.

The demo corpus is the documentation that ships with Python itself (standard-library docstrings, parsed and never
imported, and `pydoc_data` topics), about 2 MB. `build_offline_corpus(..., sources=("python", "man"))` adds the
machine's English manual pages rendered through man(1) (about 20-30 MB of prose on a Debian machine with the usual
packages), with every paragraph kept once: manual pages repeat boilerplate (common flags, licence text) thousands
of times, and repeats would leak into a held-out split."""
from __future__ import annotations

import ast
import concurrent.futures
import glob
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sysconfig
from typing import Iterator

from bertjax.core import files
from bertjax.data.pretraining.corpus import CorpusError, CorpusStats, split_sentences


def _stdlib_docstrings() -> Iterator[tuple[str, list[str]]]:
  """(module name, paragraphs) from the standard library's source, parsed (never imported)."""
  root = sysconfig.get_paths()["stdlib"]
  yield from _docstrings(root, {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages",
                                "turtledemo", "ensurepip", "__pycache__", "tkinter"})


# Packages of requirements.lock with the most prose in their docstrings (about 10 MB together), in this order.
PACKAGES = ("numpy", "scipy", "sklearn", "pandas", "matplotlib")


def _package_docstrings(packages=PACKAGES) -> Iterator[tuple[str, list[str]]]:
  """(module path, paragraphs) from the installed `packages`' source, parsed (never imported), tests and vendored
  code left out; a package that is not installed gives nothing."""
  for name in packages:
    spec = importlib.util.find_spec(name)
    for root in (spec.submodule_search_locations or []) if spec else []:
      for path, paragraphs in _docstrings(root, {"tests", "testing", "__pycache__", "_vendor", "externals"}):
        yield os.path.join(name, path), paragraphs


def _docstrings(root: str, skip: set[str]) -> Iterator[tuple[str, list[str]]]:
  """(path under `root`, paragraphs) of every .py file under `root` with prose in its docstrings, in sorted order;
  folders named in `skip`, or starting with test or config-, are left out."""
  paths = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith(("test", "config-")))
    paths += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
  for path in sorted(paths):
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


MAN_SECTIONS = ("1", "5", "7", "8", "3")


def _render_man(path: str) -> str:
  """One manual page as plain text: no hyphenation or justification, one line per paragraph, overstrikes removed."""
  env = {**os.environ, "MANWIDTH": "4000", "MAN_KEEP_FORMATTING": "", "LC_ALL": "C.UTF-8"}
  try:
    out = subprocess.run(["man", "--nh", "--nj", "-l", path], capture_output=True, env=env, timeout=60).stdout
  except (OSError, subprocess.TimeoutExpired):
    return ""
  text = out.decode("utf-8", "replace")
  return re.sub(r".\x08", "", text)  # bold and underline overstrikes (what col -b removes)


def _man_pages(sections=MAN_SECTIONS, workers: int = 0) -> Iterator[tuple[str, list[str]]]:
  """(page path, prose paragraphs) of the English manual pages under /usr/share/man, rendered in `workers`
  parallel man(1) processes (0 = one per core), in sorted path order."""
  if shutil.which("man") is None:
    raise CorpusError("the man source needs man(1) (Debian: apt-get install man-db)")
  paths = sorted(p for s in sections for p in glob.glob(f"/usr/share/man/man{s}/*"))
  with concurrent.futures.ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
    for path, text in zip(paths, pool.map(_render_man, paths)):
      paragraphs = _prose_paragraphs(_man_prose(text))
      if paragraphs:
        yield os.path.relpath(path, "/usr/share/man"), paragraphs


_MAN_SKIP = {"NAME", "SYNOPSIS", "EXAMPLES", "EXAMPLE", "FILES", "SEE ALSO", "AUTHOR", "AUTHORS", "COPYRIGHT",
             "REPORTING BUGS", "COLOPHON", "GCLOUD WIDE FLAGS"}


def _man_prose(text: str) -> str:
  """The descriptive sections of a rendered page as blank-line separated paragraphs: headings (unindented lines)
  start new paragraphs and are dropped, as are the page's header and footer, the sections of names, synopses,
  examples and credits, and option lines (starting with '-')."""
  out, skip = [], False
  for line in text.splitlines()[1:-1]:
    if line and not line[0].isspace():
      skip = line.strip().upper() in _MAN_SKIP
      out.append("")
    elif not skip and not line.lstrip().startswith(("-", "$", "#")):
      out.append(line)
  return "\n".join(out)


def build_demo_corpus(out_path: str, min_sentences: int = 2) -> CorpusStats:
  """Write the offline demo corpus (Python's own docs) in the original format; deterministic, no network.

  One document per module docstring set / pydoc topic; one sentence per line; blank lines between documents.
  """
  return build_offline_corpus(out_path, ("python",), min_sentences)


SOURCES = {"python": lambda: (d for s in (_stdlib_docstrings(), _pydoc_topics()) for d in s),
           "packages": _package_docstrings, "man": _man_pages}


def build_offline_corpus(out_path: str, sources=("python",), min_sentences: int = 2,
                         dedupe: bool = False) -> CorpusStats:
  """Write the named `sources` (keys of SOURCES) as one corpus in the original format: one document per module,
  pydoc topic or manual page; one sentence per line; blank lines between documents. `dedupe` keeps each paragraph
  once (by its whitespace-normalised text), in the order first seen."""
  unknown = [s for s in sources if s not in SOURCES]
  if unknown:
    raise CorpusError(f"unknown corpus source(s) {unknown}; known: {sorted(SOURCES)}")
  stats = CorpusStats()
  seen: set[bytes] = set()
  with files.local_target(out_path) as local:  # a remote out_path: written here, uploaded when whole
    os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
    tmp = local + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      for source in sources:
        for _, paragraphs in SOURCES[source]():
          if dedupe:
            kept = []
            for p in paragraphs:
              key = hashlib.blake2b(" ".join(p.split()).encode("utf-8"), digest_size=16).digest()
              if key not in seen:
                seen.add(key)
                kept.append(p)
            paragraphs = kept
          sentences = [s for p in paragraphs for s in split_sentences(p)]
          if len(sentences) < min_sentences:
            stats.empty_documents += 1
            continue
          stats.documents += 1
          stats.sentences += len(sentences)
          f.write("\n".join(sentences) + "\n\n")
    os.replace(tmp, local)
  if stats.documents == 0:
    raise CorpusError(f"the offline corpus from {list(sources)} came out empty: this machine ships none of its text")
  logging.info("offline corpus: %d documents, %d sentences -> %s", stats.documents, stats.sentences, out_path)
  return stats


def write_topic_task(out_dir: str, classes: int = 6, dev_every: int = 5) -> dict:
  """A real labelled task from the same text: which standard-library package a documentation paragraph describes.

  The `classes` packages (directories, not single modules; none private) with the most docstring paragraphs are
  the labels, so which ones depends on the Python version. Each distinct paragraph of theirs is one example, every
  `dev_every`-th of a package (in source order) in the evaluation split. Writes train.csv and dev.csv (columns
  text, label) into `out_dir`; returns the labels, each split's size and the evaluation split's most frequent
  label's share (what a model that always answers it scores)."""
  import csv
  by_package: dict[str, list[str]] = {}
  seen: set[str] = set()
  for name, paragraphs in _stdlib_docstrings():
    package = name.split(os.sep)[0]
    if package.startswith("_") or os.sep not in name:
      continue
    for p in paragraphs:
      key = " ".join(p.split()).lower()  # a paragraph repeated across modules would sit in both splits
      if key not in seen:
        seen.add(key)
        by_package.setdefault(package, []).append(p)
  labels = sorted(sorted(by_package, key=lambda k: (-len(by_package[k]), k))[:classes])
  if len(labels) < 2:
    raise CorpusError(f"this Python ships documented packages {labels}; the topic task needs at least two")
  with files.local_target(out_dir) as local:  # a remote out_dir: written here, uploaded when whole
    os.makedirs(local, exist_ok=True)
    sizes = {}
    for split in ("train", "dev"):
      rows = [(p, k) for k in labels for i, p in enumerate(by_package[k])
              if (i % dev_every == dev_every - 1) == (split == "dev")]
      tmp = os.path.join(local, f"{split}.csv.tmp")
      with open(tmp, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)
      os.replace(tmp, os.path.join(local, f"{split}.csv"))
      sizes[split] = len(rows)
  majority = max(sum(1 for i in range(len(by_package[k])) if i % dev_every == dev_every - 1) for k in labels)
  return {"labels": labels, **sizes, "majority": majority / sizes["dev"]}


def heldout_blanks(data_dir: str, tok, n: int, seed: int = 0) -> list[tuple[str, str]]:
  """`n` blanks to fill from the held-out documents of the pre-training data in `data_dir` (the documents
  `dataset.create` held out, read from its input as it read them): sentences of 8-30 words of plain prose (no
  inline code or markup: ``, ::, _, =, <, >, {, }, |, \\) drawn at random with `seed`, each with one of its words
  (one vocabulary piece, picked at random) replaced by [MASK]; returns (sentence with the blank, the word taken
  out) pairs."""
  import random

  from bertjax.data.pretraining import corpus, dataset, generation
  creation = dataset.read_creation(data_dir)
  docs = corpus.read_documents(creation["input"], opts=dataset.reader_options(creation))
  sentences = [s for d in generation.split_documents(docs, creation["heldout_every"], True) for s in d
               if 8 <= len(s.split()) <= 30 and not re.search(r"``|::|[_=<>{}|\\]", s)]
  rng = random.Random(seed)
  out = []
  for s in rng.sample(sentences, len(sentences)):
    words = [m for m in re.finditer(r"(?<![\w.])[A-Za-z]+(?![\w(])", s) if len(tok.encode(m.group())) == 1]
    if words:
      m = rng.choice(words)
      out.append((s[:m.start()] + "[MASK]" + s[m.end():], m.group().lower() if creation["do_lower_case"] else
                  m.group()))
    if len(out) == n:
      break
  return out
