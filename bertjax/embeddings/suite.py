"""BEIR evaluation over several folders in one run, as sentence-transformers' NanoBEIREvaluator reports it: each
set's nDCG@10, MRR@10, Recall@100 and MAP (exact search, trec_eval's measures, as `embeddings beir` gives them) and
their unweighted mean over the sets, the primary metric named `NanoBEIR_mean_{cosine|dot|maxsim}_ndcg@10`.

    python -m bertjax embeddings suite --model M scifact/ nfcorpus/ arguana/ --out report.json

With a report file the run is resumable: each finished set is written into it as it finishes, and a rerun skips
the sets already there when the report was written by the same model (its weights' fingerprint) with the same
settings; a report of another model or other settings is refused unless `overwrite`.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, Sequence

import jax
import numpy as np

from bertjax import errors
from bertjax.core import files
from bertjax.embeddings import kinds, retrieval

SUITE_METRICS = ("ndcg@10", "mrr@10", "recall@100", "map")
_FORMAT = "bertjax beir suite 1"


class SuiteError(errors.DataError):
  pass


# The options a report records: a rerun resumes a report of the same settings (block and batch size change no score).
SETTINGS = ("split", "top_k", "score", "query_prefix", "doc_prefix", "max_active_dims")


def fingerprint(model, kind: str) -> str:
  """A digest of what decides the model's vectors: its weights and settings (prompts included)."""
  if kind == "multivector":
    h = hashlib.sha256(repr((model.cfg, model.settings)).encode())
    for leaf in jax.tree_util.tree_leaves(model.params):
      h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()
  prompts = getattr(model, "prompts", None)
  return hashlib.sha256(f"{model.fingerprint}|{prompts!r}".encode()).hexdigest()


def score_name(kind: str, score: str) -> str:
  """The score function's name in sentence-transformers' metric keys."""
  return "maxsim" if kind == "multivector" else {"cos": "cosine", "dot": "dot"}[score]


def set_key(folder: str) -> str:
  """A folder's key in the report: its path without a trailing slash (normalised when local)."""
  return folder.rstrip("/") if files.is_remote(folder) else os.path.normpath(folder)


def check_folders(folders: Sequence[str], split: str) -> list[str]:
  """The keys of the sets, each a BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv), none twice; else
  one line naming the folder. Only the files' presence: their content is checked as each set is read."""
  if not folders:
    raise SuiteError("embeddings suite: give one or more BEIR folders")
  keys: dict[str, str] = {}
  for folder in folders:
    key = set_key(folder)
    if key in keys:
      raise SuiteError(f"embeddings suite: {folder} is given twice")
    keys[key] = folder
    if not files.isdir(folder):
      raise SuiteError(f"embeddings suite: {folder}: no such folder")
    missing = [n for n in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv")
               if not files.isfile(files.join(folder, *n.split("/")))]
    if missing:
      raise SuiteError(f"embeddings suite: {folder} is not a BEIR folder (no {', '.join(missing)})")
  return list(keys)


def read_report(path: str) -> dict | None:
  """A report an earlier suite run wrote, or None when `path` does not exist; any other file is one line."""
  if not path or not files.exists(path):
    return None
  if files.isdir(path):
    raise SuiteError(f"--out {path}: a folder, not a report file")
  try:
    report = files.read_json(path)
  except (OSError, ValueError, UnicodeDecodeError):
    report = None
  if not isinstance(report, dict) or report.get("format") != _FORMAT:
    raise SuiteError(f"--out {path}: exists and is not a report this command wrote; pass --overwrite to replace "
                     "it, or choose another path")
  return report


def check_report(path: str, overwrite: bool) -> None:
  """Before the model loads: a --out that is not a suite report is refused (unless `overwrite`)."""
  if path and not overwrite:
    read_report(path)


def aggregate(sets: dict[str, dict], kind: str, score: str) -> dict:
  """NanoBEIREvaluator's aggregate: each metric's unweighted mean over the sets, and its primary metric
  `NanoBEIR_mean_{score}_ndcg@10`."""
  mean = {m: float(np.mean([r[m] for r in sets.values()])) for m in SUITE_METRICS}
  primary = f"NanoBEIR_mean_{score_name(kind, score)}_ndcg@10"
  return {"mean": mean, "primary_metric": primary, primary: mean["ndcg@10"]}


def run(model, kind: str, model_path: str, folders: Sequence[str], opts: retrieval.Options, out: str = "",
        overwrite: bool = False, log: Callable[..., None] = print) -> dict:
  """Evaluates every set in turn, each as the single-folder `kinds.beir_scores` does; with `out`, each finished
  set goes into the report at once and the sets a matching report already holds are skipped. Returns the
  report."""
  opts = kinds.settle(kind, opts)
  keys = check_folders(folders, opts.split)
  settings = {**{k: getattr(opts, k) for k in SETTINGS}, "kind": kind}
  fp = fingerprint(model, kind)
  old = read_report(out) if out and not overwrite else None
  if old is not None and (old.get("fingerprint") != fp or old.get("settings") != settings):
    what = "of another model" if old.get("fingerprint") != fp else "made with other settings"
    raise SuiteError(f"--out {out}: a report {what} ({old.get('model')!r}); pass --overwrite to replace it, or "
                     "choose another --out")
  done = dict(old["sets"]) if old else {}
  report = {"format": _FORMAT, "model": model_path, "fingerprint": fp, "settings": settings, "sets": done}
  for n, (key, folder) in enumerate(zip(keys, folders), 1):
    if key in done:
      log(f"[{n}/{len(keys)}] {key}: in {out} already, skipped", flush=True)
      continue
    done[key] = kinds.beir_scores(model, kind, retrieval.read_beir(folder, opts.split), opts)
    log(f"[{n}/{len(keys)}] {key}: nDCG@10 {done[key]['ndcg@10']:.4f}", flush=True)
    if out:
      files.write_whole(out, json.dumps(report, indent=1))
  sets = {k: done[k] for k in keys}
  report = {**report, "sets": done, **aggregate(sets, kind, opts.score), "suite": keys}
  if out:
    files.write_whole(out, json.dumps(report, indent=1))
  return report


def table(report: dict) -> str:
  """The per-set table and the mean row, as text."""
  keys = report["suite"]
  width = max(len("mean"), *(len(k) for k in keys))
  head = f"{'set':<{width}}  {'nDCG@10':>8}  {'MRR@10':>8}  {'R@100':>8}  {'queries':>7}  {'docs':>8}"
  lines = [head, "-" * len(head)]
  for k in keys:
    r = report["sets"][k]
    lines.append(f"{k:<{width}}  {r['ndcg@10']:8.4f}  {r['mrr@10']:8.4f}  {r['recall@100']:8.4f}  "
                 f"{r['queries']:7d}  {r['documents']:8d}")
  m = report["mean"]
  lines.append(f"{'mean':<{width}}  {m['ndcg@10']:8.4f}  {m['mrr@10']:8.4f}  {m['recall@100']:8.4f}")
  lines.append(f"{report['primary_metric']}: {report[report['primary_metric']]:.4f} over {len(keys)} sets")
  return "\n".join(lines)
