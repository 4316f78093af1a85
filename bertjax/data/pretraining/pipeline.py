"""Input pipeline: a seeded, index-based stream of global batches, read in disjoint shares per process.

Global batch t holds stream positions [t·B, (t+1)·B); stream position g reads example `shuffle(g)` of the data
source (grain's index shuffle, a fresh permutation every epoch, O(1) memory; over the whole split or within
windows of shards, `order.py`). Each process reads only the rows
its devices hold and the global `jax.Array` is assembled with `jax.make_array_from_process_local_data`.

The iterator's whole state is `{"step": t}` (plus the seed, batch size and source length to check against):
restored under any number of processes it yields the same global batches.
"""
from __future__ import annotations

import concurrent.futures
import random
from typing import Callable, Iterator, Mapping

import jax
import numpy as np

from bertjax import errors
from bertjax.data.pretraining import examples as pretraining
from bertjax.data.pretraining import order


class StateMismatchError(errors.CheckpointError, ValueError):
  """Restoring an iterator state saved for other data, another batch size or another seed."""


def _rows_of_this_process(sharding, global_batch: int, process=None) -> tuple[int, int]:
  """[start, stop) of the global batch rows that this process's devices hold.

  Without a sharding, `process=(index, count)` (default: this JAX process) picks an equal contiguous share.
  """
  if sharding is None:
    i, n = process if process is not None else (jax.process_index(), jax.process_count())
    if global_batch % n:
      raise errors.ConfigError(f"global batch {global_batch} is not divisible by the {n} processes")
    per = global_batch // n
    return i * per, (i + 1) * per
  index_map = sharding.addressable_devices_indices_map((global_batch,))
  starts = [idx[0].start or 0 for idx in index_map.values()]
  stops = [global_batch if idx[0].stop is None else idx[0].stop for idx in index_map.values()]
  start, stop = min(starts), max(stops)
  covered = set()
  for a, b in zip(starts, stops):
    covered.update(range(a, b))
  if covered != set(range(start, stop)):
    raise errors.ConfigError("this process's devices hold a non-contiguous part of the batch; use a mesh whose "
                             "batch axes are laid out process by process")
  return start, stop


def stack(examples: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {k: np.stack([np.asarray(e[k]) for e in examples]) for k in examples[0]}


def to_global(batch: Mapping[str, np.ndarray], sharding, global_batch: int) -> dict:
  if sharding is None:
    return dict(batch)
  return {k: jax.make_array_from_process_local_data(sharding, v, (global_batch,) + v.shape[1:])
          for k, v in batch.items()}


class Pipeline:
  """Infinite, shuffled, host-sharded global batches with an index-based, process-count-free state."""

  def __init__(self, source, global_batch_size: int, *, seed: int = 0, shuffle: bool = True, sharding=None,
               transform: Callable[[dict, int], dict] | None = None, prefetch: int = 2,
               process: tuple[int, int] | None = None, window: int = 0):
    if len(source) == 0:
      raise errors.DataError("the data source is empty")
    self.source = source
    self.global_batch_size = int(global_batch_size)
    self.seed = int(seed)
    self.sharding = sharding
    self.transform = transform
    self.prefetch = max(0, prefetch)
    self._shuffle = shuffle
    self._order = order.shuffled(source, self.seed, window) if shuffle else None
    self._rows = _rows_of_this_process(sharding, self.global_batch_size, process)
    self._step = 0
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1) if self.prefetch else None
    self._pending: dict[int, concurrent.futures.Future] = {}

  def __len__(self):
    return len(self.source)

  def example(self, g: int) -> dict:
    """Stream position g -> its example (epoch g // N reads a fresh permutation)."""
    if self._shuffle:
      return dict(self._order[g])
    return dict(self.source[g % len(self.source)])

  def local_batch(self, step: int) -> dict[str, np.ndarray]:
    start, stop = self._rows
    base = step * self.global_batch_size
    examples = []
    for row in range(start, stop):
      g = base + row
      ex = self.example(g)
      if self.transform is not None:
        ex = self.transform(ex, g)
      examples.append(ex)
    batch = stack(examples)
    batch.setdefault("next_sentence_weights", np.ones((stop - start,), np.float32))
    return batch

  def _future(self, step):
    if step not in self._pending:
      self._pending[step] = self._pool.submit(self.local_batch, step)
    return self._pending[step]

  def __iter__(self) -> Iterator[dict]:
    return self

  def __next__(self) -> dict:
    step = self._step
    if self._pool is None:
      local = self.local_batch(step)
    else:
      for s in range(step, step + self.prefetch + 1):
        self._future(s)
      local = self._pending.pop(step).result()
    self._step += 1
    return to_global(local, self.sharding, self.global_batch_size)

  # ------------------------------------------------------------------ state
  def get_state(self) -> dict:
    return {"step": self._step, "seed": self.seed, "global_batch_size": self.global_batch_size,
            "num_examples": len(self.source)}

  def set_state(self, state: Mapping) -> None:
    for key in ("seed", "global_batch_size", "num_examples"):
      mine = self.get_state()[key]
      if key in state and int(state[key]) != mine:
        raise StateMismatchError(f"data iterator state was saved with {key}={state[key]}, this run has {mine}")
    for f in self._pending.values():
      f.cancel()
    self._pending.clear()
    self._step = int(state["step"])

  def close(self):
    if self._pool is not None:
      self._pool.shutdown(wait=False, cancel_futures=True)


def dynamic_masking(vocab: pretraining.Vocab, opts: pretraining.CreationOptions, seed: int):
  """A transform drawing a fresh mask per stream position (so per epoch and per step), deterministically."""
  def fn(example: dict, g: int) -> dict:
    return pretraining.remask(example, vocab, opts, random.Random(f"{seed}/dynamic/{g}"))
  return fn


PREDICTION_KEYS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")


def fit_predictions(remask, cap: int):
  """`remask` (example, g) -> example drawing at most `cap` masks, on examples whose prediction arrays hold the
  data's cap: widened with empty slots first (a run's cap above the data's), cut to `cap` after (below it)."""
  def fn(example: dict, g: int) -> dict:
    width = len(example["masked_lm_positions"])
    if width < cap:
      example = dict(example)
      for k in PREDICTION_KEYS:
        v = np.asarray(example[k])
        example[k] = np.concatenate([v, np.zeros(cap - width, v.dtype)])
    out = remask(example, g)
    if width > cap:
      out = {**out, **{k: np.asarray(out[k])[:cap] for k in PREDICTION_KEYS}}
    return out
  return fn


class Remasked:
  """A source whose examples are masked afresh at `opts.masked_lm_prob`, the same masks every time it is read
  (example g's mask is drawn from seed/eval/g): a held-out set at another masking rate than training's."""

  def __init__(self, source, vocab: pretraining.Vocab, opts: pretraining.CreationOptions, seed: int):
    self._source, self._vocab, self._opts, self._seed = source, vocab, opts, seed

  def __len__(self):
    return len(self._source)

  def __getitem__(self, g: int) -> dict:
    return pretraining.remask(dict(self._source[g]), self._vocab, self._opts, random.Random(f"{self._seed}/eval/{g}"))


def eval_batches(source, global_batch_size: int, *, sharding=None, limit: int | None = None,
                 process: tuple[int, int] | None = None) -> Iterator[dict]:
  """Every example exactly once, in order; the last partial batch is padded with zero-weight rows."""
  n = len(source) if limit is None else min(limit, len(source))
  start, stop = _rows_of_this_process(sharding, global_batch_size, process)
  template = None
  for base in range(0, n, global_batch_size):
    examples, real = [], []
    for row in range(start, stop):
      g = base + row
      if g < n:
        ex = dict(source[g])
        template = template or ex
        examples.append(ex)
        real.append(1.0)
      else:
        ex = {k: np.zeros_like(np.asarray(v)) for k, v in (template or dict(source[0])).items()}
        examples.append(ex)
        real.append(0.0)
    batch = stack(examples)
    batch["next_sentence_weights"] = np.asarray(real, np.float32)
    batch["masked_lm_weights"] = batch["masked_lm_weights"] * batch["next_sentence_weights"][:, None]
    yield to_global(batch, sharding, global_batch_size)
