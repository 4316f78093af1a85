"""Embedding sentences with a bertjax encoder: load a sentence-transformers folder (or an HF folder with a
pooling choice), tokenise texts as sentence-transformers does ([CLS] text [SEP], cut at `max_seq_length`), and
embed them in batches.

    enc = embeddings.Encoder.load("all-MiniLM-L6-v2")        # a sentence-transformers folder
    vectors = enc.encode(["a sentence", "another one"])     # [2, 384] float32, unit length

  python -m bertjax embeddings sts --model MODEL pairs.csv --columns sentence1,sentence2,score   # STS
  python -m bertjax embeddings beir --model MODEL scifact/ --run scifact.trec    # retrieval (docs/embeddings.md)
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from bertjax import convert, errors
from bertjax.convert import weights
from bertjax.core import files, scores
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data.tasks import rows as task_data
from bertjax.embeddings import blocks as blocks_lib
from bertjax.embeddings import buckets, quantize, retrieval
from bertjax.embeddings import folders as st_lib
from bertjax.embeddings.model import EmbeddingModel, Pooling


def token_rows(tok, texts: Sequence[str], max_len: int) -> list[list[int]]:
  """[CLS] text [SEP] of each text, cut to `max_len` tokens."""
  return [[tok.cls_id] + tok.encode_head(t, max_len - 2) + [tok.sep_id] for t in texts]


def batch_of(rows_ids: Sequence[Sequence[int]], pad_id: int, max_len: int, rows: int = 0, multiple: int = 1,
             length: int = 0) -> dict:
  """The encoder's batch of token rows: padded to `length`, else to the longest row (rounded up to `multiple`, at
  most `max_len`), and with empty rows up to `rows`."""
  n = length or min(-(-max(len(r) for r in rows_ids) // multiple) * multiple, max_len)
  ids = np.full((max(rows, len(rows_ids)), n), pad_id, np.int32)
  mask = np.zeros_like(ids)
  for i, r in enumerate(rows_ids):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
  return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}


def _max_seq_length(path: str, folder: str) -> int:
  """sentence_bert_config.json's max_seq_length, else (sentence-transformers >= 6 keeps it with the tokenizer)
  tokenizer_config.json's model_max_length; 0 when neither says."""
  for name, key in ((files.join(path, "sentence_bert_config.json"), "max_seq_length"),
                    (files.join(folder, "tokenizer_config.json"), "model_max_length")):
    if files.isfile(name):
      value = files.read_json(name).get(key)
      if isinstance(value, int) and 0 < value < 10 ** 6:
        return value
  return 0


# The embedding models that are not a dense encoder: their fine-tuning kind, their sentence-transformers folder's
# model_type, and the reader that takes them.
OTHER_KINDS = {"sparse": ("SparseEncoder", "a sparse encoder", "bertjax.embeddings.sparse.encoder.SparseEncoder"),
               "multivector": ("MultiVectorEncoder", "a multi-vector encoder",
                               "bertjax.embeddings.multivector.encoder.MultiVectorEncoder"),
               "rerank": ("CrossEncoder", "a cross-encoder", "bertjax.embeddings.rerank.encoder.CrossEncoder")}


def _embedding_run(path: str) -> dict | None:
  """finetune.json of an embedding model's fine-tuned workdir (a contrastive task's), else None; a sparse,
  multi-vector or rerank run is a one-line error naming its reader."""
  if not files.isfile(files.join(path, "finetune.json")):
    return None
  meta = weights.finetune_meta(path)
  if meta["kind"] in OTHER_KINDS:
    _, what, reader = OTHER_KINDS[meta["kind"]]
    raise convert.ConversionError(f"{path}: {what}'s run (task={meta['task']}), not a dense embedding model's; "
                                  f"read it with {reader} (the embeddings command does)")
  return meta if meta["kind"] == "contrastive" else None


def _check_dense_folder(path: str, conf: dict) -> None:
  """A sentence-transformers folder of another model type (SparseEncoder, MultiVectorEncoder, CrossEncoder) is a
  one-line error naming its reader, not a dense model of its Transformer."""
  for _, (model_type, what, reader) in OTHER_KINDS.items():
    if conf.get("model_type") == model_type:
      raise convert.ConversionError(f"{path}: {what} ({model_type} folder), not a dense embedding model; read it "
                                    f"with {reader} (the embeddings command does)")


def model_path(path: str) -> str:
  """A model folder or workdir as a local path: the path itself, or for a gs:// / s3:// one a local copy of it
  (`files.local_copy`: the model readers and tokenizers read local files; a second load downloads only the
  objects whose size changed)."""
  if not files.is_remote(path):
    return path
  files.reach(path)
  if not files.isdir(path):
    raise convert.ConversionError(f"{path}: no such model folder")
  return files.local_copy(path)


def finetune_kind(path: str) -> str | None:
  """The `kind` of a fine-tuned workdir's finetune.json (checked as `weights.finetune_meta` checks it), or None
  when `path` holds none; a remote workdir's is read without copying the rest of it."""
  name = files.join(path, "finetune.json")
  if not files.isfile(name):
    return None
  local = os.path.dirname(files.local_copy(name)) if files.is_remote(name) else path
  return weights.finetune_meta(local).get("kind")


@dataclasses.dataclass
class Encoder:
  module: EmbeddingModel
  params: dict
  tok: tokenizer_lib.Tokenizer
  max_seq_length: int
  prompts: st_lib.Prompts = st_lib.Prompts()  # a sentence-transformers folder's query / document / default prompts

  @classmethod
  def load(cls, path: str, pooling: Pooling | None = None, max_seq_length: int = 0, **overrides) -> "Encoder":
    """A sentence-transformers folder (its pooling, dense layer, normalisation and max_seq_length), an embedding
    model's fine-tuned workdir (the same, as the run trained it: what `predict` and its export use), or any other
    model `weights.load` reads (an HF folder, a bertjax workdir) with `pooling` (default mean + normalize). The
    `pooling` and `max_seq_length` given replace the model's own. A gs:// or s3:// folder is read from a local
    copy (`files.local_copy`)."""
    path = model_path(path)
    meta = _embedding_run(path)
    prompts = st_lib.Prompts()
    if st_lib.is_folder(path):
      conf = st_lib.st_config(path)
      _check_dense_folder(path, conf)
      prompts = st_lib.read_prompts(path, conf)
      if any(dataclasses.astuple(prompts)) and not st_lib.pools_prompt(path):
        raise convert.ConversionError(f"{path}: its Pooling leaves the prompt's tokens out (include_prompt false); "
                                      "bertjax pools every token")
      cfg, params, found, folder = st_lib.read(path, **overrides)
      tok_path, lower = weights.hf_tokenizer(folder)
      pooling = pooling or found
      max_seq_length = max_seq_length or _max_seq_length(path, folder)
    elif meta is not None:  # the pooling, dense layer and length the run trained with
      w = weights.load(path, overrides=overrides, head="all")
      cfg, tok_path, lower = w.cfg, w.tokenizer, w.do_lower_case
      params = {k: v for k, v in w.params.items() if k in ("bert", "dense")}
      opts = meta.get("task_options", {})
      pooling = pooling or Pooling(**{f.name: opts[f.name] for f in dataclasses.fields(Pooling) if f.name in opts})
      max_seq_length = max_seq_length or int(meta["max_seq_length"])
    else:
      w = weights.load(path, overrides=overrides, head="encoder")
      cfg, params, tok_path, lower = w.cfg, w.params, w.tokenizer, w.do_lower_case
      pooling = pooling or Pooling()
    if not tok_path:
      raise convert.ConversionError(f"{path}: no tokenizer files (vocab.txt, vocab.json + merges.txt, or a "
                                    "sentencepiece model)")
    tok = tokenizer_lib.load(tok_path, do_lower_case=lower)
    if st_lib.is_folder(path) and st_lib.lowercases(path):  # sentence_bert_config.json's do_lower_case
      tok = st_lib.lowercased(tok)
    limit = cfg.max_length
    return cls(EmbeddingModel(cfg, pooling), params, tok, min(max_seq_length or limit, limit), prompts)

  @functools.cached_property
  def _apply(self):
    return jax.jit(lambda params, batch: self.module.apply({"params": params}, batch)["embedding"])

  @functools.cached_property
  def fingerprint(self) -> str:
    """A digest of the weights, pooling and length: what decides the embeddings."""
    h = hashlib.sha256(repr((self.module.pooling, self.module.cfg, self.max_seq_length)).encode())
    for leaf in jax.tree_util.tree_leaves(self.params):
      h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()

  @functools.cached_property
  def _local_mesh(self) -> Mesh | None:
    """A one-axis mesh over this host's devices, or None with one device."""
    devices = jax.local_devices()
    return Mesh(np.array(devices), ("batch",)) if len(devices) > 1 else None

  @functools.cached_property
  def _device_params(self):
    """The weights on this host's devices (replicated), placed once rather than sent with every batch."""
    mesh = self._local_mesh
    return jax.device_put(self.params, NamedSharding(mesh, P()) if mesh else jax.local_devices()[0])

  def _row_sharding(self, batch_size: int) -> NamedSharding | None:
    """Rows split over this host's devices when they divide the batch, else None (one device)."""
    mesh = self._local_mesh
    return NamedSharding(mesh, P("batch")) if mesh and batch_size % mesh.size == 0 else None

  def encode_query(self, texts: Sequence[str], batch_size: int = 32, prompt: str | None = None) -> np.ndarray:
    """`encode` with the folder's query prompt (sentence-transformers' encode_query), or `prompt` when given."""
    return self.encode(texts, batch_size, self.prompts.query if prompt is None else prompt)

  def encode_document(self, texts: Sequence[str], batch_size: int = 32, prompt: str | None = None) -> np.ndarray:
    """`encode` with the folder's document prompt (sentence-transformers' encode_document), or `prompt`."""
    return self.encode(texts, batch_size, self.prompts.document if prompt is None else prompt)

  @functools.cached_property
  def lengths(self) -> buckets.Lengths:
    """The padded lengths compiled so far, shared by every call (queries and documents alike)."""
    return buckets.Lengths(self.max_seq_length)

  def encode(self, texts: Sequence[str], batch_size: int = 32, prompt: str | None = None) -> np.ndarray:
    """Embeddings [len(texts), D] in the order given, `prompt` (else the folder's default prompt) put before each
    text. Texts run longest first by token count, in batches of `batch_size` rows, each padded to one of a few
    lengths (`buckets.Lengths`: at most 4 programs a call, reused by later calls); on a CPU a batch of long rows
    runs as a few device batches of at most `buckets.CPU_BATCH_TOKENS` tokens."""
    if not len(texts):
      return np.zeros((0, 0), np.float32)
    prompt = self.prompts.default if prompt is None else prompt
    rows = token_rows(self.tok, [prompt + t for t in texts] if prompt else texts, self.max_seq_length)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    mesh, params = self._local_mesh, self._device_params
    out = []
    for start, stop, width, size in self.lengths.batches([len(rows[j]) for j in order], batch_size,
                                                         mesh.size if mesh else 1):
      batch = batch_of([rows[j] for j in order[start:stop]], self.tok.pad_id, width, rows=size, length=width)
      sharding = self._row_sharding(size)
      if sharding is not None:
        batch = jax.device_put(batch, sharding)
      # Results stay on the device until the end, so the host pads the next batch while the device runs this one.
      out.append((self._apply(params, batch), stop - start))
    out = [np.asarray(v)[:n] for v, n in out]
    vectors = np.concatenate(out)
    result = np.empty_like(vectors)
    result[order] = vectors
    return result


BLOCK = 65536  # documents embedded at a time: a block of 384-wide float32 vectors is 100 MB


def check_sizes(**sizes: int) -> None:
  """Each of --top_k, --block, --batch_size (by name) a positive integer, or one line naming it."""
  for name, value in sizes.items():
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise errors.ConfigError(f"--{name} must be an integer >= 1, got {value!r}")


def sts_scores(encoder: Encoder, pairs: Sequence[tuple[str, str, float]], batch_size: int = 32) -> dict[str, float]:
  """Spearman and Pearson correlation of the cosine similarity of each pair's embeddings with its gold score."""
  check_sizes(batch_size=batch_size)
  if len(pairs) < 2:
    raise task_data.TaskDataError(f"STS needs at least two scored pairs, got {len(pairs)}")
  a = encoder.encode([p[0] for p in pairs], batch_size)
  b = encoder.encode([p[1] for p in pairs], batch_size)
  cos = scores.paired_cosine(a, b)
  gold = np.array([p[2] for p in pairs], np.float64)
  return {"spearman": scores.spearman(cos, gold), "pearson": scores.pearson(cos, gold), "pairs": len(pairs)}


def embed_corpus(encoder: Encoder, ids: Sequence[str], texts: Sequence[str], out: str,
                 opts: retrieval.Options = retrieval.Options(), log=print) -> dict:
  """Embeds a corpus into `out`: `block-NNNNN.npy` ([rows, width] float32) with its record, and `ids.json`
  (every id, in row order), `manifest.json` binding the folder to the model, prefix, ids and texts
  (`blocks.BlockStore`). A killed run resumes at its first missing block (none embedded twice); each host embeds
  the blocks b with b % hosts == its index, its rows split over its devices, texts longest first. Another
  `opts.precision` stores each block quantized (`block-NNNNN.npz`: embeddings, precision, ranges; `quantize`).
  Reads `opts.block` (None: BLOCK), batch_size, doc_prefix, precision, calibration and overwrite."""
  block, batch_size = BLOCK if opts.block is None else opts.block, opts.batch_size
  precision, calibration = opts.precision, opts.calibration
  check_sizes(block=block, batch_size=batch_size)
  if not len(texts):
    raise errors.DataError("the corpus holds no documents")
  prefix = encoder.prompts.document if opts.doc_prefix is None else opts.doc_prefix  # None: the folder's own
  key = blocks_lib.corpus_key(f"{encoder.fingerprint}|{prefix}|corpus", texts, block, ids)
  store = blocks_lib.BlockStore(out, quantize.store_key(key, precision, calibration), "--out", opts.overwrite)
  if jax.process_index() == 0 and not files.isfile(files.join(out, "ids.json")):
    files.write_whole(files.join(out, "ids.json"), json.dumps(list(ids)))
  n_blocks = -(-len(texts) // block)
  mine = [b for b in range(n_blocks) if b % jax.process_count() == jax.process_index()]
  todo = [b for b in mine if not store.done(b)]
  log(f"embedding {len(texts)} documents in {n_blocks} blocks of {block} into {out}: {len(mine)} on this host, "
      f"{len(mine) - len(todo)} done before", flush=True)
  state = {"done": 0, "docs": 0, "t0": time.time()}

  def embed(chunk):
    encoder.lengths.reset()  # each block padded as a fresh run pads it: a resumed store holds the same bytes
    vectors = encoder.encode_document(chunk, batch_size, prompt=prefix)
    state["done"] += 1
    state["docs"] += len(chunk)
    rate = state["docs"] / max(time.time() - state["t0"], 1e-9)
    left = sum(len(texts[b * block:(b + 1) * block]) for b in todo[state["done"]:])
    log(f"block {state['done']}/{len(todo)}: {rate:.1f} documents/s, ETA {left / max(rate, 1e-9):.0f} s", flush=True)
    return vectors
  wanted = set(todo)
  blocks = (retrieval.corpus_blocks(embed, texts, block, store, select=wanted.__contains__) if precision == "float32"
            else quantize.corpus_blocks(embed, texts, block, precision, calibration, store, wanted.__contains__))
  for _ in blocks:
    pass
  return {"documents": len(texts), "blocks": n_blocks, "embedded now": len(todo), "out": out}
