"""HF folders of every family bertjax reads, written by this environment's `transformers` (4.x or 5.x): head forms,
tokenizer forms, sharded safetensors and a pickle-only folder; beside each, the model's outputs on fixed ids and
the tokenizer's ids on the fixed texts."""
from __future__ import annotations

import os

import numpy as np
import torch
import transformers
import zoo_common as zc

T5 = int(transformers.__version__.split(".")[0]) >= 5
HEAD_OUT = {"Model": "last_hidden_state", "ForMaskedLM": "logits", "ForSequenceClassification": "logits",
            "ForTokenClassification": "logits"}
EQUAL = {"convert": "equal", "tokenizer": "equal", "embeddings": "equal", "merge": "equal", "extend_vocab": "equal"}
LABELS = {0: "neg", 1: "neutral", 2: "pos"}


def _config(family: str, vocab: int, pad: int, head: str):
  common = dict(vocab_size=vocab, pad_token_id=pad, initializer_range=zc.INIT, **zc.SIZES)
  if head in ("ForSequenceClassification", "ForTokenClassification"):
    common.update(num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
  if family == "bert":
    return transformers.BertConfig(max_position_embeddings=32, **common)
  if family in ("roberta", "xlm-roberta"):
    cls = transformers.RobertaConfig if family == "roberta" else transformers.XLMRobertaConfig
    return cls(max_position_embeddings=34, type_vocab_size=1, bos_token_id=0, eos_token_id=2, **common)
  if family == "electra":
    return transformers.ElectraConfig(max_position_embeddings=32, embedding_size=16, **common)
  if family == "deberta-v2":
    return transformers.DebertaV2Config(max_position_embeddings=32, relative_attention=True,
                                        pos_att_type=["p2c", "c2p"], position_buckets=4, max_relative_positions=32,
                                        share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
                                        type_vocab_size=0, pooler_hidden_size=32, **common)
  return transformers.ModernBertConfig(max_position_embeddings=32, local_attention=8, global_attn_every_n_layers=2,
                                       bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3, **common)


def _tokenizer(family: str, tmp: str):
  """The family's tokenizer as this transformers builds it from files trained on the corpus."""
  if family in ("bert", "electra"):
    vocab = zc.wordpiece_vocab(tmp)
    cls = transformers.BertTokenizer if family == "bert" else transformers.ElectraTokenizer
    return cls(vocab, do_lower_case=True)
  if family == "roberta":
    vocab, merges = zc.roberta_files(tmp)
    if T5:
      return transformers.RobertaTokenizer(vocab=vocab, merges=merges)
    return transformers.RobertaTokenizer(vocab_file=vocab, merges_file=merges)
  if family == "modernbert":
    tk = zc.train_byte_bpe(["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    import tokenizers
    tk.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tk.token_to_id("[CLS]")), ("[SEP]", tk.token_to_id("[SEP]"))])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", cls_token="[CLS]",
                                                sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")
  import sentencepiece as spm
  if family == "deberta-v2":
    path = os.path.join(tmp, "spm.model")
    zc.train_spm(path, pad_id=0, pad_piece="[PAD]", bos_id=1, bos_piece="[CLS]", eos_id=2, eos_piece="[SEP]",
                 unk_id=3, unk_piece="[UNK]")
    if not T5:
      return transformers.DebertaV2Tokenizer(vocab_file=path)
    sp = spm.SentencePieceProcessor(model_file=path)
    return transformers.DebertaV2Tokenizer(vocab=[(sp.IdToPiece(i), sp.GetScore(i)) for i in range(len(sp))])
  path = os.path.join(tmp, "sentencepiece.bpe.model")
  zc.train_spm(path)
  if not T5:
    return transformers.XLMRobertaTokenizer(vocab_file=path)
  sp = spm.SentencePieceProcessor(model_file=path)
  vocab = [(t, 0.0) for t in ("<s>", "<pad>", "</s>", "<unk>")]
  vocab += [(sp.IdToPiece(i), sp.GetScore(i)) for i in range(3, len(sp))] + [("<mask>", 0.0)]
  return transformers.XLMRobertaTokenizer(vocab=vocab)


def _ids(tok, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  specials = set(tok.all_special_ids)
  pool = [i for i in range(len(tok)) if i not in specials]
  ids = rng.choice(pool, (2, 12))
  ids[:, 0], mask = tok.cls_token_id, np.ones((2, 12), np.int64)
  ids[0, -1] = ids[1, 7] = tok.sep_token_id
  mask[1, 8:] = 0
  ids[1, 8:] = tok.pad_token_id
  return {"input_ids": ids.astype(np.int64), "attention_mask": mask}


def _outputs(m, batch) -> dict:
  with torch.no_grad():
    out = m(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["attention_mask"]))
  keys = ("last_hidden_state", "logits", "prediction_logits", "seq_relationship_logits", "start_logits",
          "end_logits")
  return {f"out_{k}": getattr(out, k).numpy() for k in keys if getattr(out, k, None) is not None}


def _mean_pooled(m, tok) -> dict:
  """The fixed texts' mean-pooled embeddings as torch gives them: the masked mean of the encoder's
  last_hidden_state (the head's base model) over each text's real tokens ([CLS] text [SEP], cut at the 32
  positions every zoo config has), and the same scaled to unit length."""
  enc = tok(zc.TEXTS, padding=True, truncation=True, max_length=32, return_tensors="pt")
  with torch.no_grad():
    h = m.base_model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
    mean = (h * mask).sum(1) / mask.sum(1)
    unit = torch.nn.functional.normalize(mean, dim=-1)
  return {"embed_mean": mean.numpy(), "embed_mean_normalized": unit.numpy()}


def _refusals(family: str, head: str, names: list) -> dict:
  """What bertjax refuses of this folder, by the substring of its one-line message."""
  out = {}
  if family == "electra":
    out["extend_vocab"] = "refused: a factorised embedding (ELECTRA)"
  elif "vocab.txt" not in names and family != "bert":  # BERT's tokenizer.json alone (transformers 5): WordPiece
    out["extend_vocab"] = "refused: needs a WordPiece vocab.txt"
  if head in ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"):
    out["merge"] = out["extend_vocab"] = "refused: is a fine-tuned task head"
  if "model.safetensors" not in names and "model.safetensors.index.json" not in names:
    out.update({tool: "refused: refusing to load a pickle" for tool in ("convert", "embeddings", "merge",
                                                                         "extend_vocab")})
  return out


def write(root: str, name: str, family: str, head: str, tmp: str, save: dict | None = None,
          tools: dict | None = None, tok=None) -> None:
  """One HF folder `root/name` of `family`'s `head` class and its tokenizer, and its record."""
  out = zc.fresh(os.path.join(root, name))
  tok = tok or _tokenizer(family, os.path.join(tmp, family))
  torch.manual_seed(0)
  prefix = {"bert": "Bert", "roberta": "Roberta", "electra": "Electra", "deberta-v2": "DebertaV2",
            "xlm-roberta": "XLMRoberta", "modernbert": "ModernBert"}[family]
  cfg = _config(family, len(tok), tok.pad_token_id, head)
  m = getattr(transformers, prefix + head)(cfg).eval()
  zc.perturb(m)
  m.save_pretrained(out, **(save or {}))
  tok.save_pretrained(out)
  batch = _ids(tok)
  arrays = {**batch, **_outputs(m, batch), **_mean_pooled(m, tok)}
  for i, text in enumerate(zc.TEXTS):
    arrays[f"tok_{i}"] = np.asarray(tok(text)["input_ids"], np.int64)
  kind = "hf-" + head
  tools = {**EQUAL, **_refusals(family, head, sorted(os.listdir(out))), **(tools or {})}
  zc.record(out, kind, family, tools, arrays, files=sorted(os.listdir(out)),
            architecture=prefix + head)


def write_all(root: str, tmp: str, only=None) -> None:
  more = ("ForTokenClassification", "ForQuestionAnswering") if T5 else ()  # the zoo's size: these once
  plan = [("bert", h) for h in ("Model", "ForMaskedLM", "ForPreTraining", "ForSequenceClassification", *more)]
  plan += [("roberta", h) for h in ("Model", "ForMaskedLM", "ForSequenceClassification")]
  plan += [("electra", h) for h in ("Model", "ForMaskedLM", "ForTokenClassification", *more[:0], *(
      ("ForPreTraining",) if T5 else ()))]
  plan += [("deberta-v2", h) for h in ("Model", "ForMaskedLM", "ForSequenceClassification")]
  plan += [("xlm-roberta", h) for h in ("Model", "ForMaskedLM", "ForTokenClassification")]
  if hasattr(transformers, "ModernBertModel"):
    plan += [("modernbert", h) for h in ("Model", "ForMaskedLM", "ForSequenceClassification")]
  plan = [(f, h) for f, h in plan if only is None or f in only]
  toks = {}
  for family, head in plan:
    toks.setdefault(family, _tokenizer(family, os.path.join(tmp, family)))
    write(root, f"{family}-{head.lower()}", family, head, tmp, tok=toks[family])
  if only is not None and "bert" not in only:
    return
  if T5:  # transformers 5 writes safetensors whatever safe_serialization says: the pickle-only form is 4.x's
    write(root, "bert-formaskedlm-sharded", "bert", "ForMaskedLM", tmp, dict(max_shard_size="20KB"),
          tok=toks["bert"])
  else:
    write(root, "bert-formaskedlm-bin", "bert", "ForMaskedLM", tmp, dict(safe_serialization=False), tok=toks["bert"])
