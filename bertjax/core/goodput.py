"""Goodput: the share of a job's wall clock that went into training steps that count, as ml-goodput-measurement
(the library MaxText reports with) defines it: goodput = productive step time / total elapsed job time.

The rest is badput, by cause:
- `startup`: from the process's start to the first step (imports, devices, data, building and initialising the
  state), less what is counted below;
- `compile`: the first step of each loop (tracing and compiling the step, or loading it from the cache);
- `data_wait`: the loop waiting for its next batch;
- `checkpoint_save`, `checkpoint_restore`: the time the loop is held by a save (and the final wait for an
  asynchronous one), and resuming from the workdir's checkpoint;
- `evaluation`: held-out evaluation inside the run;
- `preemption`: steps computed and then lost (a later attempt resumed below the step this one reached, so they
  ran again) and the gap between a killed or preempted attempt's last record and the next attempt's start;
- `other`: what is left (logging, host work between steps, shutdown).

Every attempt (a process running the run) keeps one cumulative record in WORKDIR/goodput.jsonl, rewritten at its
log points (a local workdir), checkpoints and end; the file holds each earlier attempt's last record, so the totals
and the lost time are computed across restarts (`summarise`). Only process 0 writes.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Callable

import jax

from bertjax.core import files, writers

FILE = "goodput.jsonl"
TIMED = ("startup", "compile", "productive", "data_wait", "checkpoint_save", "checkpoint_restore", "evaluation")
BADPUT = ("startup", "compile", "data_wait", "checkpoint_save", "checkpoint_restore", "evaluation", "preemption",
          "other")
RESTART_AFTER = (None, "SIGTERM")  # an attempt killed without a record of its end, or preempted with a notice


def process_start() -> float | None:
  """This process's start as a Unix time (Linux's /proc), or None where it cannot be read."""
  try:
    with open("/proc/self/stat", encoding="ascii") as f:
      ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks since boot
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
  except (OSError, ValueError, IndexError, AttributeError):
    return None


def read(workdir: str) -> list[dict]:
  """The last record of each attempt in WORKDIR/goodput.jsonl, in the order they started."""
  path = files.join(workdir, FILE)
  if not files.exists(path):
    return []
  last = {}
  for line in files.read_text(path).splitlines():
    try:
      r = json.loads(line)
      last[r["attempt"]] = r
    except (ValueError, KeyError, TypeError):
      continue  # a line cut by a kill
  return sorted(last.values(), key=lambda r: r["start_time"])


class Recorder:
  """The clock of one attempt: what its loop and skeleton spend, by category, and the steps it reached and saved.

  `workdir=None` keeps the clock without writing anything (a loop run outside a workdir)."""

  def __init__(self, workdir: str | None, started: float | None = None, now: Callable[[], float] = time.time):
    self.now = now
    self.workdir = workdir
    self.active = workdir is not None and jax.process_index() == 0
    self.remote = workdir is not None and files.is_remote(workdir)
    self.writer = None  # set by the run: the goodput row of each log point goes to its metrics
    self.prior = read(workdir) if self.active else []
    t = now() if started is None else started
    self.record = {"attempt": max([r["attempt"] for r in self.prior], default=0) + 1, "start_time": t, "time": t,
                   "start_step": None, "step": None, "saved_step": None, "productive_at_save_s": 0.0,
                   **{f"{k}_s": 0.0 for k in TIMED}, "ended": None}

  def add(self, category: str, seconds: float) -> None:
    self.record[f"{category}_s"] += max(seconds, 0.0)

  @contextlib.contextmanager
  def timing(self, category: str):
    t = self.now()
    try:
      yield
    finally:
      self.add(category, self.now() - t)

  def began(self, step: int) -> None:
    """The loop's first step is next: what the attempt spent so far and counted nowhere else is start-up."""
    if self.record["start_step"] is not None:
      return  # a later phase's loop
    r = self.record
    r["start_step"] = r["step"] = step
    counted = sum(r[f"{k}_s"] for k in TIMED if k != "startup")
    r["startup_s"] = max(self.now() - r["start_time"] - counted, 0.0)

  def stepped(self, step: int, seconds: float, first: bool) -> None:
    """Step `step` took `seconds` of the loop (its batch's wait apart); the first of a loop compiles."""
    self.add("compile" if first else "productive", seconds)
    self.record["step"] = step

  def saved(self, step: int) -> None:
    r = self.record
    r["saved_step"], r["productive_at_save_s"] = step, r["productive_s"]
    self.flush()

  def logged(self, step: int) -> None:
    """A log point: the job's goodput so far into the metrics (TensorBoard's goodput/ scalars), and the record
    rewritten where that is one local write."""
    if self.writer is not None:
      self.writer.write(step, scalars(self.summary()), "goodput")
    if not self.remote:
      self.flush()

  def close(self, stopped: str | None) -> dict:
    """The attempt's end (`stopped`: the stop's reason, None when the run finished); returns `summary()`."""
    self.record["ended"] = stopped or "finished"
    self.flush()
    return self.summary()

  def summary(self) -> dict:
    """`summarise` over the earlier attempts and this one, up to now."""
    self.record["time"] = self.now()
    return summarise([*self.prior, self.record])

  def flush(self) -> None:
    self.record["time"] = self.now()
    if self.active:
      text = "".join(json.dumps(r) + "\n" for r in [*self.prior, self.record])
      files.write_whole(files.join(self.workdir, FILE), text)


def summarise(records: list[dict]) -> dict:
  """The job's goodput over the attempts' last records (in the order they started).

  An attempt that reached step s, followed by one that started at step r < s, lost steps r+1..s: their productive
  time is badput (`preemption`), the time it had at its checkpoint r subtracted from its total where r is its
  checkpoint, else its mean step time. The gap from a killed or SIGTERM-preempted attempt's last record to the
  next start is `preemption` too; after a deliberate stop (stop_after_steps, SIGINT) or a finished run, the time
  until the next attempt is no part of the job. Returns elapsed_s, productive_s, goodput, badput {category: s},
  fractions {productive and each badput: share of elapsed}, lost_steps, lost_progress_s, restart_gap_s,
  attempts."""
  timed = {k: 0.0 for k in TIMED}
  elapsed = lost_s = gap_s = 0.0
  lost_steps = 0
  for i, r in enumerate(records):
    elapsed += max(r["time"] - r["start_time"], 0.0)
    for k in TIMED:
      timed[k] += r[f"{k}_s"]
    if i + 1 == len(records):
      continue
    nxt = records[i + 1]
    if r["ended"] in RESTART_AFTER:
      gap_s += max(nxt["start_time"] - r["time"], 0.0)
    resumed = nxt["start_step"]
    if r["step"] is None or resumed is None or r["step"] <= resumed:
      continue
    n = r["step"] - max(resumed, r["start_step"])
    lost_steps += n
    if resumed == r["saved_step"]:
      lost_s += r["productive_s"] - r["productive_at_save_s"]
    else:
      lost_s += r["productive_s"] * n / max(r["step"] - r["start_step"], 1)
  elapsed += gap_s
  productive = timed["productive"] - lost_s
  badput = {k: timed[k] for k in BADPUT if k in timed}
  badput["preemption"] = lost_s + gap_s
  badput["other"] = max(elapsed - gap_s - sum(timed.values()), 0.0)
  total = productive + sum(badput.values())
  fractions = {k: v / total if total > 0 else 0.0 for k, v in {"productive": productive, **badput}.items()}
  return {"elapsed_s": total, "productive_s": productive, "goodput": fractions["productive"], "badput": badput,
          "fractions": fractions, "lost_steps": lost_steps, "lost_progress_s": lost_s, "restart_gap_s": gap_s,
          "attempts": len(records)}


def scalars(s: dict) -> dict:
  """A summary's metrics row: goodput, elapsed_s, lost_steps and each badput's share (badput_NAME)."""
  return {"goodput": s["goodput"], "elapsed_s": s["elapsed_s"], "lost_steps": s["lost_steps"],
          **{f"badput_{k}": s["fractions"][k] for k in BADPUT}}


def largest_badput(s: dict) -> tuple[str, float]:
  """(category, share of elapsed) of the largest badput."""
  k = max(BADPUT, key=lambda c: s["badput"][c])
  return k, s["fractions"][k]


def line(s: dict) -> str:
  """'goodput 71.3% of 0m42s over 2 attempts (largest badput: compile 18.0%; 3 steps lost)'."""
  name, share = largest_badput(s)
  lost = f"; {s['lost_steps']} steps lost" if s["lost_steps"] else ""
  attempts = f" over {s['attempts']} attempts" if s["attempts"] > 1 else ""
  return (f"goodput {100 * s['goodput']:.1f}% of {writers.format_duration(s['elapsed_s'])}{attempts} "
          f"(largest badput: {name} {100 * share:.1f}%{lost})")


def plot(workdir: str) -> list[str]:
  """WORKDIR/goodput.png: the job's elapsed time split into productive steps and each badput, one bar per
  attempt and one for the job; nothing where the workdir has no goodput.jsonl."""
  records = read(workdir)
  if not records:
    return []
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  # Each attempt alone (its own time, no lost steps), then the job with the lost steps and restart gaps.
  bars = [(f"attempt {r['attempt']}", summarise([r])) for r in records] + [("job", summarise(records))]
  fig, ax = plt.subplots(figsize=(7, 1.2 + 0.4 * len(bars)))
  for y, (_, s) in enumerate(bars):
    left = 0.0
    for i, k in enumerate(("productive", *BADPUT)):
      v = s["productive_s"] if k == "productive" else s["badput"][k]
      ax.barh(y, v, left=left, color=f"C{i}", label=k if y == 0 else None)
      left += v
  ax.set_yticks(range(len(bars)), [name for name, _ in bars])
  ax.invert_yaxis()  # the first attempt on top, the job at the bottom
  ax.set_xlabel("seconds")
  ax.set_title(line(bars[-1][1]))
  ax.legend(fontsize="small", ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.3))
  path = files.join(workdir, "goodput.png")
  with files.local_target(path) as local:
    fig.savefig(local, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return [path]
