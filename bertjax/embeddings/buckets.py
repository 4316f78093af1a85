"""Padded lengths for inference: a few compiled programs per command, and little compute spent on padding.

Each distinct padded length is one XLA program (seconds to compile, more on a TPU), and every padded token costs
compute. An encoder keeps one `Lengths`: for each call it picks at most `limit` lengths for the call's batches
(each batch's longest row rounded up to `multiple`), the choice that spends the fewest padded tokens, counting a
length not compiled yet as `penalty` tokens more, so the query and the document sides, and later calls, reuse the
programs compiled before when that costs little padding.
"""
from __future__ import annotations

from collections.abc import Sequence

import jax


def default_penalty() -> int:
  """Padded tokens one compile is worth: on a CPU core a small encoder's compile costs about what a couple of
  thousand tokens of its forward pass cost; on an accelerator compiling is far dearer than compute."""
  return 2048 if jax.default_backend() == "cpu" else 1 << 16


class Lengths:
  """The padded lengths an encoder has compiled, and the choice of lengths for each call's batches."""

  def __init__(self, cap: int, limit: int = 4, multiple: int = 8, penalty: int | None = None):
    if limit < 1 or multiple < 1 or cap < 1:
      raise ValueError(f"Lengths(cap={cap}, limit={limit}, multiple={multiple}): each must be >= 1")
    self.cap, self.limit, self.multiple = cap, limit, multiple
    self.penalty = default_penalty() if penalty is None else penalty
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
