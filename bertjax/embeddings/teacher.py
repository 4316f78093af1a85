"""Scoring a training file with a teacher, for distillation: a cross-encoder's logits or a bi-encoder's
similarity of each row's query with each of its documents, written block by block into a score folder that
`distill.read_scores` reads back (its layout: `bertjax.embeddings.distill`). A top-layer tool: it loads a teacher
of either kind (`rerank.encoder.CrossEncoder`, `dense.encoder.Encoder`)."""
from __future__ import annotations

import dataclasses
import io
import json

import numpy as np

from bertjax import errors
from bertjax.core import files
from bertjax.embeddings import folders
from bertjax.embeddings.dense.encoder import Encoder, model_path
from bertjax.embeddings.distill import RECORD, block_file
from bertjax.embeddings.rerank.encoder import CrossEncoder


def _npy(array: np.ndarray) -> bytes:
  buf = io.BytesIO()
  np.save(buf, np.asarray(array, np.float32), allow_pickle=False)
  return buf.getvalue()


def open_folder(out: str, record: dict) -> None:
  """Starts (or resumes) a score folder at `out`: a new one gets `record`; one this command wrote for the same
  teacher, file and columns is resumed; anything else there is refused in one line."""
  name = files.join(out, RECORD)
  if files.isfile(name):
    have = files.json_object(files.read_text(name), name, errors.DataError)
    keys = ("teacher", "fingerprint", "columns", "rows", "block")
    if {k: have.get(k) for k in keys} != {k: record[k] for k in keys}:
      diff = [k for k in keys if have.get(k) != record[k]]
      raise errors.ConfigError(f"--out {out}: holds the scores of another run ({', '.join(diff)} differ); choose "
                               "another folder, or remove it to score again")
    return
  if files.exists(out) and (not files.isdir(out) or files.listdir(out)):
    raise errors.ConfigError(f"--out {out}: exists and the teacher command did not write it; choose another path")
  files.makedirs(out)
  files.write_whole(name, json.dumps(record, indent=1))


def write_scores(out: str, record: dict, score_block) -> int:
  """Scores every block of `record["rows"]` rows not yet in `out` (`score_block(start, stop)` -> [n, 1 + K]),
  each written whole; returns how many blocks were scored in this call."""
  open_folder(out, record)
  files.write_whole(files.join(out, RECORD), json.dumps(record, indent=1))  # the same record, its teacher's kind
  n, block, done = record["rows"], record["block"], 0
  for i, start in enumerate(range(0, n, block)):
    if files.isfile(block_file(out, i)):
      continue
    stop = min(start + block, n)
    scores = np.asarray(score_block(start, stop), np.float32).reshape(stop - start, -1)
    files.write_whole(block_file(out, i), _npy(scores))
    done += 1
  return done


def teacher_scorer(model: str, rows: list[dict], batch_size: int = 32):
  """(kind, score_block): a cross-encoder teacher's logits (no activation) or a bi-encoder's similarity (the
  folder's, cosine by default) of each row's query with each of its documents; score_block(start, stop) ->
  [stop - start, 1 + K]."""
  local = model_path(model)
  if CrossEncoder.is_model(local):
    ce = dataclasses.replace(CrossEncoder.load(model), activation="identity")

    def cross(start, stop):
      part = rows[start:stop]
      ce.lengths.reset()  # each block padded as a fresh run pads it: a resumed folder is the same
      pairs = [(r["anchor"], d) for r in part for d in r["docs"]]
      out = np.asarray(ce.predict(pairs, batch_size), np.float32)
      if out.ndim != 1:
        raise errors.ConfigError(f"--model {model}: a cross-encoder of {out.shape[1]} labels; a teacher gives one "
                                 "score a pair")
      return out.reshape(len(part), -1)
    return "cross-encoder", cross
  enc = Encoder.load(model)
  sim = ((folders.st_config(local).get("similarity_fn_name") if folders.is_folder(local) else None)
         or "cosine")
  if sim not in ("cosine", "dot"):
    raise errors.ConfigError(f"--model {model}: similarity {sim!r}; a teacher scores by cosine or dot")

  def bi(start, stop):
    part = rows[start:stop]
    enc.lengths.reset()
    q = enc.encode_query([r["anchor"] for r in part], batch_size)
    d = enc.encode_document([t for r in part for t in r["docs"]], batch_size).reshape(len(part), -1, q.shape[-1])
    if sim == "cosine":
      q = q / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-12)
      d = d / np.maximum(np.linalg.norm(d, axis=-1, keepdims=True), 1e-12)
    return np.einsum("bd,bkd->bk", q, d)
  return f"bi-encoder ({sim})", bi
