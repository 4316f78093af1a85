"""A bertjax pre-training workdir as HF transformers folders, the tokenizer files HF reads, and writing an output
folder whole: what `python -m bertjax convert` (and `extend_vocab`, `parity`) build on. A fine-tuned workdir is
exported by its task kind (`bertjax.tasks`), which knows its head. Workdirs and output folders may be local or in
an object store (gs://, s3://; `bertjax.core.files`): a remote output is written in a local staging folder, then
uploaded.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Callable

import ml_collections
from safetensors import SafetensorError

from bertjax import convert, errors, objectives
from bertjax import model as model_lib
from bertjax.convert import files as convert_files
from bertjax.convert import weights
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.core import files
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data import vocab_files
from bertjax.objectives import electra


def pretraining(workdir: str, out: str) -> str:
  """A pre-training workdir's newest readable checkpoint as its family's MLM model in `out` (ELECTRA: as HF
  publishes it, OUT/discriminator and OUT/generator), each folder with the run's tokenizer; returns the
  architecture(s) written."""
  run = files.read_json(files.join(workdir, "config.json"))
  tok_path, lower = weights.run_tokenizer(workdir, ml_collections.ConfigDict(run))
  if not tok_path:
    raise errors.TokenizerError(f"{workdir}: no tokenizer (neither WORKDIR/tokenizer/ nor its data dir "
                                f"{run['data']['data_dir']} can be read)")
  params = checkpoint_lib.Checkpointer(workdir, read_only=True).restore_params()
  arch, folders = pretraining_params(run, params, out)
  for sub in folders:
    copy_tokenizer(tok_path, lower, files.join(out, sub) if sub else out)
  return arch


def pretraining_params(run: dict, params: dict, out: str) -> tuple[str, tuple[str, ...]]:
  """A pre-training run's params (its config.json `run`) as HF folders in `out`: (architectures, the folders
  written, relative to `out`). Params of the MLM model export as it (BERT: BertForPreTraining with the NSP head,
  BertForMaskedLM without, as `cfg.nsp_head` says); an encoder alone (`{"bert": ...}`) as the family's encoder."""
  cfg = model_lib.BertConfig.from_dict(run["model"])
  if objectives.get(run).name == "electra":
    gen_cfg = electra.generator_config(cfg, run["electra"]["generator_hidden"], run["electra"]["generator_layers"])
    if cfg.position_embedding == "disentangled":  # DeBERTa-v3's RTD: HF has no replaced-token DeBERTa model
      disc, gen = electra.split(convert.table.host_params(params))
      convert.to_hf(cfg, disc["bert"], files.join(out, "discriminator"), head="encoder")
      convert.to_hf(gen_cfg, gen, files.join(out, "generator"))
      return "DebertaV2Model + DebertaV2ForMaskedLM", ("discriminator", "generator")
    convert.electra_to_hf(cfg, gen_cfg, params, out)
    return "ElectraForPreTraining + ElectraForMaskedLM", ("discriminator", "generator")
  if set(params) == {"bert"}:  # an encoder without heads (a merge of HF BertModel folders): the family's encoder
    encoder_to_hf(cfg, params["bert"], out)
  else:
    convert.to_hf(cfg, params, out)
  return architecture(out), ("",)


def encoder_to_hf(cfg: model_lib.BertConfig, bert: dict, out: str) -> None:
  """The encoder params `bert` as the family's encoder model (BertModel, ...) in `out`, with its pooler where
  `bert` holds one (HF's BertModel has one; `convert.to_hf` leaves it out, as an embedding model's export)."""
  name = convert.family_of(cfg, bert)
  fam = convert.FAMILIES[name]

  def rows(c, head):
    return [r[:3] if r[0][:1] == ("pooler",) and "pooler" in bert else r for r in fam.rows(c, head)]
  state = convert.table.dump(dataclasses.replace(fam, rows=rows), cfg, bert, "encoder")
  convert.write_hf_dir(out, state, fam.config_to_hf(cfg, fam.architectures["encoder"]))


def architecture(folder: str) -> str:
  """The architecture an HF folder's config.json names."""
  return files.read_json(files.join(folder, "config.json"))["architectures"][0]


ST_ROOT_FILES = ("config_sentence_transformers.json", "sentence_bert_config.json")


@dataclasses.dataclass(frozen=True)
class StStack:
  """A sentence-transformers folder's modules beside its Transformer (`st_modules`): `files`, the files an HF
  folder of its encoder takes to load as that model again, by relative path; `max_length`, the tokenizer's
  model_max_length (sentence-transformers 6 keeps the sequence length there), None when unset."""
  files: dict
  max_length: int | None = None

  def modules(self) -> dict:
    """The files of the stack itself: everything but the root's settings."""
    return {k: v for k, v in self.files.items() if k not in ST_ROOT_FILES}


def st_modules(path: str) -> StStack | None:
  """The stack of the sentence-transformers folder `path`: modules.json with the Transformer at the root, the
  root's and the Transformer's settings, every other module's folder (Pooling, Dense, Normalize), and the
  sequence length. None for a folder without modules.json."""
  if not files.isfile(files.join(path, "modules.json")):
    return None
  inner = weights.hf_folder(path)  # checks the stack's first module is a Transformer
  stack = files.read_json(files.join(path, "modules.json"))
  stack = [dict(m, path="") if i == 0 else m for i, m in enumerate(stack)]
  held = {"modules.json": json.dumps(stack, indent=2).encode()}
  for name in ST_ROOT_FILES:
    for where in (path, inner):
      if files.isfile(files.join(where, name)) and name not in held:
        held[name] = files.read_bytes(files.join(where, name))
  try:
    length = files.read_json(files.join(inner, "tokenizer_config.json")).get("model_max_length")
  except (OSError, ValueError, AttributeError):
    length = None
  for m in stack[1:]:
    sub = str(m.get("path") or "")
    if sub.startswith((".", "/")) or ".." in sub.split("/"):
      raise errors.ConversionError(f"{files.join(path, 'modules.json')}: module {m.get('type')} has a path outside "
                                   f"the folder ({sub!r})")
    if not sub or not files.isdir(files.join(path, sub)):
      continue  # a module that stores nothing (Normalize, as sentence-transformers 2 saved it)
    for rel in files.walk_files(files.join(path, sub)):
      held[f"{sub}/{rel.replace(os.sep, '/')}"] = files.read_bytes(files.join(path, sub, *rel.split(os.sep)))
  unset = not isinstance(length, int) or length >= 10 ** 9  # HF's "unset" is a huge number
  return StStack(held, None if unset else length)


def carry_st_modules(stack: StStack | None, out: str) -> None:
  """Writes `stack` into the HF folder `out`, so that `SentenceTransformer(out)` is the input's stack over the new
  encoder (its pooling, projection, normalisation and sequence length kept)."""
  if stack is None:
    return
  if stack.max_length is not None and files.isfile(files.join(out, "tokenizer_config.json")):
    settings = files.read_json(files.join(out, "tokenizer_config.json"))
    _write_json(files.join(out, "tokenizer_config.json"), {**settings, "model_max_length": stack.max_length})
  for rel, raw in stack.files.items():
    target = files.join(out, *rel.split("/"))
    files.makedirs(files.parent(target))
    files.write_whole(target, raw)


def _write_json(path: str, obj, indent: int = 2) -> None:
  files.write_whole(path, json.dumps(obj, indent=indent))


def copy_tokenizer(tok_path: str, lower: bool, out: str) -> None:
  """The run's tokenizer as files HF's AutoTokenizer reads, in the HF folder `out`, and its special ids in
  config.json (HF's embeddings keep the pad id's row out of training: it must be the tokenizer's)."""
  tok_path = convert_files.local_tokenizer(tok_path)  # the tokenizer libraries read local files
  tok = tokenizer_lib.load(tok_path, do_lower_case=lower)
  _write_special_ids(tok, out)
  if os.path.basename(tok_path) == "vocab.txt":
    files.copy(tok_path, files.join(out, "vocab.txt"))
    _write_json(files.join(out, "tokenizer_config.json"), {"tokenizer_class": "BertTokenizer",
                                                           "do_lower_case": bool(lower)})
  elif tok_path.endswith(".json"):  # tokenizer.json (or byte-level BPE's vocab.json): the files HF's tokenizers read
    folder = os.path.dirname(tok_path)
    for name in ("vocab.json", "merges.txt", "tokenizer.json"):
      if files.isfile(os.path.join(folder, name)):
        files.copy(os.path.join(folder, name), files.join(out, name))
    try:  # an optional dependency: with it, tokenizer.json, which AutoTokenizer reads for every family
      import transformers
    except ImportError:
      transformers = None
    if transformers is not None and not files.isfile(os.path.join(folder, "tokenizer.json")):
      # RoBERTa's byte-level BPE over these files, special tokens and all, whatever the model's family (without
      # tokenizer.json, ModernBERT's AutoTokenizer has no reader for vocab.json + merges.txt).
      source = files.local_copy(out)  # `out` itself when local
      with files.local_target(out) as target:
        transformers.RobertaTokenizer.from_pretrained(source).save_pretrained(target)
    elif tok.kind in ("metaspace", "wordpiece"):
      # tokenizer.json is the whole tokenizer (XLM-R's sentencepiece vocabulary; a fast BERT tokenizer's WordPiece
      # with its lower-casing and pair template): a class of its own would lay its special tokens over it.
      names = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), tok.specials))
      ends = {"bos_token": names["cls_token"], "eos_token": names["sep_token"]} if tok.kind == "metaspace" else {}
      _write_json(files.join(out, "tokenizer_config.json"), {"tokenizer_class": "PreTrainedTokenizerFast", **names,
                                                             **ends, "model_input_names": _input_names(out)})
    elif not files.isfile(files.join(out, "tokenizer_config.json")):
      _write_json(files.join(out, "tokenizer_config.json"), {"tokenizer_class": "RobertaTokenizer"})
  else:  # a sentencepiece model: the model file, and tokenizer.json with bertjax's ids for AutoTokenizer
    plain = tok.spm_ids is None or list(tok.spm_ids) == list(range(len(tok.pieces)))
    # DeBERTa's and XLM-R's models keep their names: their ids are HF's tokenizers' over them (`tokenizer.load`)
    files.copy(tok_path, files.join(out, "spiece.model" if plain else os.path.basename(tok_path)))
    with files.local_target(files.join(out, "tokenizer.json")) as target:
      sentencepiece_as_hf(tok_path).save(target)
    names = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), tok.specials))
    _write_json(files.join(out, "tokenizer_config.json"), {"tokenizer_class": "PreTrainedTokenizerFast", **names,
                                                           "model_input_names": _input_names(out)})


def _input_names(out: str) -> list[str]:
  """What the tokenizer hands the model: segment ids only to a model with more than one segment type (a
  ModernBERT takes none; RoBERTa's single type would make a pair's second segment out of range)."""
  types = files.read_json(files.join(out, "config.json")).get("type_vocab_size", 0)
  return ["input_ids", *(["token_type_ids"] if types > 1 else []), "attention_mask"]


def _write_special_ids(tok, out: str) -> None:
  path = files.join(out, "config.json")
  cfg = files.read_json(path)
  if "model_type" not in cfg:  # a sentence-transformers module's own config beside the tokenizer, not a model's
    return
  if cfg.get("model_type") not in ("roberta", "xlm-roberta"):  # positions count from the pad id: already set
    cfg["pad_token_id"] = tok.pad_id
  for key, value in (("bos_token_id", tok.cls_id), ("cls_token_id", tok.cls_id), ("eos_token_id", tok.sep_id),
                     ("sep_token_id", tok.sep_id)):
    if key in cfg:
      cfg[key] = value
  _write_json(path, cfg)


def same_place(a: str, b: str) -> bool:
  """Whether two paths name one folder (local: after links; remote: as written, without a trailing slash)."""
  if files.is_remote(a) or files.is_remote(b):
    return files.absolute(a) == files.absolute(b)
  return os.path.realpath(a) == os.path.realpath(b)


def _there(path: str) -> bool:
  """Whether anything is at `path` (locally a dangling link too; remotely an object or a prefix with objects)."""
  return files.exists(path) if files.is_remote(path) else os.path.lexists(path)


def check_out(workdir: str, out: str, overwrite: bool) -> None:
  """Refuses an output folder (or object-store prefix) that holds anything unless --overwrite, and a bertjax
  workdir or data dir always (an HF folder written there would replace the run's config.json)."""
  if not _there(out):
    return
  if not files.isdir(out):
    raise FileExistsError(f"{out}: exists and is not a folder")
  if same_place(out, workdir):
    raise errors.ConfigError(f"--out {out} is the workdir being converted; choose a new folder")
  names = set(files.listdir(out))
  if names & {"checkpoints", "finetune.json", "creation.json", ".lock", ".claim.json"}:
    raise errors.ConfigError(f"--out {out} holds a bertjax workdir or data dir; an HF folder written there would "
                             "replace its files. Choose a new folder")
  if names and not overwrite:
    raise FileExistsError(f"{out}: exists and is not empty; pass --overwrite to replace it")


def into_place(out: str, make: Callable[[str], str]) -> str:
  """`make(tmp)` writes into a temporary sibling folder of `out` that is renamed into place at the end, replacing
  `out`: a failed or killed write (a full disk, a read-only folder) leaves `out` as it was. Returns what `make`
  returns. A remote `out` (an object-store prefix) is written in a local staging folder and uploaded once `make`
  succeeded (`publish`)."""
  if files.is_remote(out):
    return _into_remote(files.absolute(out), make)
  out = files.absolute(out)
  parent = os.path.dirname(out)
  files.makedirs(parent)
  tmp = os.path.join(parent, f".{os.path.basename(out)}.tmp-{os.getpid()}")
  files.rmtree(tmp)
  try:
    os.makedirs(tmp)
    result = make(tmp)
  except (OSError, SafetensorError) as e:
    files.rmtree(tmp)
    raise OSError(f"writing {out} failed: {errors.one_line(e)}; {out} is untouched") from None
  except BaseException:
    files.rmtree(tmp)
    raise
  if os.path.lexists(out):
    old = os.path.join(parent, f".{os.path.basename(out)}.old-{os.getpid()}")
    files.rename(out, old)
    files.rename(tmp, out)
    files.rmtree(old)
  else:
    files.rename(tmp, out)
  return result


def _into_remote(out: str, make: Callable[[str], str]) -> str:
  with tempfile.TemporaryDirectory(prefix="bertjax-out-") as stage:
    tmp = os.path.join(stage, files.basename(out))
    os.makedirs(tmp)
    try:
      result = make(tmp)
    except (OSError, SafetensorError) as e:
      raise OSError(f"writing {out} failed: {errors.one_line(e)}; {out} is untouched") from None
    publish(tmp, out)
  return result


def publish(local: str, out: str) -> None:
  """Uploads the local folder `local` to the prefix `out`, each file one object (atomic on the store), then
  removes the objects under `out` that the upload did not write (an earlier output's that --overwrite replaces)."""
  old = set(files.walk_files(out)) if files.isdir(out) else set()
  new = files.walk_files(local)
  try:
    for rel in new:
      files.copy(os.path.join(local, rel), files.join(out, *rel.split(os.sep)))
    for rel in sorted(old - {r.replace(os.sep, "/") for r in new}):
      files.remove(files.join(out, rel))
  except OSError as e:
    raise OSError(f"uploading {out} failed: {errors.one_line(e)}; {out} may be incomplete, write it again") from None


def sentencepiece_as_hf(path: str):
  """A sentencepiece model as an HF `tokenizers` Tokenizer with the same ids: the model's own normaliser (its
  precompiled character map, then its whitespace rules), "▁"-prefixed words, its unigram or BPE pieces and scores,
  the special pieces matched as special tokens, and BERT's [CLS] A [SEP] (B [SEP]) template. What tokenizer.json
  holds for `AutoTokenizer`; read from the file's records, so no protobuf runtime is needed."""
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
  top = vocab_files.proto_records(files.read_bytes(path))
  if top is None:
    raise errors.TokenizerError(f"{path}: not a whole sentencepiece model")

  def spec(field):  # a sub-message of the model (proto2 defaults where a field is absent)
    raw = next((v for k, v in top if k == field and isinstance(v, bytes)), b"")
    return dict(vocab_files.proto_records(raw) or [])
  trainer, norm = spec(2), spec(3)
  model_type, byte_fallback = trainer.get(3, 1), bool(trainer.get(35, 0))
  local = files.local_copy(path)  # sentencepiece reads local files
  tok = tokenizer_lib.load(local)
  import sentencepiece as spm
  sp = spm.SentencePieceProcessor(model_file=local)
  # bertjax's ids (`tokenizer.load`: the model's own, XLM-R's fairseq order, special tokens appended) over the
  # model's pieces: each id's piece and score, -1 where the id has no piece in the model (an added token).
  src = list(tok.spm_ids) if tok.spm_ids is not None else list(range(sp.GetPieceSize()))
  pieces = [(p, sp.GetScore(s) if s >= 0 else 0.0) for p, s in zip(tok.pieces, src)]
  special = [i for i, s in enumerate(src) if s < 0 or sp.IsControl(s) or sp.IsUnknown(s)]
  if model_type == 1:
    model = models.Unigram(pieces, unk_id=tok.unk_id, byte_fallback=byte_fallback)
  elif model_type == 2:
    vocab = {p: i for i, (p, _) in enumerate(pieces)}
    plain = {p for i, (p, _) in enumerate(pieces) if i not in special and not sp.IsByte(src[i])}
    merges = []  # every split of a piece into two pieces, applied in the order of the merged piece's score
    for piece, score in pieces:
      if piece in plain:
        merges += [(score, vocab[piece[:k]], vocab[piece[k:]], piece[:k], piece[k:]) for k in range(1, len(piece))
                   if piece[:k] in plain and piece[k:] in plain]
    merges.sort(key=lambda m: (-m[0], m[1], m[2]))
    model = models.BPE(vocab, [(a, b) for *_, a, b in merges], unk_token=pieces[tok.unk_id][0], fuse_unk=True,
                       byte_fallback=byte_fallback)
  else:
    raise errors.TokenizerError(f"{path}: a sentencepiece {'word' if model_type == 3 else 'char'} model has no HF "
                                "tokenizer here; train a unigram or bpe model")
  hf = Tokenizer(model)
  steps = [normalizers.Precompiled(norm[2])] if norm.get(2) else []
  if norm.get(4, 1):  # remove_extra_whitespaces
    steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
  hf.normalizer = normalizers.Sequence(steps)
  prepend = "always" if norm.get(3, 1) else "never"  # add_dummy_prefix
  hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend)
  hf.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend)
  hf.add_special_tokens([AddedToken(pieces[i][0], special=True, normalized=False) for i in special])
  cls, sep = pieces[tok.cls_id][0], pieces[tok.sep_id][0]
  hf.post_processor = processors.TemplateProcessing(
      single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
      special_tokens=[(cls, tok.cls_id), (sep, tok.sep_id)])
  return hf
