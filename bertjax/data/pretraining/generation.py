"""Pre-training examples from a stream of documents, in buffers that worker processes (or Beam workers) turn into
examples independently: `pretraining` holds the example rules, this module the streaming and the parallelism.
Every buffer draws from its own seeded generator (`pretraining.buffer_rng`), so the examples do not depend on
how many workers make them."""
from __future__ import annotations

import collections
import ctypes
import multiprocessing as mp
import signal
import sys
from typing import Iterable, Iterator

import numpy as np

from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data.pretraining.examples import CreationOptions, Vocab, buffer_rng, create_instances, to_features

_WORKER: dict = {}


def init_worker(tokenizer_path: str, do_lower_case: bool):
  tok = tokenizer_lib.load(tokenizer_path, do_lower_case=do_lower_case, reference="original")
  _WORKER["tok"], _WORKER["vocab"] = tok, Vocab.of(tok)


def _init_pool_worker(tokenizer_path: str, do_lower_case: bool):
  """A creation worker: dies with its parent (a killed run leaves no workers spinning) and leaves Ctrl-C to it."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if sys.platform.startswith("linux"):
    try:
      ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
      pass
  init_worker(tokenizer_path, do_lower_case)


def process_buffer(args):
  buffer_index, raw_documents, opts = args[:3]
  tok, vocab = _WORKER["tok"], _WORKER["vocab"]
  documents = []
  for doc in raw_documents:
    sentences = [ids for ids in (tok.encode(s) for s in doc) if ids]
    documents.append(sentences)
  empty = sum(1 for d in documents if not d)
  rng = buffer_rng(opts.random_seed, buffer_index)
  instances = create_instances(documents, opts, vocab, rng)
  feats = [to_features(x, opts.max_seq_length, opts.max_predictions_per_seq) for x in instances]
  return feats, empty


def _buffers(documents: Iterable[list[str]], size: int, shard: tuple[int, int]):
  index, count = shard
  buf: list[list[str]] = []
  b = 0
  for doc in documents:
    buf.append(doc)
    if len(buf) == size:
      if b % count == index:
        yield b, buf
      buf, b = [], b + 1
  if buf and b % count == index:
    yield b, buf


def generate_examples(documents: Iterable[list[str]], tokenizer_path: str, opts: CreationOptions, *,
                      do_lower_case: bool = True, num_workers: int = 1, shard: tuple[int, int] = (0, 1),
                      stats: dict | None = None) -> Iterator[dict[str, np.ndarray]]:
  """Feature dicts for documents of sentences (strings), in a deterministic order for any `num_workers`.

  `shard=(i, n)`: take every n-th buffer starting at i (one share of the corpus per process or machine).
  """
  for _, feats in generate_keyed_examples(documents, tokenizer_path, opts, do_lower_case=do_lower_case,
                                          num_workers=num_workers, shard=shard, stats=stats):
    yield feats


def generate_keyed_examples(documents: Iterable[list[str]], tokenizer_path: str, opts: CreationOptions, *,
                            do_lower_case: bool = True, num_workers: int = 1, shard: tuple[int, int] = (0, 1),
                            stats: dict | None = None) -> Iterator[tuple[tuple[int, int], dict[str, np.ndarray]]]:
  """((buffer index, position in the buffer), features), as `generate_examples`."""
  stats = stats if stats is not None else {}
  stats.setdefault("examples", 0)
  stats.setdefault("empty_documents", 0)
  buffers = _buffers(documents, opts.buffer_documents, shard)
  for b, (feats, empty) in _map_buffers(process_buffer, buffers, opts, (), tokenizer_path, do_lower_case,
                                        num_workers):
    stats["empty_documents"] += empty
    stats["examples"] += len(feats)
    for j, f in enumerate(feats):
      yield (b, j), f


def write_shards(documents: Iterable[list[str]], tokenizer_path: str, opts: CreationOptions, *, data_dir: str,
                 split: str, do_lower_case: bool = True, num_workers: int = 1,
                 skip: set[int] = frozenset()) -> Iterator[tuple[int, dict]]:
  """(buffer index, shard record) for each buffer but those in `skip`, in order: each worker makes a buffer's
  examples and writes them as that buffer's shard of `split` in `data_dir` (store.py), so the examples never
  travel back to this process and each worker holds one shard at a time."""
  buffers = ((b, docs) for b, docs in _buffers(documents, opts.buffer_documents, (0, 1)) if b not in skip)
  yield from _map_buffers(write_buffer, buffers, opts, (data_dir, split), tokenizer_path, do_lower_case, num_workers)


def write_buffer(args) -> dict:
  """One buffer's examples written as its shard (in a worker); returns the shard's record."""
  from bertjax.data.pretraining import store
  b, raw_documents, opts, data_dir, split = args
  feats, empty = process_buffer((b, raw_documents, opts))
  writer = _WORKER.get("writer")
  if writer is None or writer.folder != store.version_dir(data_dir):
    writer = _WORKER["writer"] = store.ShardWriter(data_dir, opts.max_seq_length, opts.max_predictions_per_seq)
  return writer.write(split, b, feats, empty)


def _map_buffers(fn, buffers, opts, extra: tuple, tokenizer_path: str, do_lower_case: bool, num_workers: int):
  """(buffer index, fn((b, documents, opts, *extra))) in buffer order, by `num_workers` processes (at most
  num_workers + 1 buffers in flight)."""
  if num_workers <= 1:
    init_worker(tokenizer_path, do_lower_case)
    for b, docs in buffers:
      yield b, fn((b, docs, opts, *extra))
    return
  ctx = mp.get_context("spawn")
  with ctx.Pool(num_workers, initializer=_init_pool_worker, initargs=(tokenizer_path, do_lower_case)) as pool:
    pending: collections.deque = collections.deque()
    for b, docs in buffers:
      pending.append((b, pool.apply_async(fn, ((b, docs, opts, *extra),))))
      if len(pending) > num_workers:
        b0, result = pending.popleft()
        yield b0, result.get()
    while pending:
      b0, result = pending.popleft()
      yield b0, result.get()


def example_key(buffer_index: int, position: int) -> int:
  """An example's key in the written dataset (tfds orders examples by a hash of it), the same in the local and the
  Beam path: the buffer and the position in it (a buffer's examples stay far below 2**32)."""
  return (buffer_index << 32) | position


def split_documents(documents: Iterable[list[str]], heldout_every: int, heldout: bool) -> Iterator[list[str]]:
  """Every `heldout_every`-th document goes to the held-out split (0 disables it)."""
  for i, doc in enumerate(documents):
    is_heldout = heldout_every > 0 and i % heldout_every == heldout_every - 1
    if is_heldout == heldout:
      yield doc

