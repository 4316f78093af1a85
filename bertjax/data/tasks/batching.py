"""Fine-tuning batches: every example once per epoch, rows grouped into a few length buckets so that a batch is
padded to its bucket rather than to the longest row or `max_seq_length`, partial batches filled with zero-weight
rows, and evaluation in length order. Each distinct padded length is one compiled program."""
from __future__ import annotations

import jax
import numpy as np

# Per-token features: cut to the batch's bucket length with the rows (the rest are per-row or per-slot).
TOKEN_KEYS = ("input_ids", "input_mask", "segment_ids", "labels", "label_weights", "position_ids",
              "attention_segment_ids", "attend_mask", "score_mask")


def bucket_multiple(max_seq_length: int, buckets: int) -> int:
  """The padding multiple giving at most `buckets` lengths up to `max_seq_length`: a multiple of 8, at least 16
  (16 at 64 or 128, 48 at 384, 64 at 512); 0 (no bucketing) when `buckets` is 0."""
  if not buckets:
    return 0
  return max(16, -(-max_seq_length // (buckets * 8)) * 8)


def bucket_length(mask: np.ndarray, multiple: int, full: int) -> int:
  """The smallest multiple of `multiple` that holds the longest row of `mask` (at most `full`; `full` when
  `multiple` is 0). Each distinct length is one compiled program: at most full/multiple of them."""
  if not multiple:
    return full
  longest = int(np.max(np.sum(mask, axis=1))) if mask.size else 0
  return min(full, max(multiple, -(-longest // multiple) * multiple))


class Plan:
  """Which rows each step trains on: every epoch a permutation (seed, epoch), cut into batches of
  `rows_per_step`; the last batch of an epoch may be partial (filled with zero-weight rows), so every example is
  seen once per epoch. A resume at step k recomputes the same batches and skips the first k.

  With `lengths` and `bucket` (length grouping), the permuted rows are sorted by their bucket length (the
  smallest multiple of `bucket` holding the row; random order within a bucket) and cut into consecutive batches
  from the longest end, whose order is then shuffled: a batch holds rows of one bucket, or of neighbouring
  buckets where one ends, and is padded to the longest of them. An epoch has as many steps as without grouping,
  and only its batch of the shortest rows may be partial: cutting each bucket apart would add a partial step
  and a compiled program for every sparsely filled bucket."""

  def __init__(self, n_rows: int, rows_per_step: int, num_epochs: int, seed: int, warmup_fraction: float,
               lengths: np.ndarray | None = None, bucket: int = 0):
    self.n_rows, self.rows_per_step, self.num_epochs, self.seed = n_rows, rows_per_step, num_epochs, seed
    self.row_bucket = None
    if lengths is not None and bucket:
      self.row_bucket = np.maximum(1, -(-np.asarray(lengths) // bucket))
    self.steps_per_epoch = -(-n_rows // rows_per_step)
    self.total_steps = self.steps_per_epoch * num_epochs
    self.warmup_steps = int(warmup_fraction * self.total_steps)

  def order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(self.n_rows)

  def batches(self, epoch: int) -> list[np.ndarray]:
    order, r = self.order(epoch), self.rows_per_step
    if self.row_bucket is None:
      return [order[s:s + r] for s in range(0, self.n_rows, r)]
    grouped = order[np.argsort(self.row_bucket[order], kind="stable")]  # random order within each bucket
    out = [grouped[max(0, e - r):e] for e in range(self.n_rows, 0, -r)]
    shuffle = np.random.default_rng([self.seed, epoch, 1]).permutation(len(out))
    return [out[i] for i in shuffle]

  def epoch_batches(self) -> list[list[np.ndarray]]:
    return [self.batches(e) for e in range(1, self.num_epochs + 1)]


def take(feats, idx: np.ndarray) -> dict:
  """The rows `idx` of training features: a dict of arrays indexed, or a file larger than the row buffer
  (`rows.StreamedPairs`) read and encoded for just these rows."""
  if isinstance(feats, dict):
    return {k: v[idx] for k, v in feats.items()}
  return feats.take(idx)


def num_rows(feats) -> int:
  return len(feats["input_ids"]) if isinstance(feats, dict) else len(feats)


def row_lengths(feats) -> np.ndarray:
  """Every row's real token count (what length grouping sorts by)."""
  return np.sum(feats["input_mask"], axis=1) if isinstance(feats, dict) else feats.lengths()


def make_batch(feats, idx: np.ndarray, batch_size: int, bucket: int = 0) -> dict:
  """The rows `idx` of `feats` as one batch of `batch_size` rows (zero rows of weight 0 fill a partial batch),
  per-token features cut to the bucket length of its longest row."""
  b = take(feats, idx)
  w = np.ones(len(idx), np.float32)
  if len(idx) < batch_size:
    extra = batch_size - len(idx)
    b = {k: np.concatenate([v, np.zeros((extra,) + v.shape[1:], v.dtype)]) for k, v in b.items()}
    w = np.concatenate([w, np.zeros(extra, np.float32)])
  full = b["input_ids"].shape[1]
  length = bucket_length(b["input_mask"], bucket, full)
  if length < full:
    b = {k: (v[:, :length] if k in TOKEN_KEYS and v.ndim >= 2 else v) for k, v in b.items()}
  # Packed rows carry one weight per example slot (0 for an empty slot): scaled by the row's weight.
  slots = b.pop("example_slot_weights", None)
  b["example_weights"] = w if slots is None else slots * w[:, None]
  return b


def batches(feats, batch_size):
  """The rows of `feats` in order, as full batches of `batch_size` (a last partial batch is left out)."""
  n = len(next(iter(feats.values())))
  for s in range(0, n - n % batch_size, batch_size):
    yield make_batch(feats, np.arange(s, s + batch_size), batch_size)


def _pad_tokens(x: np.ndarray, length: int, fill) -> np.ndarray:
  if x.ndim < 2 or x.shape[1] >= length:
    return x
  pad = np.full((x.shape[0], length - x.shape[1]) + x.shape[2:], fill, x.dtype)
  return np.concatenate([x, pad], axis=1)


def _fill(key: str):
  return np.finfo(np.float32).min if key.endswith("logits") else 0


def predict_all(predict_step, params, feats, batch_size, batch_sharding, bucket=0, token_outputs=None):
  """Outputs for every row of `feats` in order. Rows are batched by length (shortest first) so that each batch
  is padded only to its own bucket; per-token outputs (`token_outputs`, or by default those whose axis 1 is the
  batch's length) come back at the features' full length."""
  n = len(feats["input_ids"])
  if n == 0:
    return {}
  full = feats["input_ids"].shape[1]
  order = np.argsort(np.sum(feats["input_mask"], axis=1), kind="stable") if bucket else np.arange(n)
  outs = []
  from jax.experimental import multihost_utils
  for s in range(0, n, batch_size):
    b = make_batch(feats, order[s:s + batch_size], batch_size, bucket)
    out = predict_step(params, jax.device_put(b, batch_sharding))
    # Rows live on every process's devices: gather them everywhere (a plain copy in one process).
    out = jax.tree_util.tree_map(np.asarray, multihost_utils.process_allgather(out, tiled=True))
    # Per-token outputs (axis 1 the batch's length) are padded back to the full length; per-example ones
    # (a classifier's [B, C] logits) are not. Padded logits are the lowest float: never an argmax.
    length = b["input_ids"].shape[1]
    outs.append({k: _pad_tokens(v, full, _fill(k)) if (k in token_outputs if token_outputs is not None else
                                                       v.ndim >= 2 and v.shape[1] == length) else v
                 for k, v in out.items()})
  merged = {k: np.concatenate([o[k] for o in outs])[:n] for k in outs[0]}
  inverse = np.empty(n, np.int64)
  inverse[order] = np.arange(n)
  return {k: v[inverse] for k, v in merged.items()}


def predict_packed(predict_step, params, feats, batch_size, batch_sharding, max_per_row: int, pack,
                   per_token: bool):
  """`predict_all`'s outputs for every row of `feats`, computed on packed rows: examples laid end to end in rows
  of the features' length (block-diagonal attention, positions restarting per example), so a batch holds no
  padding to speak of and has one shape, one compiled program. Outputs come back per example: per-token ones
  (`per_token`, a tagger's) at the features' full length, per-example ones (read at each example's [CLS])."""
  n = len(feats["input_ids"])
  if n == 0:
    return {}
  full = feats["input_ids"].shape[1]
  rows_feats, rows = pack(feats, full, max_per_row)  # a task kind's `pack`
  out = predict_all(predict_step, params, rows_feats, batch_size, batch_sharding)
  lengths = np.sum(feats["input_mask"], axis=1)
  result = {}
  for k, v in out.items():
    if per_token:
      res = np.full((n, full) + v.shape[2:], _fill(k), v.dtype)
      for i, members in enumerate(rows):
        t = 0
        for j in members:
          res[j, :lengths[j]] = v[i, t:t + lengths[j]]
          t += lengths[j]
    else:
      res = np.zeros((n,) + v.shape[2:], v.dtype)
      for i, members in enumerate(rows):
        res[members] = v[i, :len(members)]
    result[k] = res
  return result
