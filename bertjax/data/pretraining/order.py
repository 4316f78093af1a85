"""The order a run reads a split in: stream position g -> example, a fresh permutation every epoch.

Over the whole split (`window` 0, or a window covering every shard) it is grain's index shuffle of the split.
A split in a bucket larger than the host's local cache is read in windows of `window` shards instead, as MosaicML
streaming's block shuffle does: every epoch permutes the shards, cuts them into windows of `window` shards, and
permutes the examples within each window (grain's index shuffle again), so a host needs the shards of the window
it reads and of the next one (fetched ahead), never the whole split. The order depends only on the seed, the
split's shard lengths and the window: the same from local disk as from a bucket, under any number of hosts.
"""
from __future__ import annotations

import zlib

import grain
import numpy as np
from grain.experimental import index_shuffle

from bertjax import errors
from bertjax.core import cache as cache_lib


def shuffled(source, seed: int, window: int = 0):
  """`source` read in the seed's order (indexable by any stream position g >= 0; see the module docstring)."""
  if not isinstance(window, int) or isinstance(window, bool) or window < 0:
    raise errors.ConfigError(f"data.shuffle_window={window!r}: shards shuffled across at once, >= 0 (0: the whole "
                             "split)")
  lengths = getattr(source, "shard_lengths", None)
  cache = getattr(source, "cache", None)
  if window and lengths is None:
    raise cache_lib.CacheError("data.shuffle_window reads the data's own shards; a packed or mixed source has none "
                               "(set data.shuffle_window=0)")
  if not window or window >= len(lengths):
    if cache is not None:
      if source.nbytes > cache.limit:
        most = max(1, cache.limit // (2 * max(source.shard_bytes)))
        raise cache_lib.CacheError(
            f"{source.data_dir} ({source.split}: {cache_lib.human(source.nbytes)}) is larger than the local cache "
            f"limit {cache_lib.human(cache.limit)}: shuffle it in windows of shards (data.shuffle_window, at most "
            f"{most} at this limit) or raise the limit ({cache_lib.ENV} or data.cache_limit)")
      source.prefetch(range(len(lengths)))
    return grain.MapDataset.source(source).shuffle(seed=seed)
  return WindowShuffled(source, seed, window)


class WindowShuffled:
  """A split of shards read in windows of `window` shards, shuffled per epoch (see the module docstring)."""

  def __init__(self, source, seed: int, window: int):
    self.source, self.seed, self.window = source, int(seed), int(window)
    self.lengths = np.asarray(source.shard_lengths, np.int64)
    self.starts = np.concatenate([[0], np.cumsum(self.lengths)])
    self.n = int(self.starts[-1])
    cache = getattr(source, "cache", None)
    if cache is not None:
      need = 2 * self.window * max(source.shard_bytes)
      if need > cache.limit:
        raise cache_lib.CacheError(
            f"data.shuffle_window={self.window} needs up to {cache_lib.human(need)} of local cache (this window's "
            f"shards and the next's, {cache_lib.human(max(source.shard_bytes))} at most each); the limit is "
            f"{cache_lib.human(cache.limit)} ({cache_lib.ENV} or data.cache_limit): "
            + ("lower the window or raise the limit" if self.window > 1 else "raise the limit"))
    self._epochs: dict[int, tuple] = {}
    self._current: tuple[int, int] | None = None

  def __len__(self) -> int:
    return self.n

  def _epoch(self, e: int):
    """(windows as shard lists, their starts in the epoch, their shards' starts within each window)."""
    if e not in self._epochs:
      perm = np.random.default_rng([self.seed, e]).permutation(len(self.lengths))
      windows = [perm[i:i + self.window] for i in range(0, len(perm), self.window)]
      sizes = [int(self.lengths[w].sum()) for w in windows]
      inner = [np.concatenate([[0], np.cumsum(self.lengths[w])]) for w in windows]
      self._epochs = {k: v for k, v in self._epochs.items() if k >= e - 1}
      self._epochs[e] = (windows, np.concatenate([[0], np.cumsum(sizes)]), inner)
    return self._epochs[e]

  def index(self, g: int) -> int:
    """The split's example at stream position g."""
    e, r = divmod(int(g), self.n)
    windows, starts, inner = self._epoch(e)
    w = int(np.searchsorted(starts, r, side="right")) - 1
    q = r - int(starts[w])
    size = int(starts[w + 1] - starts[w])
    q = index_shuffle(q, max_index=size - 1, seed=zlib.crc32(f"{self.seed}/{e}/{w}".encode()), rounds=4)
    j = int(np.searchsorted(inner[w], q, side="right")) - 1
    shard = int(windows[w][j])
    self._ahead(e, w)
    return int(self.starts[shard]) + q - int(inner[w][j])

  def _ahead(self, e: int, w: int) -> None:
    """On entering a window: its shards and the next window's are fetched ahead."""
    if self._current == (e, w) or not hasattr(self.source, "prefetch"):
      return
    self._current = (e, w)
    windows, _, _ = self._epoch(e)
    nxt = windows[w + 1] if w + 1 < len(windows) else self._epoch(e + 1)[0][0]
    self.source.prefetch([int(s) for s in windows[w]] + [int(s) for s in nxt])

  def __getitem__(self, g: int):
    return self.source[self.index(g)]

  def window_of(self, g: int) -> list[int]:
    """The shards of the window that stream position g reads."""
    e, r = divmod(int(g), self.n)
    windows, starts, _ = self._epoch(e)
    return [int(s) for s in windows[int(np.searchsorted(starts, r, side="right")) - 1]]

