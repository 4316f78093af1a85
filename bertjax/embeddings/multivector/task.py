"""Multi-vector encoder training (`task=multivector`): ColBERT-style late interaction on (anchor, positive[, hard
negatives...]) rows, the columns and files of `task=pairs`. The loss is sentence-transformers' multi-vector
MultipleNegativesRankingLoss: InfoNCE on MaxSim scores (`multivector.scale`, 1) with every document of the whole
global batch as a candidate. Evaluated as retrieval over the eval file's texts by MaxSim (nDCG@10, MRR@10,
Recall@1/10); exported as a sentence-transformers MultiVectorEncoder folder.
"""
from __future__ import annotations

import dataclasses
import json
import os
import string

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from bertjax import convert, errors
from bertjax.convert import weights as weights_lib
from bertjax.convert.table import host_params
from bertjax.core import files
from bertjax.data import packing
from bertjax.embeddings import distill, losses
from bertjax.embeddings.dense.task import Contrastive, read_pairs, retrieval, train_pairs
from bertjax.embeddings.model import normalize
from bertjax.embeddings.multivector import encoder as multivector
from bertjax.model.config import BertConfig
from bertjax.model.encoder import BertModel
from bertjax.model.layers import Dense
from bertjax.tasks.base import EvalSet, Task

NAMES = ("multivector",)
METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@10")


def settings_of(config) -> multivector.Settings:
  """The run's Settings: a MultiVectorEncoder init's own (a folder's or a task=multivector workdir's), else the
  config's `multivector` section."""
  if config.init and multivector.is_model(config.init):
    return multivector.model_settings(config.init)[0]
  m = config.multivector
  if m.dim < 1 or m.scale <= 0 or m.query_length < 0 or m.document_length < 0:
    raise errors.ConfigError(f"multivector.dim {m.dim}, scale {m.scale} must be > 0 and query_length "
                             f"{m.query_length}, document_length {m.document_length} >= 0")
  expansion = ("fixed", bool(m.attend_to_expansion), None, int(m.query_length)) if m.query_expansion else None
  if expansion and not m.query_length:
    raise errors.ConfigError("multivector.query_expansion pads queries to multivector.query_length: set it")
  return multivector.Settings(config.data.max_seq_length, m.query_length or None, m.document_length or None,
                              expansion, m.query_prompt, m.document_prompt,
                              tuple(string.punctuation) if m.skip_punctuation else ())


def task(name, labels, regression, config) -> Task | None:
  del labels
  if name != "multivector":
    return None
  if regression:
    raise errors.ConfigError("task multivector trains on (anchor, positive[, negatives]) rows; data.regression "
                             "is task pairs'")
  options = ()
  if config is not None:
    s = settings_of(config)
    dim = (multivector.model_settings(config.init)[1] if config.init and multivector.is_model(config.init)
           else int(config.multivector.dim))
    options = (("settings", json.dumps(dataclasses.asdict(s))), ("dim", dim),
               ("scale", float(config.multivector.scale))) + distill.options(
                   "multivector", config.multivector.loss, config.multivector.temperature)
  return Task(name, "multivector", ("text_a", "text_b"), (), METRICS, "ndcg@10", options=options)


def _settings(task: Task) -> multivector.Settings:
  return multivector.settings_from_json(task.option("settings"))


class LateInteractionModel(nn.Module):
  """{"embedding": [B, L, dim]} unit token vectors of the queries; with `doc_input_ids` [B, K, L] also
  {"doc_embedding": [B, K, L, dim]}: the encoder, a projection without bias, L2 normalisation."""
  cfg: BertConfig
  dim: int = 128
  unit: bool = True

  def setup(self):
    self.bert = BertModel(self.cfg)
    self.dense = Dense((self.dim,), ("embed", "mlp"), self.cfg.replace(dtype="float32"), use_bias=False)

  def tokens(self, batch, deterministic: bool):
    hidden = self.bert(batch, deterministic, pool=False)["hidden"].astype(jnp.float32)
    x = self.dense(hidden)
    return normalize(x) if self.unit else x

  def packed(self, batch, deterministic: bool):
    """Packed rows (`pack`): every text of a row's examples laid end to end, each its own attention segment;
    each slot's texts' token vectors gathered back from their first positions (`text_starts` [B, k, 1 + K]) to
    the widths of the slot's score masks, [B, k, Lq, dim] and [B, k, K, Ld, dim]."""
    keys = ("input_ids", "input_mask", "segment_ids", "position_ids", "attention_segment_ids")
    x = self.tokens({n: batch[n] for n in keys}, deterministic)
    b, row = batch["input_ids"].shape
    lq, ld = batch["slot_score_mask"].shape[-1], batch["slot_doc_score_mask"].shape[-1]
    starts = batch["text_starts"]

    def gather(first, width):  # [B, ...] first positions -> [B, ..., width, dim]
      at = jnp.minimum(first[..., None] + jnp.arange(width, dtype=first.dtype), row - 1)
      got = jnp.take_along_axis(x, at.reshape(b, -1)[..., None], axis=1)
      return got.reshape(at.shape + (x.shape[-1],))
    return {"embedding": gather(starts[:, :, 0], lq), "doc_embedding": gather(starts[:, :, 1:], ld)}

  def __call__(self, batch, deterministic: bool = True):
    if "text_starts" in batch:
      return self.packed(batch, deterministic)
    # A query's expansion positions are in input_mask (its length, for batching) but not attended to
    # (`attend_mask`) unless the settings say so.
    q = {"input_ids": batch["input_ids"], "input_mask": batch.get("attend_mask", batch["input_mask"]),
         "segment_ids": batch["segment_ids"]}
    out = {"embedding": self.tokens(q, deterministic)}
    if "doc_input_ids" in batch:
      b, k, length = batch["doc_input_ids"].shape
      docs = {"input_ids": batch["doc_input_ids"].reshape(b * k, length),
              "input_mask": batch["doc_input_mask"].reshape(b * k, length),
              "segment_ids": jnp.zeros((b * k, length), jnp.int32)}
      out["doc_embedding"] = self.tokens(docs, deterministic).reshape(b, k, length, -1)
    return out


def maxsim_scores(q, q_score, docs, d_score):
  """[B, N] MaxSim of queries [B, Lq, d] (scored positions `q_score` [B, Lq]) against documents [N, Ld, d]."""
  s = jnp.einsum("bid,njd->bnij", q, docs)
  best = jnp.max(jnp.where(d_score[None, :, None, :] > 0, s, -1e9), axis=-1)
  return jnp.sum(jnp.where(q_score[:, None, :] > 0, best, 0.0), axis=-1)


def pairwise_maxsim(q, q_score, docs, d_score):
  """[B, K] MaxSim of each query [B, Lq, d] with its own documents [B, K, Ld, d] (score masks [B, Lq], [B, K, Ld])."""
  s = jnp.einsum("bid,bkjd->bkij", q, docs)
  best = jnp.max(jnp.where(d_score[:, :, None, :] > 0, s, -1e9), axis=-1)
  return jnp.sum(jnp.where(q_score[:, None, :] > 0, best, 0.0), axis=-1)


def featurize(rows: list[dict], tok, settings: multivector.Settings, full: bool = False) -> dict:
  """Queries and documents as the encoder reads them: ids, attention masks, and the positions MaxSim scores
  (`*score_mask`: real and expansion tokens, less the skiplist's on its tasks). Texts are padded to the widest of
  `rows`, or with `full` to the most a text of its side can have (one shape for every batch of a streamed file)."""
  skip = multivector.skip_ids(tok, settings)

  def encode(texts, side):
    got = multivector.text_rows(tok, settings, texts, side)
    width = multivector.side_length(settings, side) if full else max(len(r[0]) for r in got)
    ids = np.full((len(got), width), tok.pad_id, np.int32)
    length, attend, score = np.zeros_like(ids), np.zeros_like(ids), np.zeros_like(ids)
    for i, (row, attended, kept) in enumerate(got):
      ids[i, :len(row)], length[i, :len(row)], attend[i, :attended] = row, 1, 1
      drop = skip if side in settings.skiplist_tasks else frozenset()
      score[i, :kept] = [t not in drop for t in row[:kept]]
    return ids, length, attend, score
  k = len(rows[0]["docs"])
  q_ids, q_len, q_attend, q_score = encode([r["anchor"] for r in rows], "query")
  d_ids, _, d_mask, d_score = encode([d for r in rows for d in r["docs"]], "document")
  shape = (len(rows), k, d_ids.shape[1])
  return {"input_ids": q_ids, "input_mask": q_len, "attend_mask": q_attend, "segment_ids": np.zeros_like(q_ids),
          "score_mask": q_score,
          "doc_input_ids": d_ids.reshape(shape), "doc_input_mask": d_mask.reshape(shape),
          "doc_score_mask": d_score.reshape(shape), "labels": np.zeros((len(rows),), np.float32)}


def pack(feats: dict, text_length: int, max_per_row: int) -> tuple[dict, list[list[int]]]:
  """Examples packed as `packing.pack_contrastive` packs pairs (an example's query and documents together, each
  text its own attention segment), in rows of max(text_length, the widest query + K·the widest document) tokens:
  a query expanded to a fixed length plus one document fills little more than `text_length`, and a row much
  longer than its examples spends its attention on pairs the mask discards. The attention
  mask is each text's `attend_mask` (a query's expansion tokens are scored, not attended to). Per slot: each
  text's first position (`text_starts`) and score masks (`slot_score_mask`, `slot_doc_score_mask`)."""
  n, n_docs, d_len = feats["doc_input_ids"].shape
  q_len = feats["input_ids"].shape[1]
  width = max(q_len, d_len)
  widen = lambda x: np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])  # noqa: E731
  texts = {name: widen(feats[name]) for name in ("input_ids", "input_mask", "doc_input_ids", "doc_input_mask")}
  out, rows = packing.pack_contrastive({**texts, "attend_mask": widen(feats["attend_mask"]), "labels": feats["labels"],
                                        "query_keys": np.zeros(n, np.int32),
                                        "doc_keys": np.zeros((n, n_docs), np.int32)},
                                       max(text_length, q_len + n_docs * d_len), max_per_row, starts=True)
  del out["query_keys"], out["doc_keys"]
  k = out["text_segments"].shape[1]
  out["slot_score_mask"] = np.zeros((len(rows), k, q_len), np.int32)
  out["slot_doc_score_mask"] = np.zeros((len(rows), k, n_docs, d_len), np.int32)
  for i, members in enumerate(rows):
    out["slot_score_mask"][i, :len(members)] = feats["score_mask"][members]
    out["slot_doc_score_mask"][i, :len(members)] = feats["doc_score_mask"][members]
  # Slots no row fills are cut: MaxSim compares every slot of a step with every other, empty ones included.
  used = max(len(m) for m in rows)
  slotted = ("text_segments", "cls_positions", "example_slot_weights", "labels", "text_starts", "slot_score_mask",
             "slot_doc_score_mask")
  return {name: (v[:, :used] if name in slotted else v) for name, v in out.items()}, rows


class MultiVector(Contrastive):
  name = "multivector"
  hf_head = "encoder"
  outputs = ("embedding", "doc_embedding")
  pack_keys = {}  # each text's token vectors are gathered back from the packed row

  def can_pack(self, task):
    return not task.option("loss")  # a teacher's scores go with unpacked rows

  def pack(self, feats, row_length, max_per_row):
    return pack(feats, row_length, max_per_row)

  def weights(self, task, path, overrides):
    """A MultiVectorEncoder folder's or task=multivector workdir's encoder and projection, or any encoder (the
    projection starts fresh)."""
    if not multivector.is_model(path):
      return super().weights(task, path, overrides)
    enc = multivector.MultiVectorEncoder.load(path, **overrides)
    lower = True if multivector.is_folder(path) else weights_lib.finetune_meta(path)["do_lower_case"]
    return enc.cfg, {"bert": enc.params["bert"], "dense": {"kernel": enc.params["dense"]["kernel"]}}, \
        enc.tok.path, lower

  def head(self, task, cfg):
    return LateInteractionModel(cfg, int(task.option("dim", 128)), _settings(task).normalize if task.options else True)

  def load(self, task, config, tok):
    d = config.data
    negatives = tuple(c for c in config.embedding.negative_columns if c)
    s = _settings(task)
    feats, _ = train_pairs(d.train_file, d.text_a_column, d.text_b_column, negatives, "",
                           lambda rows: featurize(rows, tok, s), lambda rows: featurize(rows, tok, s, full=True))
    evals = []
    if d.eval_file:
      rows = read_pairs(d.eval_file, d.text_a_column, d.text_b_column, negatives)
      evals.append(EvalSet("validation", featurize(rows, tok, s), {"rows": rows}))
    if task.option("loss"):
      feats = distill.attach(feats, task.option("loss"), "multivector", d)
    return feats, evals, {"hard negatives per row": len(negatives)}

  def loss(self, task, out, batch):
    q, d = out["embedding"], out["doc_embedding"]
    w, q_score, d_score = batch["example_weights"], batch.get("score_mask"), batch.get("doc_score_mask")
    if "text_starts" in batch:  # packed rows: [rows, slots, ...] -> one example per slot (empty slots weighted 0)
      q, d, w = q.reshape((-1,) + q.shape[2:]), d.reshape((-1,) + d.shape[2:]), w.reshape(-1)
      q_score = batch["slot_score_mask"].reshape((-1,) + q.shape[1:2])
      d_score = batch["slot_doc_score_mask"].reshape((-1,) + d.shape[1:3])
    b, k = d.shape[:2]
    if task.option("loss"):  # MultiVectorMarginMSELoss / MultiVectorDistillKLDivLoss on each row's own documents
      return distill.loss(task.option("loss"), pairwise_maxsim(q, q_score, d, d_score), batch["teacher_scores"],
                          task.option("temperature", 1.0), w)
    docs = d.transpose(1, 0, 2, 3).reshape((b * k,) + d.shape[2:])  # positives first, then each negatives block
    d_score = d_score.transpose(1, 0, 2).reshape(b * k, -1)
    scores = task.option("scale", 1.0) * maxsim_scores(q, q_score, docs, d_score)
    keep = jnp.tile(w, k)[None, :] > 0
    per_row = losses._info_nce(scores, keep, w)
    return jnp.sum(per_row * w) / jnp.maximum(jnp.sum(w), 1.0)

  def score(self, task, ev, preds, config):
    rows, feats = ev.meta["rows"], ev.feats
    q = [preds["embedding"][i][feats["score_mask"][i] > 0] for i in range(len(rows))]
    corpus = {}
    for r, row in enumerate(rows):
      for j, text in enumerate(row["docs"]):
        corpus.setdefault(text, preds["doc_embedding"][r, j][feats["doc_score_mask"][r, j] > 0])
    texts = list(corpus)
    sims = np.array([[multivector.maxsim(v, corpus[t]) for t in texts] for v in q])
    run = {f"q{i}": {f"d{j}": float(x) for j, x in enumerate(row)} for i, row in enumerate(sims)}
    qrels = {f"q{i}": {f"d{texts.index(row['docs'][0])}": 1} for i, row in enumerate(rows)}
    return retrieval.evaluate_run(run, qrels, METRICS)

  def export(self, task, module, params, out, meta):
    """A sentence-transformers MultiVectorEncoder folder (the tokenizer files are the caller's)."""
    write_folder(module.cfg, params, out, _settings(task))
    return "MultiVectorEncoder"

  def predict_text(self, task, module, params, tok, seq, text="", **_):
    f = featurize([{"anchor": text, "docs": [text]}], tok, _settings(task))
    out = module.apply({"params": params}, {k: f[k] for k in ("input_ids", "input_mask", "attend_mask",
                                                              "segment_ids")})
    v = np.asarray(out["embedding"][0])[f["score_mask"][0] > 0]
    return {"query_vectors": v.round(6).tolist()}


def write_folder(cfg: BertConfig, params, out: str, s: multivector.Settings) -> None:
  """Transformer (the encoder as the family's HF model), 1_Dense, 2_MultiVectorMask, 3_Normalize and the
  configs sentence-transformers' MultiVectorEncoder reads. A gs:// or s3:// `out` is written locally and uploaded
  when complete (`files.local_target`)."""
  params = host_params(params)
  with files.local_target(out) as local:
    _write_folder(cfg, params, local, s)


def _write_folder(cfg: BertConfig, params, out: str, s: multivector.Settings) -> None:
  convert.to_hf(cfg, params["bert"], out, head="encoder")
  kernel = np.asarray(params["dense"]["kernel"], np.float32)
  for sub in ("1_Dense", "2_MultiVectorMask", "3_Normalize"):
    files.makedirs(os.path.join(out, sub))
  save_file({"linear.weight": np.ascontiguousarray(kernel.T)}, os.path.join(out, "1_Dense", "model.safetensors"))
  base = "sentence_transformers."
  stack = [("", "base.modules.transformer.Transformer"), ("1_Dense", "base.modules.dense.Dense"),
           ("2_MultiVectorMask", "multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask"),
           ("3_Normalize", "base.modules.normalize.Normalize")]
  exp = s.expansion
  documents = {
      "modules.json": [{"idx": i, "name": str(i), "path": p, "type": base + t} for i, (p, t) in enumerate(stack)],
      "sentence_bert_config.json": {
          "max_seq_length": s.max_seq_length, "do_lower_case": False, "transformer_task": "feature-extraction",
          "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
          "module_output_name": "token_embeddings", "query_length": s.query_length,
          "document_length": s.document_length,
          "query_expansion": ({"strategy": exp[0], "attend": exp[1], "token": exp[2], "length": exp[3]}
                              if exp else None)},
      "config_sentence_transformers.json": {"model_type": "MultiVectorEncoder", "default_prompt_name": None,
                                            "prompts": {"query": s.query_prompt, "document": s.document_prompt},
                                            "similarity_fn_name": s.similarity},
      "1_Dense/config.json": {"in_features": int(kernel.shape[0]), "out_features": int(kernel.shape[1]),
                              "bias": False, "activation_function": "torch.nn.modules.linear.Identity",
                              "module_input_name": "token_embeddings", "module_output_name": "token_embeddings"},
      "2_MultiVectorMask/config.json": {"skiplist_words": list(s.skiplist), "skiplist_tasks": list(s.skiplist_tasks),
                                        "keep_only_token_ids": None},
      "3_Normalize/config.json": {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}}
  for name, content in documents.items():
    with files.open(os.path.join(out, name), "w") as f:
      json.dump(content, f, indent=2)


KINDS = {"multivector": MultiVector()}
