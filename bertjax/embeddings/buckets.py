"""Padded lengths for inference: a few compiled programs per command, and little compute spent on padding.

Each distinct padded length is one XLA program (seconds to compile, more on a TPU), and every padded token costs
compute. An encoder keeps one `Lengths`: for each call it picks at most `limit` lengths for the call's batches
(each batch's longest row rounded up to `multiple`), the choice that spends the fewest padded tokens, counting a
length not compiled yet as `penalty` tokens more, so the query and the document sides, and later calls, reuse the
programs compiled before when that costs little padding.

On a CPU a device batch holds at most `CPU_BATCH_TOKENS` padded tokens (a user's batch of 32 rows at 256 tokens
runs as four batches of 8): the forward's largest activations then stay in the caches and in memory already
mapped, where a [32 x 256, 1536] product writes 50 MB out afresh each call. MiniLM-L6's forward takes 1.16 s
per 32 x 256 rows in batches of 8 rows against 1.56 s in one (docs/performance.md#device-batches-on-the-cpu).
"""
from __future__ import annotations

from collections.abc import Sequence

import jax

CPU_BATCH_TOKENS = 2048


def default_batch_tokens() -> int | None:
  """Padded tokens a device batch holds at most: `CPU_BATCH_TOKENS` on a CPU, no cap on an accelerator (whose
  memory and parallel units want the user's whole batch)."""
  return CPU_BATCH_TOKENS if jax.default_backend() == "cpu" else None


def default_penalty() -> int:
  """Padded tokens one compile is worth: on a CPU core a small encoder's compile costs about what a couple of
  thousand tokens of its forward pass cost; on an accelerator compiling is far dearer than compute."""
  return 2048 if jax.default_backend() == "cpu" else 1 << 16


class Lengths:
  """The padded lengths an encoder has compiled, and the choice of lengths for each call's batches."""

  def __init__(self, cap: int, limit: int = 4, multiple: int = 8, penalty: int | None = None,
               batch_tokens: int | None = 0):
    if limit < 1 or multiple < 1 or cap < 1:
      raise ValueError(f"Lengths(cap={cap}, limit={limit}, multiple={multiple}): each must be >= 1")
    self.cap, self.limit, self.multiple = cap, limit, multiple
    self.penalty = default_penalty() if penalty is None else penalty
    self.batch_tokens = default_batch_tokens() if batch_tokens == 0 else batch_tokens
    self.compiled: set[int] = set()

  def reset(self) -> None:
    """Forget the compiled lengths, so the next call pads as a fresh process would. Blocks that are stored and
    resumed call it first: XLA's results depend in their last bits on the padded shape, and a resumed block must
    hold the bytes an uninterrupted run writes."""
    self.compiled.clear()

  def need(self, longest: int) -> int:
    return min(-(-max(longest, 1) // self.multiple) * self.multiple, self.cap)

  def plan(self, longest: Sequence[int], rows: int) -> list[int]:
    """The padded length of each batch, given each batch's longest row and the rows in a batch (padded batches
    cost rows x length). Chosen lengths are remembered as compiled."""
    needs = [self.need(n) for n in longest]
    if not needs:
      return []
    top = max(needs)
    cand = sorted(set(needs) | {c for c in self.compiled if c >= min(needs)})
    count = [sum(1 for n in needs if n == c) for c in cand]
    cost = [0 if c in self.compiled else self.penalty for c in cand]
    m, inf = len(cand), float("inf")
    # best[s][j]: the least cost covering every need <= cand[j] with s chosen lengths, the largest being cand[j].
    best = [[inf] * m for _ in range(self.limit + 1)]
    back = [[-1] * m for _ in range(self.limit + 1)]
    for j in range(m):
      best[1][j] = sum(count[:j + 1]) * rows * cand[j] + cost[j]
      for s in range(2, self.limit + 1):
        for i in range(j):
          if best[s - 1][i] < inf:
            v = best[s - 1][i] + sum(count[i + 1:j + 1]) * rows * cand[j] + cost[j]
            if v < best[s][j]:
              best[s][j], back[s][j] = v, i
    s, j = min(((s, j) for s in range(1, self.limit + 1) for j in range(m) if cand[j] >= top),
               key=lambda sj: best[sj[0]][sj[1]])
    chosen = []
    while j >= 0 and s >= 1:
      chosen.append(cand[j])
      j, s = back[s][j], s - 1
    chosen.sort()
    self.compiled.update(chosen)
    return [next(c for c in chosen if c >= n) for n in needs]

  def rows(self, width: int, batch_size: int, align: int = 1) -> int:
    """Rows of a device batch padded to `width`: the user's `batch_size`, or fewer where that would hold more than
    `batch_tokens` tokens (at least one row); a multiple of `align` (the devices that split the rows) when
    `batch_size` is one or more of it."""
    rows = batch_size if self.batch_tokens is None else min(batch_size, max(1, self.batch_tokens // width))
    return max(align, rows // align * align) if batch_size >= align > 1 else rows

  def batches(self, sizes: Sequence[int], batch_size: int, align: int = 1) -> list[tuple[int, int, int, int]]:
    """Device batches over rows of `sizes` tokens, given longest first: (start, stop, width, rows), rows
    [start, stop) padded to `rows` rows of `width` tokens. The widths are those `plan` picks for the user's
    batches of `batch_size` rows; each device batch takes the least of them that holds its first (longest) row
    and `rows(width)` rows, so where a CPU batch is cut into smaller ones, each is padded only to its own
    longest. Without a token cap the batches are the user's."""
    widths = sorted(set(self.plan(sizes[::batch_size], batch_size)))
    out, start = [], 0
    while start < len(sizes):
      width = next(w for w in widths if w >= self.need(sizes[start]))
      rows = self.rows(width, batch_size, align)
      out.append((start, min(start + rows, len(sizes)), width, rows))
      start = out[-1][1]
    return out
