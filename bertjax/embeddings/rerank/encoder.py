"""Cross-encoder rerankers: a sequence-classification model of any family reads a (query, document) pair together
and scores it; reranking re-scores the top of a first-stage run (dense, sparse or BM25 from outside).

    ce = rerank.CrossEncoder.load("reranker")          # a CrossEncoder folder, an HF *ForSequenceClassification
    ce.predict([("a query", "a passage"), ...])        #   folder or a bertjax classification workdir: [N] scores
    new_run = rerank.rerank(ce, run, queries, docs, depth=100)

`predict` follows sentence-transformers' CrossEncoder.predict: the pair as its tokenizer lays it out ([CLS] q
[SEP] d [SEP], RoBERTa's <s> q </s></s> d </s>), cut to the model's max_length by HF tokenizers' LongestFirst
rule (`truncate_longest_first`), and the model's
activation on the logits (the folder's `activation_fn`; by default sigmoid for one label, identity for more).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Sequence

import jax
import numpy as np

from bertjax import errors
from bertjax import model as model_lib
from bertjax.convert import weights
from bertjax.convert.table import ConversionError
from bertjax.core import files
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.embeddings import buckets
from bertjax.embeddings import folders as st_lib
from bertjax.embeddings.dense.encoder import _max_seq_length, finetune_kind, model_path

ACTIVATIONS = {"torch.nn.modules.activation.Sigmoid": "sigmoid", "torch.nn.modules.linear.Identity": "identity",
               "torch.nn.modules.activation.Tanh": "tanh"}
_APPLY = {"sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "identity": lambda x: x, "tanh": np.tanh}


def _json(path: str) -> dict:
  if not files.isfile(path):
    return {}
  try:
    out = files.read_json(path)
  except (OSError, ValueError) as e:
    raise ConversionError(f"{path}: not readable JSON ({str(e).splitlines()[0][:200]})") from None
  return out if isinstance(out, dict) else {}


def truncate_longest_first(a: list, b: list, max_tokens: int) -> None:
  """HF tokenizers' LongestFirst for a pair (what a CrossEncoder's fast tokenizer does; in place): the shorter
  text keeps its length up to half, the longer takes the rest, and when both pass half the second text gets the
  odd token. The original BERT's one-at-a-time rule (`rows.truncate_pair`) gives the first text that token."""
  n1, n2 = len(a), len(b)
  if n1 + n2 <= max_tokens:
    return
  swap = n1 > n2
  if swap:
    n1, n2 = n2, n1
  n2 = n1 if n1 > max_tokens else max(n1, max_tokens - n1)
  if n1 + n2 > max_tokens:
    n1 = max_tokens // 2
    n2 = n1 + max_tokens % 2
  if swap:
    n1, n2 = n2, n1
  del a[n1:], b[n2:]


def pair_rows(tok: tokenizer_lib.Tokenizer, pairs: Sequence[tuple[str, str]], max_length: int
              ) -> list[tuple[list[int], int, bool]]:
  """Each pair as its HF tokenizer lays it out for a sequence classifier: (ids, where the second text starts,
  whether it takes segment id 1 there). [CLS] q [SEP] d [SEP] with segments; a tokenizer whose first token is
  <s> (RoBERTa, XLM-RoBERTa) <s> q </s></s> d </s> without. Cut by `truncate_longest_first`."""
  double = tok.id_to_token(tok.cls_id) == "<s>"
  out = []
  for q, d in pairs:
    a, b = tok.encode(q), tok.encode(d)
    truncate_longest_first(a, b, max_length - (4 if double else 3))
    first = [tok.cls_id] + a + [tok.sep_id] + ([tok.sep_id] if double else [])
    out.append((first + b + [tok.sep_id], len(first), not double))
  return out


def read_activation(path: str, num_labels: int) -> str:
  """The folder's activation: config_sentence_transformers.json's `activation_fn` (sentence-transformers >= 6),
  else config.json's `sentence_transformers.activation_fn` (v4, v5) or `sbert_ce_default_activation_function`
  (older), else sigmoid for one label and identity for more."""
  st, hf = _json(files.join(path, "config_sentence_transformers.json")), _json(files.join(path, "config.json"))
  name = (st.get("activation_fn") or (hf.get("sentence_transformers") or {}).get("activation_fn")
          or hf.get("sbert_ce_default_activation_function"))
  if name is None:
    return "sigmoid" if num_labels == 1 else "identity"
  if name not in ACTIVATIONS:
    raise ConversionError(f"{path}: activation_fn {name!r}; bertjax computes {sorted(ACTIVATIONS)}")
  return ACTIVATIONS[name]


def write_folder(out: str, activation: str, max_length: int) -> None:
  """The sentence-transformers files that make an HF sequence-classification folder (already in `out`, with its
  tokenizer) a CrossEncoder folder; each file written whole (`out` may be a gs:// or s3:// folder)."""
  back = {v: k for k, v in ACTIVATIONS.items()}
  documents = {"modules.json": [{"idx": 0, "name": "0", "path": "",
                             "type": "sentence_transformers.base.modules.transformer.Transformer"}],
           "sentence_bert_config.json": {"max_seq_length": max_length, "do_lower_case": False,
                                         "transformer_task": "sequence-classification",
                                         "modality_config": {"text": {"method": "forward",
                                                                      "method_output_name": "logits"}},
                                         "module_output_name": "scores"},
           "config_sentence_transformers.json": {"model_type": "CrossEncoder", "activation_fn": back[activation],
                                                 "prompts": {}, "default_prompt_name": None}}
  for name, content in documents.items():
    files.write_whole(files.join(out, name), json.dumps(content, indent=2))


@dataclasses.dataclass
class CrossEncoder:
  cfg: model_lib.BertConfig
  params: dict
  tok: tokenizer_lib.Tokenizer
  max_length: int
  num_labels: int
  activation: str

  @staticmethod
  def is_reranker(path: str) -> bool:
    """Whether `path` is a cross-encoder and nothing else: a CrossEncoder folder or a bertjax task=rerank workdir
    (an HF classification folder or workdir may also be read as a text encoder)."""
    if files.isfile(files.join(path, "finetune.json")):
      return finetune_kind(path) == "rerank"
    if _json(files.join(path, "config_sentence_transformers.json")).get("model_type") == "CrossEncoder":
      return True
    # sentence-transformers 4-5 mark a saved CrossEncoder inside config.json (2.x-3.x with the activation's name)
    config = _json(files.join(path, "config.json"))
    return "activation_fn" in (config.get("sentence_transformers") or {}) or bool(
        config.get("sbert_ce_default_activation_function"))

  @staticmethod
  def is_model(path: str) -> bool:
    """Whether `path` is a CrossEncoder folder, an HF *ForSequenceClassification folder or a bertjax
    classification / regression workdir."""
    if files.isfile(files.join(path, "finetune.json")):
      return finetune_kind(path) in ("classification", "regression", "rerank")
    if _json(files.join(path, "config_sentence_transformers.json")).get("model_type") == "CrossEncoder":
      return True
    archs = _json(files.join(path, "config.json")).get("architectures") or []
    return any(str(a).endswith("ForSequenceClassification") for a in archs)

  @classmethod
  def load(cls, path: str, max_length: int = 0, **overrides) -> "CrossEncoder":
    """A CrossEncoder folder, an HF *ForSequenceClassification folder or a bertjax classification, regression or
    rerank workdir; a gs:// or s3:// one is read from a local copy (`files.local_copy`)."""
    path = model_path(path)
    if files.isfile(files.join(path, "finetune.json")):
      meta = weights.finetune_meta(path)
      if meta.get("kind") not in ("classification", "regression", "rerank"):
        raise ConversionError(f"{path}: a {meta.get('kind')!r} run; a reranker is a rerank, classification or "
                              "regression model")
      n = len(meta["labels"]) if meta["kind"] == "classification" else 1
      activation = "sigmoid" if meta["kind"] == "rerank" or n == 1 and meta["kind"] != "regression" else "identity"
      max_length = max_length or int(meta["max_seq_length"])
    else:
      conf = _json(files.join(path, "config.json"))
      n = int(conf.get("num_labels") or len(conf.get("id2label") or {}) or 2)
      activation = read_activation(path, n)
      max_length = max_length or _max_seq_length(path, path)
    finetuned = files.isfile(files.join(path, "finetune.json"))  # its own head, whatever its task
    w = weights.load(path, overrides=overrides, head="all" if finetuned else "sequence_classification", num_labels=n)
    if "classifier" not in w.params:
      raise ConversionError(f"{path}: no sequence-classification head (a reranker scores with one)")
    if not w.tokenizer:
      raise ConversionError(f"{path}: no tokenizer files (vocab.txt, vocab.json + merges.txt, tokenizer.json)")
    tok = tokenizer_lib.load(w.tokenizer, do_lower_case=w.do_lower_case)
    if not finetuned and st_lib.lowercases(path):  # sentence_bert_config.json's do_lower_case
      tok = st_lib.lowercased(tok)
    limit = w.cfg.max_length
    return cls(w.cfg, w.params, tok, min(max_length or limit, limit), n, activation)

  @functools.cached_property
  def fingerprint(self) -> str:
    h = hashlib.sha256(repr(("cross", self.cfg, self.max_length, self.num_labels, self.activation)).encode())
    for leaf in jax.tree_util.tree_leaves(self.params):
      h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()

  def rows(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], int, bool]]:
    return pair_rows(self.tok, pairs, self.max_length)

  @functools.cached_property
  def lengths(self) -> buckets.Lengths:
    """The padded lengths compiled so far (a few programs a command)."""
    return buckets.Lengths(self.max_length)

  @functools.cached_property
  def _apply(self):
    module = model_lib.for_task(self.cfg, "sequence_classification", self.num_labels)
    return jax.jit(lambda params, batch: module.apply({"params": params}, batch)["logits"])

  def predict(self, pairs: Sequence[tuple[str, str]], batch_size: int = 32) -> np.ndarray:
    """[N] scores (one label) or [N, labels], after the model's activation; longest pairs batched together."""
    if batch_size < 1:
      raise errors.ConfigError(f"batch_size must be >= 1, got {batch_size}")
    rows = self.rows(pairs)
    out = np.zeros((len(rows), self.num_labels), np.float32)
    order = np.argsort([-len(r) for r, _, _ in rows], kind="stable")
    for first, stop, width, size in self.lengths.batches([len(rows[j][0]) for j in order], batch_size):
      idx = order[first:stop]
      ids = np.full((size, width), self.tok.pad_id, np.int32)
      mask, seg = np.zeros_like(ids), np.zeros_like(ids)
      for r, j in enumerate(idx):
        row, start, segments = rows[j]
        ids[r, :len(row)], mask[r, :len(row)] = row, 1
        if segments and self.cfg.type_vocab_size > 1:
          seg[r, start:len(row)] = 1
      logits = self._apply(self.params, {"input_ids": ids, "input_mask": mask, "segment_ids": seg})
      out[idx] = np.asarray(logits, np.float32)[:len(idx)]
    out = _APPLY[self.activation](out)
    return out[:, 0] if self.num_labels == 1 else out


def check_ranker(ce: CrossEncoder, name: str = "") -> None:
  """One score per pair or a one-line error (sentence-transformers' CrossEncoder.rank takes num_labels 1 only)."""
  if ce.num_labels != 1:
    raise errors.ConfigError(f"{name or 'the cross-encoder'}: {ce.num_labels} labels; ranking needs a cross-encoder "
                             "with one score per pair (num_labels 1), as sentence-transformers' CrossEncoder.rank")


def rerank(ce: CrossEncoder, run: dict[str, dict[str, float]], queries: dict[str, str], docs: dict[str, str],
         depth: int = 100, batch_size: int = 32) -> dict[str, dict[str, float]]:
  """Each query's top `depth` documents of `run` scored by the cross-encoder; the documents below `depth` are left
  out, as BEIR's reranking evaluation keeps them. A model with more than one label is refused, as
  sentence-transformers' CrossEncoder.rank refuses it: which label ranks is not the model's to say."""
  if depth < 1:
    raise errors.ConfigError(f"--depth {depth}: rerank at least the top 1 document")
  check_ranker(ce)
  jobs = []
  for q, scored in run.items():
    top = sorted(scored.items(), key=lambda kv: (-kv[1], kv[0]))[:depth]
    jobs += [(q, d) for d, _ in top]
  scores = ce.predict([(queries[q], docs[d]) for q, d in jobs], batch_size) if jobs else np.zeros((0,))
  out: dict[str, dict[str, float]] = {q: {} for q in run}
  for (q, d), s in zip(jobs, scores):
    out[q][d] = float(s)
  return out


def read_run(path: str, doc_ids: Sequence[str] = ()) -> dict[str, dict[str, float]]:
  """A TREC run file (`qid Q0 docid rank score tag` per line) as {qid: {docid: score}}; a line that is not six
  fields with a numeric score, a document listed twice for a query, or (given `doc_ids`) a document the corpus
  lacks is a one-line error naming the file and line."""
  known_docs = set(doc_ids)
  run: dict[str, dict[str, float]] = {}
  try:
    raw = files.read_bytes(path)
  except errors.DataPathError:
    raise
  except OSError as e:
    raise errors.DataError(f"{path}: cannot read the run ({e.strerror or e})") from None
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise errors.DataError(f"{path}: not UTF-8 text (byte {e.start})") from None
  for n, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    fields = line.split()
    try:
      score = float(fields[4]) if len(fields) == 6 else None
    except ValueError:
      score = None
    if score is None or not np.isfinite(score):
      raise errors.DataError(f"{path}:{n}: not a TREC run line (qid Q0 docid rank score tag): {line[:120]!r}")
    q, d = fields[0], fields[2]
    if known_docs and d not in known_docs:
      raise errors.DataError(f"{path}:{n}: document {d!r} is not in the corpus")
    if d in run.setdefault(q, {}):
      raise errors.DataError(f"{path}:{n}: document {d!r} is listed twice for query {q!r}")
    run[q][d] = score
  if not run:
    raise errors.DataError(f"{path}: the run lists no documents")
  return run
