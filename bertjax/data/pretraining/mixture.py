"""Data mixtures and phased streams: several data folders (sources) drawn in fixed proportions, the batch size,
the mixture and the masking rate allowed to change from one segment of steps (a phase) to the next.

A segment's stream position g picks a source and that source's next draw with grain's mixing
(`grain.MapDataset.mix`): a deterministic interleaving in which every prefix of the stream holds each source in
its proportion (to grain's rounding: the smallest weight is scaled to 100), so every batch has the mixture's
make-up rather than a random one. Draw j of a source reads example `shuffle(j)` of that source (grain's index
shuffle; a fresh permutation each time the source is read through again). A source read by several segments
continues where the previous one stopped (`Segment.offsets`).

`stream` picks the pipeline of a plan's segments: a plan of one segment reading one source at one batch size is
the plain `Pipeline` (the source's own shuffled order), anything that mixes or moves a `PhasedPipeline`, so the
loop that reads the batches never asks which.

The state of a `PhasedPipeline` is the global step, with every source's position saved beside it: positions
follow from the step and the plan, and a resumed run whose plan gives other positions (a changed mixture,
batch or phase) is refused rather than silently reading other data.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import zlib
from typing import Callable, Mapping, Sequence

import grain
import numpy as np

from bertjax import errors
from bertjax.data.pretraining import order
from bertjax.data.pretraining import pipeline as pipeline_lib

BIG = sys.maxsize // 4  # the draws a source may make in one segment: unbounded in practice


def proportions(weights: Sequence[float]) -> tuple[int, ...]:
  """The integer proportions grain mixes with (its own rule: the smallest weight scaled to 100)."""
  from grain._src.python.dataset.transformations import mix as grain_mix
  return tuple(grain_mix._float_to_int_proportions(list(weights)))  # noqa: SLF001  (grain's public mix uses it)


def counts(position: int, weights: Sequence[float]) -> list[int]:
  """How many of the first `position` elements of grain's mixture of len(weights) endless sources come from each
  source (the closed form of grain's interleaving; a test checks it against grain's own enumeration)."""
  props = proportions(weights)
  remaining, current, out = sum(props), int(position), []
  for p in props:
    following = (current * (remaining - p)) // remaining
    out.append(current - following)
    remaining -= p
    current = following
  return out


def temperature_weights(sizes: Sequence[int], temperature: float) -> list[float]:
  """p_i ∝ n_i^τ (mmBERT's and XLM-R's language sampling): τ = 1 draws in proportion to size, τ → 0 evenly."""
  w = np.asarray(sizes, np.float64) ** float(temperature)
  return list(w / w.sum())


@dataclasses.dataclass(frozen=True)
class Segment:
  """The steps [start, end) of a run drawn from one mixture.

  sources: (key, source, weight) with `key` naming the source across segments (its data folder); offsets: the
  draws earlier segments made of each key; batch_sizes: the global batch of each of the segment's steps (a
  tuple as long as the segment); transform(example, stream position, step) -> example, or None."""
  name: str
  start: int
  end: int
  sources: tuple
  batch_sizes: tuple
  offsets: Mapping[str, int] = dataclasses.field(default_factory=dict)
  transform: Callable | None = None

  @property
  def weights(self) -> list[float]:
    return [w for _, _, w in self.sources]

  @functools.cached_property
  def _cumulative(self) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(self.batch_sizes, np.int64))])

  def positions_before(self, step: int) -> int:
    """Stream positions this segment has read before global step `step`."""
    return int(self._cumulative[min(max(0, step - self.start), self.end - self.start)])

  def draws(self, step: int) -> dict[str, int]:
    """Each source's position (examples drawn from it over the whole run) before global step `step`."""
    made = counts(self.positions_before(step), self.weights)
    return {key: int(self.offsets.get(key, 0)) + n for (key, _, _), n in zip(self.sources, made)}


@dataclasses.dataclass(frozen=True)
class PerPosition:
  """A segment's transform of (example, stream position) alone, the same at every step: what lets a segment of
  one source at one batch size be read as a plain `Pipeline`."""
  fn: Callable[[dict, int], dict]

  def __call__(self, example: dict, g: int, step: int) -> dict:
    del step
    return self.fn(example, g)


def stream(segments: Sequence[Segment], *, seed: int = 0, sharding=None, prefetch: int = 2,
           window: int = 0) -> pipeline_lib.Pipeline:
  """The batches of `segments`: one segment over one source at one batch size, with no transform or a
  `PerPosition` one, is the plain `Pipeline` over that source; anything else a `PhasedPipeline`."""
  seg = segments[0]
  if (len(segments) == 1 and len(seg.sources) == 1 and len(set(seg.batch_sizes)) == 1
      and (seg.transform is None or isinstance(seg.transform, PerPosition))):
    transform = seg.transform.fn if seg.transform is not None else None
    return pipeline_lib.Pipeline(seg.sources[0][1], seg.batch_sizes[0], seed=seed, sharding=sharding,
                                 transform=transform, prefetch=prefetch, window=window)
  return PhasedPipeline(segments, seed=seed, sharding=sharding, prefetch=prefetch, window=window)


def exhaustion(segment: Segment) -> dict[str, int]:
  """{key: the first global step of the segment whose batch reads past the end of that source}, for the sources
  the segment reads through."""
  out = {}
  for (key, source, _) in segment.sources:
    if segment.draws(segment.end)[key] <= len(source):
      continue
    lo, hi = segment.start, segment.end  # draws(step + 1) > len at the answer; binary search on the monotone count
    while lo < hi:
      mid = (lo + hi) // 2
      if segment.draws(mid + 1)[key] > len(source):
        hi = mid
      else:
        lo = mid + 1
    out[key] = lo
  return out


class PhasedPipeline(pipeline_lib.Pipeline):
  """The global batches of a run made of segments (`Segment`), read in disjoint shares per process like
  `Pipeline`; iteration starts at step 0 or at the step `set_state` restores."""

  def __init__(self, segments: Sequence[Segment], *, seed: int = 0, sharding=None, prefetch: int = 2,
               process: tuple[int, int] | None = None, window: int = 0):
    if not segments:
      raise errors.ConfigError("a phased stream needs at least one segment")
    self.segments = tuple(segments)
    self._sharding_for_rows, self._process = sharding, process
    self._shuffled: dict = {}
    self._mixes: dict[str, grain.MapDataset] = {}
    for seg in self.segments:
      if not seg.sources or len(seg.batch_sizes) != seg.end - seg.start:
        raise errors.ConfigError(f"segment {seg.name!r}: no sources, or a batch size for other than each of its steps")
      for key, source, _ in seg.sources:
        if len(source) == 0:
          raise errors.DataError(f"source {key}: no examples")
        if key not in self._shuffled:
          self._shuffled[key] = order.shuffled(source, (seed + zlib.crc32(key.encode())) % 2**32, window)
      self._mixes[seg.name] = grain.MapDataset.mix(
          [grain.MapDataset.range(BIG).map(lambda j, i=i: (i, j)) for i in range(len(seg.sources))], seg.weights)
    self._row_cache: dict[int, tuple[int, int]] = {}
    first = self.segments[0]
    super().__init__(first.sources[0][1], first.batch_sizes[0], seed=seed, sharding=sharding, prefetch=prefetch,
                     process=process, shuffle=False)

  @property
  def total_steps(self) -> int:
    return self.segments[-1].end

  def segment_at(self, step: int) -> Segment:
    for seg in self.segments:
      if seg.start <= step < seg.end:
        return seg
    raise errors.DataError(f"step {step} is past the plan's last step {self.total_steps}")

  def _rows_for(self, size: int) -> tuple[int, int]:
    if size not in self._row_cache:
      self._row_cache[size] = pipeline_lib._rows_of_this_process(self._sharding_for_rows, size, self._process)
    return self._row_cache[size]

  def local_batch(self, step: int) -> dict[str, np.ndarray]:
    seg = self.segment_at(step)
    size = seg.batch_sizes[step - seg.start]
    start, stop = self._rows_for(size)
    base = seg.positions_before(step)
    mix = self._mixes[seg.name]
    examples = []
    for row in range(start, stop):
      g = base + row
      i, j = mix[g]
      key, _, _ = seg.sources[i]
      ex = dict(self._shuffled[key][int(seg.offsets.get(key, 0)) + j])
      if seg.transform is not None:
        ex = seg.transform(ex, g, step)
      examples.append(ex)
    batch = pipeline_lib.stack(examples)
    batch.setdefault("next_sentence_weights", np.ones((stop - start,), np.float32))
    return batch

  def __next__(self) -> dict:
    step = self._step
    seg = self.segment_at(step)
    size = seg.batch_sizes[step - seg.start]
    if self._pool is None:
      local = self.local_batch(step)
    else:
      for s in range(step, min(step + self.prefetch + 1, self.total_steps)):
        self._future(s)
      local = self._pending.pop(step).result()
    self._step += 1
    return pipeline_lib.to_global(local, self.sharding, size)

  def get_state(self) -> dict:
    step = self._step
    seg = self.segment_at(min(step, self.total_steps - 1))
    return {"step": step, "seed": self.seed, "phase": seg.name, "source_positions": self.positions(step)}

  def positions(self, step: int) -> dict[str, int]:
    """Every source's position (examples drawn from it so far) before global step `step`."""
    seg = self.segment_at(min(step, self.total_steps - 1))
    return {**seg.offsets, **seg.draws(step)}

  def set_state(self, state: Mapping) -> None:
    if int(state.get("seed", self.seed)) != self.seed:
      raise pipeline_lib.StateMismatchError(f"data iterator state was saved with seed={state['seed']}, this run has "
                                            f"{self.seed}")
    step = int(state["step"])
    if step > self.total_steps:
      raise pipeline_lib.StateMismatchError(f"data iterator state is at step {step}, past this plan's last step "
                                            f"{self.total_steps}: the phases were shortened since the checkpoint")
    saved = state.get("source_positions")
    if saved is not None and dict(saved) != self.positions(step):
      raise pipeline_lib.StateMismatchError(
          f"the checkpoint at step {step} read its sources up to {dict(saved)}, this run's phases put them at "
          f"{self.positions(step)}: the mixture, batch sizes or phases changed since; restore them or use a new "
          "workdir")
    for f in self._pending.values():
      f.cancel()
    self._pending.clear()
    self._step = step
