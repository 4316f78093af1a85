"""sentence-transformers (and PyLate) folders written by this environment's library: dense stacks with prompts,
sparse encoders, cross-encoders and multi-vector encoders, each beside the library's own outputs on fixed texts."""
from __future__ import annotations

import os

import numpy as np
import sentence_transformers as st
import torch
import transformers
import zoo_common as zc

MAJOR = int(st.__version__.split(".")[0])
DENSE_TOOLS = {"embeddings": "equal"}


def hf_base(tmp: str, family: str = "bert", head: str = "Model", cased: bool = False) -> str:
  """A tiny HF model folder with its tokenizer (the Transformer module's source)."""
  out = os.path.join(tmp, f"{family}-{head}-{'cased' if cased else 'lower'}")
  if os.path.isdir(out):
    return out
  import write_hf
  tok = (transformers.BertTokenizer(zc.wordpiece_vocab(out + "-v"), do_lower_case=not cased) if family == "bert"
         else write_hf._tokenizer(family, out + "-v"))
  tok.model_max_length = 32  # the positions it has: a cross-encoder saved without max_length cuts there
  torch.manual_seed(0)
  prefix = {"bert": "Bert", "roberta": "Roberta"}[family]
  m = getattr(transformers, prefix + head)(write_hf._config(family, len(tok), tok.pad_token_id, head))
  zc.perturb(m)
  m.save_pretrained(out)
  tok.save_pretrained(out)
  return out


def _modules():
  if MAJOR >= 6:
    from sentence_transformers.sentence_transformer import modules
    return modules
  return st.models


def _dense_outputs(model, prompts: bool) -> dict:
  out = {"encode": model.encode(zc.TEXTS, convert_to_numpy=True)}
  if prompts:
    for name in ("query", "document"):
      out[f"encode_{name}"] = model.encode(zc.TEXTS, prompt_name=name, convert_to_numpy=True)
  return out


def dense(root: str, tmp: str, name: str, pooling: str, family: str = "bert", dense_act=None, normalize=False,
          prompts=None, default=None, max_seq_length: int = 16, cased: bool = False, lower: bool = False,
          tools=None) -> None:
  m = _modules()
  out = zc.fresh(os.path.join(root, name))
  torch.manual_seed(1)
  tr = m.Transformer(hf_base(tmp, family, cased=cased), max_seq_length=max_seq_length, do_lower_case=lower)
  stack = [tr, m.Pooling(32, pooling_mode=pooling)]
  if dense_act is not None:
    stack.append(m.Dense(32, 24, activation_function=dense_act))
    zc.widen(stack[-1], 1)
  if normalize:
    stack.append(m.Normalize())
  kw = {"prompts": prompts, "default_prompt_name": default} if prompts else {}
  model = st.SentenceTransformer(modules=stack, device="cpu", **kw)
  model.save(out)
  model = st.SentenceTransformer(out, device="cpu")
  zc.record(out, "st-dense", family, tools or DENSE_TOOLS, _dense_outputs(model, bool(prompts)),
            pooling=pooling, st_major=MAJOR)


def _to_dense(x):
  x = x.to_dense() if hasattr(x, "to_dense") else x
  return np.asarray(x.detach().numpy() if hasattr(x, "detach") else x, np.float32)


def sparse(root: str, tmp: str, name: str, pooling: str, activation: str, router: bool = False,
           max_active_dims=None, cased: bool = False, lower: bool = False) -> None:
  from sentence_transformers.sparse_encoder import SparseEncoder
  if MAJOR >= 6:
    from sentence_transformers.base.modules import Router, Transformer
    from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding, SpladePooling
    tr = Transformer(hf_base(tmp, head="ForMaskedLM", cased=cased), transformer_task="fill-mask", max_seq_length=16,
                     do_lower_case=lower)
  else:
    from sentence_transformers.models import Router
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SparseStaticEmbedding, SpladePooling
    tr = MLMTransformer(hf_base(tmp, head="ForMaskedLM", cased=cased), max_seq_length=16, do_lower_case=lower)
  out = zc.fresh(os.path.join(root, name))
  pool = SpladePooling(pooling_strategy=pooling, activation_function=activation)
  if router:
    torch.manual_seed(1)
    weight = torch.rand(len(tr.tokenizer.get_vocab())) * 3
    stack = [Router.for_query_document(query_modules=[SparseStaticEmbedding(tokenizer=tr.tokenizer, weight=weight)],
                                       document_modules=[tr, pool])]
  else:
    stack = [tr, pool]
  SparseEncoder(modules=stack, similarity_fn_name="dot", device="cpu", max_active_dims=max_active_dims).save(out)
  model = SparseEncoder(out, device="cpu")
  arrays = {"encode_query": _to_dense(model.encode_query(zc.TEXTS, convert_to_tensor=True)),
            "encode_document": _to_dense(model.encode_document(zc.TEXTS, convert_to_tensor=True))}
  zc.record(out, "st-sparse", "bert", {"embeddings": "equal"}, arrays, pooling=pooling, activation=activation,
            st_major=MAJOR, max_active_dims=max_active_dims, do_lower_case=lower)


def cross(root: str, tmp: str, name: str, num_labels: int, activation=None, tools=None) -> None:
  out = zc.fresh(os.path.join(root, name))
  torch.manual_seed(2)
  kw = {}
  if activation is not None:
    kw["default_activation_function" if MAJOR < 4 else "activation_fn"] = activation
  model = st.CrossEncoder(hf_base(tmp), num_labels=num_labels, max_length=20, device="cpu", **kw)
  model.save(out)
  model = st.CrossEncoder(out, device="cpu")
  scores = np.asarray(model.predict(zc.PAIRS, convert_to_numpy=True), np.float32)
  zc.record(out, "st-cross", "bert", tools or {"rerank": "equal"}, {"predict": scores}, num_labels=num_labels,
            st_major=MAJOR)


def _ragged(prefix: str, vectors) -> dict:
  return {f"{prefix}_{i}": np.asarray(v.detach().numpy() if hasattr(v, "detach") else v, np.float32)
          for i, v in enumerate(vectors)}


def _maxsim(q: dict, d: dict) -> np.ndarray:
  return np.array([[float((q[f"q_{i}"] @ d[f"d_{j}"].T).max(1).sum()) for j in range(len(d))] for i in range(len(q))])


def multivector(root: str, tmp: str, name: str) -> None:
  import string

  from sentence_transformers.base.modules import Dense, Normalize, Transformer
  from sentence_transformers.multi_vector_encoder import MultiVectorEncoder
  from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
  base = os.path.join(tmp, "mve-base")
  if not os.path.isdir(base):
    tok = transformers.BertTokenizerFast(zc.wordpiece_vocab(base + "-v"), do_lower_case=True)
    tok.add_tokens(["[Q]", "[D]"])
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(vocab_size=len(tok), max_position_embeddings=32,
                                                   initializer_range=zc.INIT, **zc.SIZES),
                           add_pooling_layer=False).save_pretrained(base)
    tok.save_pretrained(base)
  out = zc.fresh(os.path.join(root, name))
  tr = Transformer(base, max_seq_length=24, query_length=12, document_length=20,
                   query_expansion={"strategy": "fixed", "length": 12, "attend": False})
  torch.manual_seed(3)
  proj = Dense(32, 16, bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings")
  zc.widen(proj, 3)
  MultiVectorEncoder(modules=[tr, proj,
                              MultiVectorMask(skiplist_words=list(string.punctuation)),
                              Normalize(module_input_name="token_embeddings")],
                     prompts={"query": "[Q] ", "document": "[D] "}, device="cpu").save(out)
  model = MultiVectorEncoder(out, device="cpu")
  q = _ragged("q", model.encode_query(zc.TEXTS))
  d = _ragged("d", model.encode_document(zc.TEXTS))
  zc.record(out, "st-multivector", "bert", {"embeddings": "equal"}, {**q, **d, "maxsim": _maxsim(q, d)},
            st_major=MAJOR)


def write_all(root: str, tmp: str) -> None:
  tanh, ident = torch.nn.Tanh(), torch.nn.Identity()
  if MAJOR == 2:
    dense(root, tmp, "dense-cls-dense-norm-prompts", "cls", dense_act=tanh, normalize=True, prompts=zc.PROMPTS,
          default="classification", tools={"embeddings": "refused: only in pytorch_model.bin"})
    dense(root, tmp, "dense-mean-sqrt-len", "mean_sqrt_len_tokens",
          tools={"embeddings": "refused: pooling ['pooling_mode_mean_sqrt_len_tokens']"})
    cross(root, tmp, "cross-1label-config-only", 1)
    cross(root, tmp, "cross-3labels-config-only", 3)
  elif MAJOR == 3:
    dense(root, tmp, "dense-mean-roberta", "mean", family="roberta", normalize=True, max_seq_length=20)
    dense(root, tmp, "dense-max-lowercase-cased-vocab", "max", cased=True, lower=True, prompts=zc.PROMPTS)
    cross(root, tmp, "cross-1label-identity-config-only", 1, activation=ident)
  elif MAJOR == 5:
    dense(root, tmp, "dense-mean-dense-identity-prompts", "mean", dense_act=ident, prompts=zc.PROMPTS)
    sparse(root, tmp, "sparse-mlmtransformer-max-relu-active8", "max", "relu", max_active_dims=8)
    sparse(root, tmp, "sparse-mlmtransformer-sum-log1p", "sum", "log1p_relu")
    sparse(root, tmp, "sparse-router-inference-free", "max", "relu", router=True)
    sparse(root, tmp, "sparse-max-relu-lowercase-cased-vocab", "max", "relu", cased=True, lower=True)
    cross(root, tmp, "cross-1label-tanh", 1, activation=tanh)
  else:
    dense(root, tmp, "dense-cls-dense-norm-prompts", "cls", dense_act=tanh, normalize=True, prompts=zc.PROMPTS,
          default="query")
    dense(root, tmp, "dense-max", "max", max_seq_length=12)
    sparse(root, tmp, "sparse-max-log1p-active8", "max", "log1p_relu", max_active_dims=8)
    sparse(root, tmp, "sparse-router-inference-free", "max", "relu", router=True)
    cross(root, tmp, "cross-3labels", 3)
    multivector(root, tmp, "multivector-colbert")
