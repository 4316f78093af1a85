"""Metrics: TensorBoard event files + metrics.jsonl, a console progress line with ETA, MFU, PNG curves.

Only process 0 writes. `python -m bertjax plot WORKDIR` redraws the PNG curves from metrics.jsonl.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

import jax

from bertjax.core import files


def every(step: int, interval: int, last_step: int | None = None) -> bool:
  """The one rule for periodic actions: every `interval` steps, and at the last step."""
  return (interval > 0 and step % interval == 0) or (last_step is not None and step == last_step)


def format_duration(seconds: float) -> str:
  seconds = int(max(0, seconds))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class Writer:
  """Scalars to TensorBoard (tensorboardX) and to metrics.jsonl, from process 0 only.

  A local metrics.jsonl grows by a line per write. On an object store, where an object is written whole, the
  lines are buffered and the object rewritten at each `flush` (the run calls it at every checkpoint, so a resume
  finds every row up to its checkpoint) and at `close`: one request per save, not one per line."""

  def __init__(self, workdir: str, start_step: int | None = None):
    """`start_step`: the step a resumed run continues from; rows logged after it (by the stopped run, past its
    last checkpoint) are dropped, since this run logs those steps again."""
    self.active = jax.process_index() == 0
    self.path = files.join(workdir, "metrics.jsonl")
    self.remote = files.is_remote(workdir)
    self._tb = None
    self._text = None  # a remote metrics.jsonl's whole text; `_unsaved` says whether the object lags behind it
    self._unsaved = False
    if self.active:
      files.makedirs(workdir)
      if self.remote:
        self._text = _without_cut_line(files.read_text(self.path)) if files.exists(self.path) else ""
      else:
        _end_with_newline(self.path)
      if start_step is not None:
        if self.remote:
          kept = _rows_until(self._text, start_step)
          self._unsaved = kept != self._text
          self._text = kept
        else:
          _drop_after(self.path, start_step)
      self._tb_remote = files.join(workdir, "tensorboard") if self.remote else None
      if self.remote:  # event files grow locally and are uploaded whole at each flush
        self._tb_local = tempfile.mkdtemp(prefix="bertjax-tensorboard-")
      self._tb = _summary_writer(self._tb_local if self.remote else files.join(workdir, "tensorboard"))

  def write(self, step: int, scalars: dict, prefix: str = "train") -> None:
    if not self.active:
      return
    clean = {k: float(v) for k, v in scalars.items()}
    for k, v in clean.items():
      self._tb.add_scalar(f"{prefix}/{k}", v, step)
    line = json.dumps({"step": int(step), "split": prefix, **clean}) + "\n"
    if self.remote:
      self._text += line
      self._unsaved = True
    else:
      files.append_text(self.path, line)

  def flush(self):
    if self._tb is not None:
      self._tb.flush()
    if self.active and self.remote:
      if self._unsaved:
        files.write_whole(self.path, self._text)
        self._unsaved = False
      for name in os.listdir(self._tb_local):
        files.copy(os.path.join(self._tb_local, name), files.join(self._tb_remote, name))

  def close(self):
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    self.flush()
    if self.active and self.remote:
      shutil.rmtree(self._tb_local, ignore_errors=True)


def _drop_after(path: str, step: int) -> None:
  """Rewrites metrics.jsonl without the rows past `step` (all of them when the run starts over at 0)."""
  if not files.isfile(path):
    return
  with files.open(path, errors_="replace") as f:
    lines = f.readlines()
  keep = _kept_lines(lines, step)
  if len(keep) != len(lines):
    files.write_whole(path, "".join(keep))


def _rows_until(text: str, step: int) -> str:
  return "".join(_kept_lines(text.splitlines(keepends=True), step))


def _without_cut_line(text: str) -> str:
  """A text ending on a whole line (a cut last line dropped)."""
  return text if not text or text.endswith("\n") else text[:text.rfind("\n") + 1]


def _kept_lines(lines: list[str], step: int) -> list[str]:
  keep = []
  for line in lines:
    try:
      row_step = json.loads(line).get("step", 0)
    except (ValueError, AttributeError):
      continue  # a line cut by a kill
    if step > 0 and row_step <= step:
      keep.append(line)
  return keep


def _summary_writer(logdir: str):
  """tensorboardX's SummaryWriter, imported without PyTorch. Where torch is installed, tensorboardX imports it
  only to accept torch tensors, which this writer never gets (it writes floats); that import costs 2-3 s of
  start-up and about 1 s of interpreter exit on a 2-core CPU. A torch the process already imported is used."""
  hide = "torch" not in sys.modules
  if hide:
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX catches
  try:
    from tensorboardX import SummaryWriter
  finally:
    if hide and sys.modules.get("torch", 0) is None:
      del sys.modules["torch"]
  return SummaryWriter(logdir)


def _end_with_newline(path: str) -> None:
  """A kill can cut the last line short; start the next write on a fresh line so only that one is lost."""
  if files.exists(path) and files.size(path) > 0:
    with files.open(path, "rb+") as f:
      f.seek(-1, os.SEEK_END)
      if f.read(1) != b"\n":
        f.write(b"\n")


class Progress:
  """A console line per log interval: step, losses, lr, tokens/s, MFU, ETA (process 0 only)."""

  def __init__(self, total_steps: int, start_step: int):
    self.total, self.start = total_steps, start_step
    self.t0 = time.time()

  def line(self, step: int, m: dict) -> str:
    done = max(step - self.start, 1)
    elapsed = time.time() - self.t0
    eta = elapsed / done * (self.total - step)
    parts = [f"step {step}/{self.total}", f"loss {m['loss']:.4f}",
             f"mlm {m['mlm_loss']:.3f} acc {m['mlm_accuracy']:.3f}"]
    if "nsp_loss" in m:
      parts.append(f"nsp {m['nsp_loss']:.3f} acc {m['nsp_accuracy']:.3f}")
    parts += [f"lr {m['learning_rate']:.2e}", f"{m['tokens_per_s']:.0f} tok/s", f"MFU {100 * m['mfu']:.1f}%",
              f"ETA {format_duration(eta)}"]
    return " | ".join(parts)

  def log(self, step: int, m: dict) -> None:
    if jax.process_index() == 0:
      print(self.line(step, m), flush=True)


def read_jsonl(path: str) -> list[dict]:
  rows = []
  if not files.exists(path):
    return rows
  with files.open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        continue  # a line cut by a kill
  return rows


def plot(workdir: str) -> list[str]:
  """PNG curves (loss, MLM accuracy, NSP accuracy; train and eval) from WORKDIR/metrics.jsonl."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = read_jsonl(files.join(workdir, "metrics.jsonl"))
  if not rows:
    raise FileNotFoundError(f"{workdir}: no metrics.jsonl to plot")
  # A resumed run rewrites steps; keep the last value written for each (split, step).
  latest = {}
  for r in rows:
    latest[(r["split"], r["step"])] = r
  written = []
  for key, title in (("loss", "loss (MLM + NSP)"), ("mlm_accuracy", "masked-LM accuracy"),
                     ("nsp_accuracy", "next-sentence accuracy")):
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for split in ("train", "eval"):
      pts = sorted((s, r[key]) for (sp, s), r in latest.items() if sp == split and key in r)
      if pts:
        ax.plot(*zip(*pts), marker="o" if split == "eval" else None, label=split)
        drawn = True
    if drawn:
      ax.set_xlabel("step")
      ax.set_title(title)
      ax.grid(alpha=0.3)
      ax.legend()
      path = files.join(workdir, f"{key}.png")
      with files.local_target(path) as local:
        fig.savefig(local, dpi=100, bbox_inches="tight")
      written.append(path)
    plt.close(fig)
  return written
