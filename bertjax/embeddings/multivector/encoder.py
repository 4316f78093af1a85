"""Multi-vector late-interaction encoders (ColBERT): a text is one vector per token, and a query scores a document
by MaxSim, the sum over its vectors of the best dot product with any of the document's.

    enc = multivector.MultiVectorEncoder.load("colbert-folder")   # a sentence-transformers MultiVectorEncoder folder
    q = enc.encode(["a query"], task="query")        # a list of [tokens, dim] float32 arrays, unit rows
    d = enc.encode(["a document"], task="document")
    multivector.maxsim(q[0], d[0])

A MultiVectorEncoder folder (sentence-transformers >= 6) is a Transformer, a Dense projection of every token
(`module_input_name` token_embeddings, no bias in ColBERT's), a MultiVectorMask and a Normalize of the tokens.
`encode` follows its encode_query / encode_document: the task's prompt ("[Q] ", "[D] ") before the text; queries
cut at `query_length`, documents at `document_length` (else the folder's max_seq_length); with query expansion
(ColBERT's query augmentation) a query is padded to `length` tokens with [MASK], which the encoder does not attend
to (unless `attend`) but which MaxSim scores; the skiplist's tokens (punctuation in ColBERT) are dropped from
documents; every kept vector has unit length. A PyLate ColBERT folder (model_type ColBERT) is read the same way
with PyLate's rules (`folders.pylate_settings`): its prefix is one token put after [CLS] by its id.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from bertjax import convert
from bertjax import model as model_lib
from bertjax.convert import files as convert_files
from bertjax.convert import weights
from bertjax.convert.table import ConversionError
from bertjax.core import files
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.embeddings import buckets
from bertjax.embeddings import folders as st_lib
from bertjax.embeddings.dense.encoder import _max_seq_length, finetune_kind, model_path
from bertjax.embeddings.model import normalize

BLOCK = 1024  # documents embedded at a time: each is a vector per token
_DENSE_ACTIVATIONS = ("torch.nn.modules.linear.Identity",)


def _json(path: str) -> dict:
  try:
    out = files.read_json(path)
  except FileNotFoundError:
    return {}
  except (OSError, ValueError) as e:
    raise ConversionError(f"{path}: not readable JSON ({str(e).splitlines()[0][:200]})") from None
  return out


def is_folder(path: str) -> bool:
  """A sentence-transformers MultiVectorEncoder folder or a PyLate ColBERT one (model_type ColBERT)."""
  kind = _json(files.join(path, "config_sentence_transformers.json")).get("model_type")
  return kind in ("MultiVectorEncoder", "ColBERT")


def is_model(path: str) -> bool:
  """Whether `path` is a MultiVectorEncoder folder or a bertjax `task=multivector` workdir."""
  return is_folder(path) or finetune_kind(path) == "multivector"


@dataclasses.dataclass(frozen=True)
class Settings:
  """What decides a text's vectors besides the weights (the folder's configs)."""
  max_seq_length: int
  query_length: int | None = None
  document_length: int | None = None
  expansion: tuple | None = None  # (strategy, attend, token, length)
  query_prompt: str = ""
  document_prompt: str = ""
  skiplist: tuple[str, ...] = ()
  skiplist_tasks: tuple[str, ...] = ("document",)
  normalize: bool = True
  similarity: str = "maxsim"
  prefix_tokens: bool = False  # PyLate: each prompt is one token, put after [CLS] by its id
  skip_unknown: bool = False  # PyLate: a skiplist word outside the vocabulary skips [UNK]


def settings_from_json(text: str) -> Settings:
  """Settings from the JSON of their fields (a task=multivector run's `settings` option)."""
  raw = json.loads(text)
  raw["expansion"] = tuple(raw["expansion"]) if raw.get("expansion") else None
  return Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


def model_settings(path: str) -> tuple[Settings, int]:
  """(Settings, projection width) of a MultiVectorEncoder folder or a task=multivector workdir (its options)."""
  if finetune_kind(path) == "multivector":
    opts = weights.finetune_meta(path).get("task_options") or {}
    return settings_from_json(opts["settings"]), int(opts.get("dim", 128))
  _, dense, settings = read_folder(path)
  return settings, int(dense["kernel"].shape[1])


def read_folder(path: str) -> tuple[str, dict, Settings]:
  """(transformer sub-folder, the Dense projection's params, Settings) of a MultiVectorEncoder folder; a module
  bertjax does not compute is a one-line error naming it. A remote folder is read from a local copy (the
  transformer sub-folder returned is that copy's)."""
  path = files.local_copy(path)
  stack = _json(os.path.join(path, "modules.json"))
  if not isinstance(stack, list) or not stack:
    raise ConversionError(f"{path}/modules.json: not a list of modules")
  kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in stack]
  allowed = {"Transformer", "Dense", "MultiVectorMask", "Normalize"}
  if kinds[0] != "Transformer" or any(k not in allowed for k in kinds):
    raise ConversionError(f"{path}: modules {kinds} are not a multi-vector encoder's Transformer, Dense, "
                          f"MultiVectorMask, Normalize; not supported: {[k for k in kinds if k not in allowed]}")
  folder = os.path.join(path, stack[0].get("path", ""))
  st_cfg = _json(os.path.join(path, "config_sentence_transformers.json"))
  bert_cfg = _json(os.path.join(folder, "sentence_bert_config.json"))
  dense, skip, skip_tasks, norm = {}, (), ("document",), False
  for m, kind in zip(stack[1:], kinds[1:]):
    sub = os.path.join(path, m.get("path", ""))
    conf = _json(os.path.join(sub, "config.json"))
    if conf.get("module_input_name", "token_embeddings") != "token_embeddings":
      raise ConversionError(f"{sub}/config.json: {kind} of {conf.get('module_input_name')!r}; a multi-vector "
                            "encoder's modules work on token_embeddings")
    if kind == "Dense":
      if dense:
        raise ConversionError(f"{path}: more than one Dense module")
      if conf.get("activation_function", _DENSE_ACTIVATIONS[0]) not in _DENSE_ACTIVATIONS:
        raise ConversionError(f"{sub}: activation {conf.get('activation_function')}; bertjax computes Identity")
      if conf.get("use_residual"):
        raise ConversionError(f"{sub}: a PyLate Dense with use_residual; bertjax computes the projection alone")
      state = convert_files.read_safetensors(os.path.join(sub, "model.safetensors"))
      dense = {"kernel": np.asarray(state["linear.weight"], np.float32).T}
      if conf.get("bias", True):
        dense["bias"] = np.asarray(state["linear.bias"], np.float32)
    elif kind == "MultiVectorMask":
      if conf.get("keep_only_token_ids"):
        raise ConversionError(f"{sub}: keep_only_token_ids (image-patch documents) is not computed by bertjax")
      skip = tuple(conf.get("skiplist_words") or ())
      tasks = conf.get("skiplist_tasks") or ["document"]
      skip_tasks = tuple([tasks] if isinstance(tasks, str) else tasks)
    elif kind == "Normalize":
      norm = True
  if not dense:
    raise ConversionError(f"{path}: no Dense projection; a multi-vector encoder projects each token with one")
  if st_cfg.get("model_type") == "ColBERT":
    return folder, dense, Settings(_max_seq_length(path, folder) or 512, **st_lib.pylate_settings(path, st_cfg))
  exp = bert_cfg.get("query_expansion")
  expansion = None
  if exp:
    if exp.get("strategy") not in ("fixed", "min") or not isinstance(exp.get("length"), int):
      raise ConversionError(f"{folder}/sentence_bert_config.json: query_expansion {exp} is not fixed/min with a "
                            "length")
    expansion = (exp["strategy"], bool(exp.get("attend", False)), exp.get("token"), exp["length"])
  prompts = st_cfg.get("prompts") or {}
  similarity = st_cfg.get("similarity_fn_name") or "maxsim"
  if similarity not in ("maxsim", "meanmaxsim"):
    raise ConversionError(f"{path}: similarity {similarity!r}; bertjax computes maxsim and meanmaxsim")
  settings = Settings(_max_seq_length(path, folder) or 512, bert_cfg.get("query_length"),
                      bert_cfg.get("document_length"), expansion, prompts.get("query") or "",
                      prompts.get("document") or "", skip, skip_tasks, norm, similarity)
  return folder, dense, settings


def skip_ids(tok: tokenizer_lib.Tokenizer, settings: Settings) -> frozenset:
  """The skiplist's words that are one token of the vocabulary (others would match only [UNK])."""
  index = {p: i for i, p in enumerate(tok.pieces)}
  out = frozenset(index[w] for w in settings.skiplist if w in index and index[w] != tok.unk_id)
  if settings.skip_unknown and any(w not in index for w in settings.skiplist):
    out |= {tok.unk_id}  # PyLate's convert_tokens_to_ids gives [UNK]'s id for such a word
  return out


def side_length(s: Settings, task: str) -> int:
  """The most tokens `text_rows` gives a text of `task` ("query" | "document"), a query's expansion included."""
  exp = s.expansion if task == "query" else None
  limit = (s.query_length if task == "query" else s.document_length) or s.max_seq_length
  if exp is not None:
    limit = exp[3] if exp[0] == "fixed" else max(limit, exp[3])
  return limit


def text_rows(tok: tokenizer_lib.Tokenizer, s: Settings, texts: Sequence[str], task: str
              ) -> list[tuple[list[int], int, int]]:
  """Each text's (token ids, tokens the encoder attends to, positions that give vectors before the skiplist) for
  `task` ("query" | "document"): the task's prompt, its length, a query's expansion."""
  exp = s.expansion if task == "query" else None
  prompt = s.query_prompt if task == "query" else s.document_prompt
  limit = side_length(s, task)
  out = []
  head = [tok.cls_id]
  if s.prefix_tokens and prompt:  # PyLate: the prefix token's id after [CLS], the text cut one shorter
    head, prompt = head + [prefix_id(tok, prompt)], ""
  for text in texts:
    ids = head + tok.encode(prompt + text)[:max(limit - len(head) - 1, 0)] + [tok.sep_id]
    n = len(ids)
    if exp is not None and n < exp[3]:
      token = tok.token_to_id(exp[2]) if exp[2] else tok.mask_id  # a missing token: KeyError
      ids = ids + [token] * (exp[3] - n)
    out.append((ids, len(ids) if exp is not None and exp[1] else n, len(ids)))
  return out


def prefix_id(tok: tokenizer_lib.Tokenizer, prefix: str) -> int:
  """The id of a PyLate prefix ("[Q] ", "[unused0]"): a token of the vocabulary or an added token."""
  try:
    return tok.token_to_id(prefix)
  except KeyError:
    raise ConversionError(f"{tok.path}: the PyLate prefix {prefix!r} is not a token of the vocabulary") from None


def maxsim(query: np.ndarray, document: np.ndarray, mean: bool = False) -> float:
  """Σ_i max_j q_i·d_j (divided by the query's vector count with `mean`: meanmaxsim)."""
  s = float(np.sum(np.max(query @ document.T, axis=1)))
  return s / len(query) if mean else s


@dataclasses.dataclass
class MultiVectorEncoder:
  cfg: model_lib.BertConfig
  params: dict  # {"bert": ..., "dense": {"kernel"[, "bias"]}}
  tok: tokenizer_lib.Tokenizer
  settings: Settings

  @classmethod
  def load(cls, path: str, **overrides) -> "MultiVectorEncoder":
    """A MultiVectorEncoder folder or a bertjax `task=multivector` workdir (its best parameters and settings); a
    gs:// or s3:// one is read from a local copy (`files.local_copy`)."""
    path = model_path(path)
    if finetune_kind(path) is not None:
      return cls._load_run(path, **overrides)
    if not is_folder(path):
      raise ConversionError(f"{path}: not a sentence-transformers MultiVectorEncoder or PyLate ColBERT folder "
                            "(config_sentence_transformers.json model_type)")
    folder, dense, settings = read_folder(path)
    cfg, params = convert.from_hf(folder, head="encoder", **overrides)
    # tokenizer.json first: it holds the prompt markers ([Q], [D]) as added tokens, which vocab.txt splits.
    full = os.path.join(folder, "tokenizer.json")
    tok_path, lower = (full, True) if files.isfile(full) else weights.hf_tokenizer(folder)
    if not tok_path:
      raise ConversionError(f"{folder}: no tokenizer files")
    tok = tokenizer_lib.load(tok_path, do_lower_case=lower)
    if st_lib.lowercases(path):  # sentence_bert_config.json's do_lower_case: str.lower() before the tokenizer
      tok = st_lib.lowercased(tok)
    if settings.prefix_tokens:  # a missing prefix token: refused here, not at the first encode
      [prefix_id(tok, p) for p in (settings.query_prompt, settings.document_prompt) if p]
    limit = cfg.max_length
    settings = dataclasses.replace(settings, max_seq_length=min(settings.max_seq_length, limit))
    return cls(cfg, {"bert": params.get("bert", params), "dense": dense}, tok, settings)

  @classmethod
  def _load_run(cls, path: str, **overrides) -> "MultiVectorEncoder":
    meta = weights.finetune_meta(path)
    if meta["kind"] != "multivector":
      raise ConversionError(f"{path}: a {meta['kind']!r} fine-tuning run, not a multi-vector encoder's "
                            "(task=multivector)")
    opts = meta.get("task_options") or {}
    if "settings" not in opts:
      raise ConversionError(f"{path}/finetune.json: no multi-vector settings in task_options")
    settings = settings_from_json(opts["settings"])
    w = weights.load(path, overrides=overrides, head="all")
    if "dense" not in w.params:
      raise ConversionError(f"{path}: no token projection (dense) in the run's parameters")
    tok = tokenizer_lib.load(w.tokenizer, do_lower_case=w.do_lower_case)
    limit = w.cfg.max_length
    settings = dataclasses.replace(settings, max_seq_length=min(settings.max_seq_length or limit, limit))
    return cls(w.cfg, {"bert": w.params["bert"], "dense": dict(w.params["dense"])}, tok, settings)

  @functools.cached_property
  def _skip_ids(self) -> frozenset:
    return skip_ids(self.tok, self.settings)

  def rows(self, texts: Sequence[str], task: str) -> list[tuple[list[int], int, int]]:
    return text_rows(self.tok, self.settings, texts, task)

  @functools.cached_property
  def lengths(self) -> buckets.Lengths:
    """The padded lengths compiled so far, shared by queries and documents."""
    s = self.settings
    return buckets.Lengths(max(n for n in (s.query_length, s.document_length, s.max_seq_length) if n))

  @functools.cached_property
  def _apply(self):
    module = model_lib.BertModel(self.cfg)
    norm = self.settings.normalize

    def token_vectors(params, batch):
      hidden = module.apply({"params": params["bert"]}, batch, True, pool=False)["hidden"].astype(jnp.float32)
      x = hidden @ params["dense"]["kernel"]
      if "bias" in params["dense"]:
        x = x + params["dense"]["bias"]
      return normalize(x) if norm else x
    return jax.jit(token_vectors)

  def encode(self, texts: Sequence[str], task: str = "document", batch_size: int = 32) -> list[np.ndarray]:
    """One [vectors, dim] array per text: every token the encoder read (and a query's expansion tokens), less
    the skiplist's tokens on the skiplist's tasks."""
    if task not in ("query", "document"):
      raise ValueError(f"task {task!r}: query or document")
    rows = self.rows(texts, task)
    skip = self._skip_ids if task in self.settings.skiplist_tasks else frozenset()
    out: list[np.ndarray] = [np.zeros((0, 0), np.float32)] * len(rows)
    order = np.argsort([-len(r[0]) for r in rows], kind="stable")
    for start, stop, width, n in self.lengths.batches([len(rows[j][0]) for j in order], batch_size):
      idx = order[start:stop]
      ids = np.full((n, width), self.tok.pad_id, np.int32)
      mask = np.zeros_like(ids)
      for r, j in enumerate(idx):
        ids[r, :len(rows[j][0])], mask[r, :rows[j][1]] = rows[j][0], 1
      vectors = np.asarray(self._apply(self.params, {"input_ids": ids, "input_mask": mask,
                                                     "segment_ids": np.zeros_like(ids)}))
      for r, j in enumerate(idx):
        keep = [p for p, t in enumerate(rows[j][0][:rows[j][2]]) if t not in skip]
        out[j] = vectors[r, keep]
    return out

  def score(self, queries: Sequence[np.ndarray], documents: Sequence[np.ndarray]) -> np.ndarray:
    """[Q, D] MaxSim (or meanmaxsim, the folder's similarity) of every query against every document."""
    mean = self.settings.similarity == "meanmaxsim"
    return np.array([[maxsim(q, d, mean) for d in documents] for q in queries], np.float32)


def _padded(vectors: Sequence[np.ndarray], length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """[n, L, d] vectors and [n, L] mask, zero-padded to the longest (or `length`)."""
  width = length or max(1, max(len(v) for v in vectors))
  dim = next(v.shape[1] for v in vectors if v.size)
  out = np.zeros((len(vectors), width, dim), np.float32)
  mask = np.zeros((len(vectors), width), bool)
  for i, v in enumerate(vectors):
    out[i, :len(v)], mask[i, :len(v)] = v, True
  return out, mask


# Bytes of one scoring step's [query vectors, documents, document tokens] scores: a tile reduced to its maxima while
# it is in cache (a whole block's scores at once run at a third of the speed; docs/performance.md has the table).
TILE_BYTES = 1 << 23


def tiling(queries: int, query_tokens: int, width: int, documents: int, tile_bytes=TILE_BYTES) -> tuple[int, int]:
  """(queries per group, documents per step) whose [vectors, documents, tokens] scores fit `tile_bytes`."""
  per_query = 4 * query_tokens * width  # bytes of one query's scores against one document
  group = max(1, min(queries, tile_bytes // per_query))
  return group, max(1, min(documents, tile_bytes // (group * per_query)))


@functools.lru_cache(maxsize=None)
def _block_maxsim(mean: bool, mesh, chunk: int):
  """jit(q [Q, Lq, d], q_mask, docs [N, Ld, d], d_mask) -> [Q, N] MaxSim. The documents' rows are split over
  `mesh`'s devices; each scores its own `chunk` documents at a time, one [Q·Lq, chunk·Ld] product per step."""
  def local(q, qm, docs, dm):
    (n, width, dim), vectors = docs.shape, q.shape[0] * q.shape[1]
    flat_q = q.reshape(vectors, dim)

    def step(block):
      d, bias = block  # [chunk, Ld, d], [chunk, Ld]: 0 on a document's tokens, -inf on its padding
      s = jnp.dot(flat_q, d.reshape(chunk * width, dim).T, preferred_element_type=jnp.float32)
      return jnp.max(s.reshape(vectors, chunk, width) + bias[None], axis=-1)

    bias = jnp.where(dm, np.float32(0.0), -jnp.inf).reshape(n // chunk, chunk, width)
    best = jax.lax.map(step, (docs.reshape(n // chunk, chunk, width, dim), bias))  # [n / chunk, Q·Lq, chunk]
    best = jnp.moveaxis(best, 0, 1).reshape(q.shape[:2] + (n,))
    total = jnp.sum(jnp.where(qm[:, :, None], best, 0.0), axis=1)
    return total / jnp.maximum(jnp.sum(qm, axis=-1), 1)[:, None] if mean else total
  return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("docs"), P("docs")), out_specs=P(None, "docs")))


def search(enc: MultiVectorEncoder, queries: Sequence[str], docs: Sequence[str], k: int, block: int = BLOCK,
           batch_size: int = 32, tile_bytes: int = TILE_BYTES) -> tuple[np.ndarray, np.ndarray]:
  """Exact MaxSim top-k of every query over the documents, embedded `block` at a time: (scores, document
  indices), each [Q, k], best first. Each block's documents are split over the devices, and each device scores
  a group of queries against a few documents at a time (a `tile_bytes` tile of scores). Every block has the same
  rows and each is padded to one of a few token counts, so scoring compiles a few programs."""
  from bertjax.embeddings.retrieval import _merge
  mesh = Mesh(np.array(jax.devices()), ("docs",))
  n_dev = mesh.devices.size
  q, qm = _padded(enc.encode(queries, "query", batch_size))
  s_ = enc.settings
  widths = buckets.Lengths(max(n for n in (s_.document_length, s_.max_seq_length) if n))
  per_device = -(-min(block, len(docs)) // n_dev)
  group, chunk = tiling(len(q), q.shape[1], widths.cap, per_device, tile_bytes)
  rows = -(-per_device // chunk) * chunk * n_dev
  f = _block_maxsim(s_.similarity == "meanmaxsim", mesh, chunk)
  pad_q = -(-len(q) // group) * group - len(q)
  q, qm = (np.pad(x, [(0, pad_q)] + [(0, 0)] * (x.ndim - 1)) for x in (q, qm))
  spec = NamedSharding(mesh, P("docs"))
  best_s = np.full((len(queries), 0), -np.inf, np.float32)
  best_i = np.zeros((len(queries), 0), np.int64)
  for start in range(0, len(docs), block):
    vectors = enc.encode(docs[start:start + block], "document", batch_size)
    d, dm = _padded(vectors, widths.plan([max(1, max(len(v) for v in vectors))], rows)[0])
    d, dm = (jax.device_put(np.pad(x, [(0, rows - len(x))] + [(0, 0)] * (x.ndim - 1)), spec) for x in (d, dm))
    s = np.concatenate([np.asarray(f(q[i:i + group], qm[i:i + group], d, dm)) for i in range(0, len(q), group)])
    s = s[:len(queries), :min(block, len(docs) - start)]
    top = np.argsort(-s, axis=1, kind="stable")[:, :k]
    best_s, best_i = _merge(best_s, best_i, np.take_along_axis(s, top, 1), top + start, k)
  return best_s, best_i
