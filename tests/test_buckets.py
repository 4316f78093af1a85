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


@pytest.mark.parametrize("seed", range(8))
def test_device_batches_cover_every_row_once_within_the_token_cap(seed):
  rng = random.Random(seed)
  cap, batch_size, align = rng.choice([64, 256, 512]), rng.choice([1, 5, 32]), rng.choice([1, 2, 8])
  tokens = rng.choice([None, 100, 2048])
  lengths = buckets.Lengths(cap, penalty=0, batch_tokens=tokens)
  sizes = sorted((rng.randint(1, cap + 20) for _ in range(rng.randint(1, 90))), reverse=True)
  got = lengths.batches(sizes, batch_size, align)
  assert [i for start, stop, _, _ in got for i in range(start, stop)] == list(range(len(sizes)))
  # The widths are the ones `plan` picks for the user's batches (at most `limit` programs), each device batch
  # padded to the least of them that holds its longest row.
  plan = sorted(set(buckets.Lengths(cap, penalty=0).plan(sizes[::batch_size], batch_size)))
  for start, stop, width, rows in got:
    need = min(-(-sizes[start] // 8) * 8, cap)
    assert width == min(w for w in plan if w >= need) and sizes[start] == max(sizes[start:stop])
    assert stop - start <= rows
    assert rows <= max(batch_size, align)
    if tokens is not None and width * max(align, 1) <= tokens and batch_size >= align:
      assert rows * width <= tokens
    if batch_size >= align > 1:
      assert rows % align == 0


def test_a_cpu_batch_of_long_rows_runs_as_smaller_device_batches():
  lengths = buckets.Lengths(256, penalty=0, batch_tokens=2048)
  got = lengths.batches([256] * 40 + [60] * 30, batch_size=32)
  # The user's second batch holds 8 rows at 256 and 24 at 60: it runs as a batch of 8 at 256 and the 60s as
  # one batch of 32 at 64, not four batches of 8 at 256.
  assert got == [(0, 8, 256, 8), (8, 16, 256, 8), (16, 24, 256, 8), (24, 32, 256, 8), (32, 40, 256, 8),
                 (40, 70, 64, 32)]
  assert buckets.Lengths(256, penalty=0, batch_tokens=None).batches([256] * 40, 32) == [(0, 32, 256, 32),
                                                                                        (32, 40, 256, 32)]
  assert lengths.rows(512, 32, align=8) == 8  # 4 rows fit 2048 tokens; the 8 devices each take one
