"""The family recipes (configs/roberta.py, configs/modernbert.py) end to end on a small corpus, the data they
need (RoBERTa's FULL-SENTENCES / DOC-SENTENCES examples, the masking rate as one knob), the schedules they use,
and an architecture switch on the BERT recipe."""
import math
import random

import numpy as np
import pytest

from bertjax import pretrain as train
from bertjax.core import optim
from bertjax.data import tokenizer
from bertjax.data.pretraining import dataset
from bertjax.data.pretraining import examples as pretraining

WORDS = ("the model reads text and predicts masked words from both sides of each sentence while a second "
         "head guesses whether two segments follow each other").split()


def _corpus(d, docs=60, seed=0):
  rng = np.random.default_rng(seed)
  text = ["\n".join(" ".join(rng.choice(WORDS, rng.integers(5, 14))).capitalize() + "."
                    for _ in range(rng.integers(2, 9))) for _ in range(docs)]
  (d / "corpus.txt").write_text("\n\n".join(text))
  return d / "corpus.txt"


@pytest.fixture(scope="module")
def packed_data(tmp_path_factory):
  """FULL-SENTENCES data (seq 64, 30% masking, predictions derived) with a byte-level BPE tokenizer."""
  d = tmp_path_factory.mktemp("packed")
  corpus = _corpus(d)
  tok = tokenizer.train([corpus], d / "tok", kind="byte_bpe", vocab_size=300)
  opts = pretraining.CreationOptions(max_seq_length=64, max_predictions_per_seq=0, masked_lm_prob=0.3,
                                     dupe_factor=2, example_mode="full_sentences")
  dataset.create([corpus], tok, d / "data", opts, heldout_every=6)
  return str(d / "data")


class _Vocab:
  cls_id, sep_id, mask_id, size = 1, 2, 3, 100
  continues_word = np.zeros(100, bool)


@pytest.mark.parametrize("mode", ["full_sentences", "doc_sentences"])
def test_packed_examples_hold_every_sentence_in_order(mode):
  """With masking off, each pass's examples are the documents' sentences in corpus order, cut into examples
  of whole sentences no longer than the sequence length; full_sentences separates documents with [SEP] and fills
  across them, doc_sentences ends an example at each document's end."""
  rng = random.Random(0)
  docs = [[[rng.randint(10, 99) for _ in range(rng.randint(3, 9))] for _ in range(rng.randint(1, 6))]
          for _ in range(12)]
  opts = pretraining.CreationOptions(max_seq_length=24, max_predictions_per_seq=1, masked_lm_prob=1e-6,
                                     dupe_factor=1, example_mode=mode)
  out = pretraining.create_packed_instances(docs, opts, _Vocab, random.Random(1))
  assert all(len(x.tokens) <= 24 and x.tokens[0] == 1 and x.tokens[-1] == 2 for x in out)
  assert all(set(x.segment_ids) == {0} and not x.is_random_next for x in out)
  def original(x):  # the tokens with the (at least one) masked position put back
    t = list(x.tokens)
    for p, label in zip(x.masked_lm_positions, x.masked_lm_labels):
      t[p] = label
    return t[1:-1]
  bodies = [original(x) for x in out]
  if mode == "doc_sentences":
    want = [[t for s in doc for t in s] for doc in docs]
    got, i = [], 0
    for doc in want:  # each document is one or more whole examples
      joined = []
      while len(joined) < len(doc):
        joined += bodies[i]
        i += 1
      got.append(joined)
    assert got == want and i == len(bodies)
  else:
    flat = [t for b in bodies for t in b]
    want = [t for doc in docs for t in [tok for s in doc for tok in s] + [2]][:-1]
    assert [t for t in flat if t != 2] == [t for t in want if t != 2]
    assert sum(len(b) for b in bodies) < len(want) + 1
    assert max(len(b) for b in bodies[:-1]) > 22 - 9  # examples fill up: no example is left short but the last


def test_masking_rate_is_one_knob():
  assert pretraining.max_predictions(128, 0.15) == 20  # the original recipe's 20
  assert pretraining.max_predictions(128, 0.3) == 39
  assert pretraining.max_predictions(1024, 0.3) == 308
  opts = pretraining.CreationOptions(max_seq_length=512, max_predictions_per_seq=0, masked_lm_prob=0.4)
  assert opts.max_predictions_per_seq == 205


def test_packed_data_has_the_rate_and_one_segment(packed_data):
  made = dataset.read_creation(packed_data)
  assert made["options"]["max_predictions_per_seq"] == 20 and made["options"]["example_mode"] == "full_sentences"
  src = dataset.load_source(packed_data, "train")
  rows = [src[i] for i in range(len(src))]
  assert all(int(np.max(r["segment_ids"])) == 0 for r in rows)
  masked = sum(float(np.sum(r["masked_lm_weights"])) for r in rows)
  tokens = sum(float(np.sum(r["input_mask"])) - 2 for r in rows)
  assert 0.27 < masked / tokens < 0.33  # 30%, as asked


def _small(c, data_dir, steps=6):
  c.data.data_dir = data_dir
  c.data.max_seq_length = 64
  c.model.vocab_size = dataset.read_creation(data_dir)["vocab_size"]
  c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = 64, 4, 96
  c.train.global_batch_size, c.train.num_steps, c.train.warmup_steps = 8, steps, 2
  c.train.learning_rate = 2e-3
  c.data.prefetch = 0
  c.log_every = c.eval_every = c.checkpoint_every = steps
  c.eval_batches = 2
  return c


@pytest.mark.slow
def test_modernbert_recipe_end_to_end_evaluates_at_its_own_rate(tmp_path, packed_data, capsys):
  """ModernBERT's first phase (64 tokens, global θ 10,000): the run, its held-out rate, its HF export and a
  fine-tuning run from it; then the context-extension recipe continues it at 128 tokens."""
  from configs import modernbert
  c = _small(modernbert.get_config("variant=tiny,seq=64,theta=10000"), packed_data)
  c.model.local_attention = 16
  summary = train.train_and_evaluate(c, str(tmp_path / "w"))
  assert summary["final_step"] == 6 and np.isfinite(summary["eval"]["mlm_loss"])
  # The held-out set is re-masked at 15% (the data was made at 30%).
  from bertjax.data.pretraining import pipeline as input_pipeline
  made = dataset.read_creation(packed_data)
  tok = tokenizer.load(made["tokenizer"])
  opts = pretraining.CreationOptions(**{**made["options"], "masked_lm_prob": 0.15})
  src = input_pipeline.Remasked(dataset.load_source(packed_data, "validation"), pretraining.Vocab.of(tok), opts, 0)
  rows = [src[i] for i in range(len(src))]
  masked = sum(float(np.sum(r["masked_lm_weights"])) for r in rows)
  rate = masked / sum(float(np.sum(r["input_mask"])) - 2 for r in rows)
  assert 0.12 < rate < 0.18
  assert all(np.array_equal(src[0][k], rows[0][k]) for k in rows[0])  # the same masks every read
  _modernbert_workdir_exports_and_fine_tunes(tmp_path, tok)
  _context_extension_continues_a_short_checkpoint_at_a_longer_length(tmp_path, packed_data, capsys)


def _modernbert_workdir_exports_and_fine_tunes(tmp_path, tok):
  """The pre-training workdir through the CLI export is HF's ModernBertForMaskedLM with bertjax's logits; a
  fine-tuning run from the workdir (learning rate 0) starts its task head from the MLM head, as HF's
  from_pretrained does, and exports as ModernBertForSequenceClassification with bertjax's probabilities."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import helpers

  from bertjax import finetune, predict
  from bertjax.cli import convert as convert_cli
  from configs import finetune as finetune_config
  w = str(tmp_path / "w")
  assert convert_cli.write(w, str(tmp_path / "mlm")) == "ModernBertForMaskedLM"
  ids = np.array([[tok.cls_id] + tok.encode("the river runs to the sea") + [tok.sep_id]], np.int32)
  batch = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids),
           "masked_lm_positions": np.arange(ids.shape[1], dtype=np.int32)[None]}
  module, params, _ = predict.load(w)
  ours = np.asarray(module.apply({"params": params}, batch)["mlm_logits"])
  hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "mlm").eval()
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(ours, theirs[..., :ours.shape[-1]], atol=1e-4)
  helpers.write_sentiment(tmp_path / "train.csv", 32, 0)
  c = finetune_config.get_config(f"task=local,init={w},lr=0,batch=16,epochs=1,seq=32")
  c.data.train_file = c.data.eval_file = str(tmp_path / "train.csv")
  c.data.text_a_column, c.data.label_column, c.data.labels = "sentence", "sentiment", ("neg", "pos")
  out = finetune.finetune(c, str(tmp_path / "ft"))
  head = out["state"].params["head"]
  np.testing.assert_array_equal(np.asarray(head["dense"]["kernel"]), np.asarray(params["mlm_transform"]["kernel"]))
  assert convert_cli.write(str(tmp_path / "ft"), str(tmp_path / "clf")) == "ModernBertForSequenceClassification"
  clf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "clf").eval()
  text = "a good river"
  ids = [tok.cls_id] + tok.encode(text) + [tok.sep_id]
  with torch.no_grad():
    probs = torch.softmax(clf(input_ids=torch.tensor([ids])).logits[0], -1).numpy()
  got = predict.predict_text(str(tmp_path / "ft"), text)["probabilities"]
  np.testing.assert_allclose([got["neg"], got["pos"]], probs, atol=1e-4)


@pytest.mark.slow
def test_switch_on_the_bert_recipe(tmp_path, data_dir):
  """--config.model.position_embedding=rotary (and the other modern switches) on the BERT recipe and data."""
  import helpers
  c = helpers.small_config(data_dir)
  c.model.position_embedding = "rotary"
  c.model.ffn = "glu"
  c.model.norm, c.model.norm_bias, c.model.layer_norm = "rmsnorm", False, "pre"
  summary = train.train_and_evaluate(c, str(tmp_path / "w"))
  assert summary["final_step"] == 6 and np.isfinite(summary["eval"]["loss"])


def test_recipe_and_data_mismatch_is_named(tmp_path, data_dir):
  from bertjax import errors
  from configs import roberta
  c = _small(roberta.get_config("variant=tiny,seq=32"), data_dir)
  c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 5
  with pytest.raises(errors.ConfigError, match="made as 'nsp_pairs'"):
    train.train_and_evaluate(c, str(tmp_path / "w"))


@pytest.mark.parametrize("kind,shape", [("cosine", "linear"), ("wsd", "sqrt"), ("wsd", "linear"),
                                        ("wsd", "cosine"), ("constant", "linear")])
def test_schedules_match_their_formulas(kind, shape):
  lr, warm, total, frac, floor = 1e-3, 10, 100, 0.2, 0.1
  fn = optim.schedule(lr, warm, total, kind, decay_fraction=frac, decay_shape=shape, final_lr_ratio=floor)
  for t in range(0, total + 1, 3):
    if t < warm:
      want = lr * t / warm
    elif kind == "constant":
      want = lr
    elif kind == "cosine":
      want = lr * floor + (lr - lr * floor) * 0.5 * (1 + math.cos(math.pi * (t - warm) / (total - warm)))
    else:
      start = total - round(total * frac)
      p = min(max((t - start) / (total - start), 0.0), 1.0)
      f = {"linear": 1 - p, "sqrt": 1 - math.sqrt(p), "cosine": 0.5 * (1 + math.cos(math.pi * p))}[shape]
      want = lr * floor + (lr - lr * floor) * f
    assert float(fn(t)) == pytest.approx(want, rel=1e-5, abs=1e-12), t


def _train_and_export(c, tmp_path, architecture):
  """Train c into tmp_path/w, then `python -m bertjax convert` it into tmp_path/hf, which must name `architecture`;
  the run's summary."""
  import helpers
  summary = train.train_and_evaluate(c, str(tmp_path / "w"))
  proc = helpers.run_cmd([helpers.sys.executable, "-m", "bertjax", "convert", "--workdir", str(tmp_path / "w"),
                          "--out", str(tmp_path / "hf")])
  assert proc.returncode == 0 and architecture in proc.stdout, proc.stderr[-2000:]
  return summary


def test_roberta_recipe_end_to_end_exports_with_its_tokenizer(tmp_path, packed_data):
  """configs/roberta.py trains MLM only; its workdir -> python -m bertjax convert -> HF AutoTokenizer +
  AutoModelForMaskedLM give bertjax's fill-in-the-blank scores."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  from bertjax import predict
  from configs import roberta
  c = _small(roberta.get_config("variant=tiny,seq=64,mask=0.3"), packed_data)
  c.model.max_position_embeddings = 66
  summary = _train_and_export(c, tmp_path, "RobertaForMaskedLM")
  assert summary["final_step"] == 6 and np.isfinite(summary["eval"]["mlm_loss"])
  assert "nsp_loss" not in summary["eval"]
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  hf = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf")).eval()
  module, params, tok = predict.load(str(tmp_path / "w"))
  text = "the model reads text"
  assert hf_tok(text, add_special_tokens=False)["input_ids"] == tok.encode(text)
  ids = [tok.cls_id] + tok.encode(text) + [tok.sep_id]
  batch = {"input_ids": np.asarray([ids], np.int32), "input_mask": np.ones((1, len(ids)), np.int32),
           "segment_ids": np.zeros((1, len(ids)), np.int32),
           "masked_lm_positions": np.arange(len(ids), dtype=np.int32)[None]}
  ours = np.asarray(module.apply({"params": params}, batch)["mlm_logits"])[0]
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor([ids])).logits.numpy()[0]
  np.testing.assert_allclose(ours, theirs, atol=1e-4)


@pytest.mark.slow
def test_electra_recipe_end_to_end(tmp_path, packed_data):
  """configs/electra.py on the small corpus: both networks train in one step, the metrics carry the
  discriminator's accuracy beside its all-original baseline, a stopped run resumes to the same state, and
  python -m bertjax convert writes HF's discriminator and generator folders, each with the tokenizer, HF's
  discriminator giving bertjax's replaced-token logits."""
  import jax

  from configs import electra
  def config(stop=0):
    c = _small(electra.get_config("variant=tiny,seq=64,preds=20"), packed_data, steps=6)
    c.model.embedding_size = 32
    c.train.stop_after_steps = stop
    return c
  whole = _train_and_export(config(), tmp_path, "ElectraForPreTraining")
  ev = whole["eval"]
  assert whole["final_step"] == 6 and np.isfinite(ev["loss"])
  assert {"disc_accuracy", "disc_baseline_accuracy", "mlm_accuracy", "sampled_accuracy"} <= set(ev)
  assert ev["loss"] == pytest.approx(ev["mlm_loss"] + 50 * ev["disc_loss"], rel=1e-5)
  train.train_and_evaluate(config(stop=3), str(tmp_path / "b"))
  resumed = train.train_and_evaluate(config(), str(tmp_path / "b"))
  for a, b in zip(jax.tree_util.tree_leaves(jax.device_get(whole["state"].params)),
                  jax.tree_util.tree_leaves(jax.device_get(resumed["state"].params))):
    np.testing.assert_array_equal(a, b)
  _electra_export_gives_bertjax_logits(tmp_path, packed_data, config())


def _electra_export_gives_bertjax_logits(tmp_path, packed_data, c):
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  from bertjax import model as model_lib
  from bertjax.core import checkpoint as checkpoint_lib
  from bertjax.objectives import electra as electra_lib
  disc = transformers.AutoModelForPreTraining.from_pretrained(str(tmp_path / "hf" / "discriminator")).eval()
  assert (tmp_path / "hf" / "generator" / "vocab.json").exists()
  src = dataset.load_source(packed_data, "validation")
  b = {k: np.stack([np.asarray(src[i][k]) for i in range(4)]) for k in ("input_ids", "input_mask", "segment_ids")}
  params = electra_lib.split(checkpoint_lib.Checkpointer(str(tmp_path / "w")).restore_params())[0]
  cfg = model_lib.BertConfig.from_dict(c.model.to_dict())
  ours = np.asarray(electra_lib.ElectraDiscriminator(cfg).apply({"params": params}, b)["disc_logits"])
  with torch.no_grad():
    theirs = disc(input_ids=torch.tensor(b["input_ids"], dtype=torch.long),
                  attention_mask=torch.tensor(b["input_mask"], dtype=torch.long)).logits.numpy()
  valid = b["input_mask"] > 0
  np.testing.assert_allclose(ours[valid], theirs[valid], atol=1e-4)


@pytest.mark.slow
def test_electra_generator_held_fixed_from_freeze_step(tmp_path, packed_data):
  """electra.freeze_generator_at=N: the generator's parameters after step N are bitwise those at N (AdamW's
  momentum and decay included) while the discriminator and the shared embeddings keep training; before N both
  networks train."""
  import jax

  from bertjax.objectives import electra as electra_lib
  from configs import electra

  def run(workdir, stop, freeze=2):
    c = _small(electra.get_config("variant=tiny,seq=64,preds=20"), packed_data, steps=4)
    c.model.embedding_size = 32
    c.electra.freeze_generator_at = freeze
    c.train.stop_after_steps = stop
    c.checkpoint_every = 1
    state = train.train_and_evaluate(c, str(tmp_path / workdir))["state"]
    return jax.device_get(state.params)

  def leaves(tree):
    return jax.tree_util.tree_leaves(tree)

  start = run("init", 1)
  at_freeze = run("w", 2)
  end = run("w", 0)
  for a, b in zip(leaves(at_freeze["generator"]), leaves(end["generator"])):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(leaves(start["generator"]), leaves(at_freeze["generator"])))
  for part in ("discriminator", "embeddings"):
    assert all(not np.array_equal(a, b) for a, b in zip(leaves(at_freeze[part]), leaves(end[part])) if a.size > 1)
  assert set(electra_lib.split(end)[0]) >= {"bert"}
  c = electra.get_config("variant=tiny")
  c.electra.freeze_generator_at = -1
  with pytest.raises(train.ConfigError, match="freeze_generator_at must be a step >= 0"):
    train.validate(c, 1)


def _context_extension_continues_a_short_checkpoint_at_a_longer_length(tmp_path, packed_data, capsys):
  """The context-extension recipe at 128 tokens from phase one's workdir (tmp_path/w): the run starts from phase
  one's weights, says which θ and length each uses, runs its global layers at θ 160,000 on the blockwise
  attention, and trains."""
  import jax

  from bertjax.convert import weights
  from configs import modernbert
  d = tmp_path / "long_data"
  d.mkdir()
  made = dataset.read_creation(packed_data)
  opts = pretraining.CreationOptions(max_seq_length=128, max_predictions_per_seq=0, masked_lm_prob=0.3, dupe_factor=2,
                                     example_mode="full_sentences")
  dataset.create([_corpus(d)], made["tokenizer"], d / "data", opts, heldout_every=6)
  c = _small(modernbert.get_config(f"variant=tiny,context=128,init={tmp_path / 'w'}"), str(d / "data"))
  c.model.local_attention, c.data.max_seq_length = 16, 128
  assert (c.model.rope_theta, c.model.rope_theta_local, c.model.attention_impl) == (160_000.0, 10_000.0, "blockwise")
  capsys.readouterr()
  summary = train.train_and_evaluate(c, str(tmp_path / "long"))
  said = capsys.readouterr().out
  assert ("trained with rotary θ 10000 global / 10000 local at 64 tokens; this run uses rotary θ 160000 global / "
          "10000 local at 128 tokens") in said, said
  assert summary["final_step"] == 6 and np.isfinite(summary["eval"]["mlm_loss"])
  # Step 0's weights were phase one's: the long run's first checkpoint moved away from them by one schedule's worth.
  a = weights.load(str(tmp_path / "w"), head="pretraining").params
  b = weights.load(str(tmp_path / "long"), head="pretraining").params
  diffs = [float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in
           zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))]
  assert 0 < max(diffs) < 0.05, max(diffs)
  with pytest.raises(ValueError, match="give init=PATH"):
    modernbert.get_config("variant=tiny,context=128")


@pytest.mark.slow
def test_deberta_v3_recipe_end_to_end(tmp_path, packed_data):
  """configs/deberta_v3.py (RTD with gradient-disentangled embedding sharing on disentangled attention) on the
  small corpus: both networks train, the loss is L_gen + 50·L_disc, and python -m bertjax convert writes the
  discriminator as HF's DebertaV2Model, whose hidden states are bertjax's discriminator's (its table E + Δ)."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  from bertjax import model as model_lib
  from bertjax.core import checkpoint as checkpoint_lib
  from bertjax.objectives import electra as electra_lib
  from configs import deberta_v3
  c = _small(deberta_v3.get_config("variant=tiny,seq=64,preds=20"), packed_data, steps=6)
  summary = _train_and_export(c, tmp_path, "DebertaV2Model")
  ev = summary["eval"]
  assert summary["final_step"] == 6 and ev["loss"] == pytest.approx(ev["mlm_loss"] + 50 * ev["disc_loss"], rel=1e-5)
  params = checkpoint_lib.Checkpointer(str(tmp_path / "w")).restore_params()
  assert float(np.abs(np.asarray(params["gdes"]["delta"])).max()) > 0  # the discriminator trained its delta
  disc = electra_lib.split(params)[0]
  src = dataset.load_source(packed_data, "validation")
  b = {k: np.stack([np.asarray(src[i][k]) for i in range(4)]) for k in ("input_ids", "input_mask", "segment_ids")}
  cfg = model_lib.BertConfig.from_dict(c.model.to_dict())
  ours = np.asarray(model_lib.BertModel(cfg).apply({"params": disc["bert"]}, b, pool=False)["hidden"])
  hf = transformers.AutoModel.from_pretrained(str(tmp_path / "hf" / "discriminator")).eval()
  assert type(hf).__name__ == "DebertaV2Model"
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(b["input_ids"], dtype=torch.long),
                attention_mask=torch.tensor(b["input_mask"], dtype=torch.long)).last_hidden_state.numpy()
  valid = b["input_mask"] > 0
  np.testing.assert_allclose(ours[valid], theirs[valid], atol=1e-4)
