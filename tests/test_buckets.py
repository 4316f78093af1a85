"""Inference lengths (bertjax/embeddings/buckets.py): the fewest padded tokens under a cap on programs, against an
exhaustive search; compiled lengths reused."""
import itertools
import random

import pytest

from bertjax.embeddings import buckets


def _exhaustive(needs, rows, limit, compiled, penalty):
  """The least cost over every set of at most `limit` lengths that covers the needs (brute force)."""
  cand = sorted(set(needs) | {c for c in compiled if c >= min(needs)})
  best = float("inf")
  for size in range(1, limit + 1):
    for chosen in itertools.combinations(cand, size):
      if max(chosen) < max(needs):
        continue
      cost = sum(rows * min(c for c in chosen if c >= n) for n in needs)
      best = min(best, cost + penalty * sum(c not in compiled for c in chosen))
  return best


@pytest.mark.parametrize("seed", range(12))
def test_the_plan_spends_the_fewest_padded_tokens(seed):
  rng = random.Random(seed)
  cap, rows, limit = rng.choice([64, 128, 256]), rng.choice([1, 8, 32]), rng.choice([1, 2, 4])
  lengths = buckets.Lengths(cap, limit=limit, penalty=rng.choice([0, 500, 5000]))
  lengths.compiled = {rng.randrange(8, cap + 1, 8) for _ in range(rng.randrange(3))}
  longest = sorted((rng.randint(1, cap + 40) for _ in range(rng.randint(1, 30))), reverse=True)
  needs = [min(-(-n // 8) * 8, cap) for n in longest]
  compiled = set(lengths.compiled)
  widths = lengths.plan(longest, rows)
  assert all(w >= n and w % 8 == 0 and w <= cap for w, n in zip(widths, needs))
  assert len(set(widths)) <= limit and set(widths) <= lengths.compiled
  cost = sum(rows * w for w in widths) + lengths.penalty * len(set(widths) - compiled)
  assert cost == _exhaustive(needs, rows, limit, compiled, lengths.penalty)


def test_compiled_lengths_are_reused_when_padding_costs_less_than_a_compile():
  lengths = buckets.Lengths(256, penalty=0)
  assert lengths.plan([250, 100, 40], rows=4) == [256, 104, 40]
  lengths.penalty = 10_000
  assert lengths.plan([30, 20], rows=4) == [40, 40]  # 10 + 20 tokens of padding a row, not a new program
  cheap = buckets.Lengths(256, penalty=0)
  cheap.compiled = {256}
  assert cheap.plan([30, 20], rows=4) == [32, 24]


def test_bad_settings_are_refused():
  with pytest.raises(ValueError, match="each must be >= 1"):
    buckets.Lengths(128, limit=0)
