"""Distillation from a teacher: reading the teacher's scores of a training file, kept beside it, and the losses
that train a student on them, as sentence-transformers 6 computes them. Writing the scores is
`bertjax.embeddings.teacher` (it loads the teacher model, of any kind); this module is what the task kinds need.

A score folder (`teacher.write_scores`, the `teacher` command) holds, for each (query, positive, negative_1..n) row of a
training file, the teacher's score of the query with each of its 1 + n documents: `teacher.json` (the teacher,
the training file's path and SHA-256, its columns, the rows and block size) and one `scores_NNNNN.npy` [rows, 1 + n]
per block of rows, each written whole before the next, so that a rerun after a kill scores only the blocks that
are missing. `ScoreBlocks` checks a folder block by block and reads rows back through a cache bounded by the row
buffer (`read_scores`: the whole [rows, 1 + n] matrix); it refuses, in one line, a folder of another file or of
another number of documents per row.

The losses take a student's scores [B, 1 + n] of each query with its positive and negatives (dot products for
dense and sparse students, MaxSim for multi-vector ones) and the teacher's:

- `margin_mse`: MarginMSELoss (and SparseMarginMSELoss, MultiVectorMarginMSELoss): the mean squared difference
  of the margins s(q, p) - s(q, n_i) of student and teacher.
- `distill_kl`: DistillKLDivLoss (and SparseDistillKLDivLoss, MultiVectorDistillKLDivLoss): KL(teacher ‖
  student) of the softmaxes over [positive, negatives] at the temperature, summed over the candidates, averaged
  over the rows (torch's reduction="batchmean") and multiplied by temperature².

`example_weights` 0 (the rows padding a partial batch) leave rows out of both.
"""
from __future__ import annotations

import collections
import hashlib
import io
import math

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import errors
from bertjax.core import files
from bertjax.data.tasks import batching, rowfile

LOSSES = ("mnrl", "margin_mse", "distill_kl")  # mnrl: the kind's own contrastive loss, no teacher
RECORD = "teacher.json"


def check_loss(section: str, loss: str, temperature: float) -> None:
  """One line for a loss name outside LOSSES or a temperature that is not a positive finite number."""
  if loss not in LOSSES:
    raise errors.ConfigError(f"{section}.loss {loss!r}: choose from {list(LOSSES)}")
  if not 0 < temperature < math.inf:
    raise errors.ConfigError(f"{section}.temperature {temperature}: a positive finite number")


def margin_mse(student, teacher, weights=None):
  """MSE between the student's margins s[:, 0] - s[:, 1:] and the teacher's (no gradient to the teacher), the
  mean over the real rows' margins. `student`, `teacher` [B, 1 + n]."""
  s = student[:, :1] - student[:, 1:]
  t = jax.lax.stop_gradient(teacher[:, :1] - teacher[:, 1:]).astype(s.dtype)
  w = jnp.ones((s.shape[0],), s.dtype) if weights is None else weights.astype(s.dtype)
  return jnp.sum(w[:, None] * (s - t) ** 2) / jnp.maximum(jnp.sum(w) * s.shape[1], 1.0)


def distill_kl(student, teacher, temperature: float = 1.0, weights=None):
  """temperature² · Σ_rows w · KL(softmax(teacher / T) ‖ softmax(student / T)) / Σ w; a candidate the teacher
  gives probability 0 adds nothing (torch's xlogy)."""
  log_p = jax.nn.log_softmax(student / temperature, axis=-1)
  t = jax.lax.stop_gradient(teacher).astype(log_p.dtype) / temperature
  q, log_q = jax.nn.softmax(t, axis=-1), jax.nn.log_softmax(t, axis=-1)
  row = jnp.sum(jnp.where(q > 0, q * (log_q - log_p), 0.0), axis=-1)
  w = jnp.ones_like(row) if weights is None else weights.astype(row.dtype)
  return temperature ** 2 * jnp.sum(w * row) / jnp.maximum(jnp.sum(w), 1.0)


def loss(name: str, student, teacher, temperature: float = 1.0, weights=None):
  """The distillation loss `name` (margin_mse | distill_kl) of student scores against the teacher's."""
  if name == "margin_mse":
    return margin_mse(student, teacher, weights)
  return distill_kl(student, teacher, temperature, weights)


def pairwise_dot(queries, docs):
  """[B, K] dot products of each query [B, D] with its own documents [B, K, D]."""
  return jnp.einsum("bd,bkd->bk", queries, docs)


# ---------------------------------------------------------------------------------------------- score folders


def fingerprint(path: str) -> str:
  """The SHA-256 of the file's bytes, read a block at a time."""
  h, size, step = hashlib.sha256(), files.size(path), rowfile.MAX_BLOCK
  for start in range(0, size, step):
    h.update(files.read_range(path, start, min(size, start + step)))
  return h.hexdigest()


def block_file(out: str, i: int) -> str:
  return files.join(out, f"scores_{i:05d}.npy")


def _load_npy(path: str) -> np.ndarray:
  return np.load(io.BytesIO(files.read_bytes(path)), allow_pickle=False)


class ScoreBlocks:
  """The [rows, docs] teacher scores of a score folder, checked block by block when opened and read back by row
  index (`scores[idx]`) through a cache of blocks that holds at most the row buffer ($BERTJAX_ROW_BUFFER)."""

  def __init__(self, path: str, train_file: str, rows: int, docs: int):
    where = f"data.teacher_scores {path}"
    name = files.join(path, RECORD)
    if not files.isfile(name):
      raise errors.TaskDataError(f"{where}: not a teacher score folder (no {RECORD}); python -m bertjax teacher "
                                 "writes one")
    record = files.json_object(files.read_text(name), name, errors.TaskDataError)
    if record.get("fingerprint") != fingerprint(train_file):
      raise errors.TaskDataError(f"{where}: scores of another training file ({record.get('pairs')}, fingerprint "
                                 f"{str(record.get('fingerprint'))[:12]}), not of data.train_file {train_file}")
    if record.get("rows") != rows:
      raise errors.TaskDataError(f"{where}: {record.get('rows')} rows scored, data.train_file has {rows}")
    self.path, self.rows, self.block = path, rows, int(record["block"])
    n_blocks = -(-rows // self.block)
    missing = [i for i in range(n_blocks) if not files.isfile(block_file(path, i))]
    if missing:
      raise errors.TaskDataError(f"{where}: unfinished ({len(missing)} of {n_blocks} blocks missing); rerun the "
                                 "teacher command to finish it")
    self.budget = rowfile.buffer_size()
    self._cache: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
    for i in range(n_blocks):
      scores = self._read(i)
      want = (min(self.block, rows - i * self.block), docs)
      if scores.ndim != 2 or scores.shape[1] != docs:
        raise errors.TaskDataError(f"{where}: {scores.shape[-1]} scores per row (columns {record.get('columns')[1:]}), "
                                   f"the training rows have {docs} documents (a positive and {docs - 1} negatives)")
      if scores.shape != want:
        raise errors.TaskDataError(f"{where}: {block_file(path, i)} holds {len(scores)} rows, not {want[0]}; rerun "
                                   "the teacher command into a new folder")
      if not np.all(np.isfinite(scores)):
        raise errors.TaskDataError(f"{where}: scores that are not finite numbers")

  def _read(self, i: int) -> np.ndarray:
    scores = self._cache.pop(i, None)
    if scores is None:
      scores = _load_npy(block_file(self.path, i)).astype(np.float32)
    self._cache[i] = scores
    while len(self._cache) > 1 and sum(v.nbytes for v in self._cache.values()) > self.budget:
      self._cache.popitem(last=False)
    return scores

  def __len__(self) -> int:
    return self.rows

  def __getitem__(self, idx) -> np.ndarray:
    idx = np.asarray(idx, np.int64)
    return np.stack([self._read(int(i) // self.block)[int(i) % self.block] for i in idx]) if len(idx) else \
        np.zeros((0, self._read(0).shape[1]), np.float32)

  def all(self) -> np.ndarray:
    return np.concatenate([self._read(i) for i in range(-(-self.rows // self.block))])


def read_scores(path: str, train_file: str, rows: int, docs: int) -> np.ndarray:
  """[rows, docs] teacher scores of `train_file` from the score folder `path` (data.teacher_scores), each check a
  one-line error: not a score folder, another file's (fingerprint), unfinished, another number of documents."""
  return ScoreBlocks(path, train_file, rows, docs).all()


def options(section: str, loss_name: str, temperature: float) -> tuple:
  """A kind's distillation options from its config section (none for its own contrastive loss)."""
  check_loss(section, loss_name, temperature)
  return () if loss_name == "mnrl" else (("loss", loss_name), ("temperature", float(temperature)))


def attach(feats: dict, name: str, section: str, data) -> dict:
  """The training features with the teacher's scores of each row (`teacher_scores` [rows, 1 + K]) for the
  distillation loss `name` (a kind's `{section}.loss`), from data.teacher_scores."""
  if not data.teacher_scores:
    raise errors.ConfigError(f"{section}.loss {name} learns from a teacher's scores: set data.teacher_scores (python "
                             "-m bertjax teacher writes them)")
  k = batching.take(feats, np.arange(1))["doc_input_ids"].shape[1]  # a file larger than the buffer: `rows.Streamed`
  if k < 2:
    raise errors.ConfigError(f"{section}.loss {name} compares each positive with its hard negatives: set "
                             "embedding.negative_columns")
  if isinstance(feats, dict):
    return {**feats, "teacher_scores": read_scores(data.teacher_scores, data.train_file, len(feats["input_ids"]), k)}
  feats.extra["teacher_scores"] = ScoreBlocks(data.teacher_scores, data.train_file, len(feats), k)
  return feats
