"""bertjax's fine-tuning loop step by step against an HF transformers PyTorch loop (bertjax.parity), every head.

Same start (an HF folder of the task's model), the same examples in the same order, dropout off, the same AdamW
and schedule: the loss of every step agrees to ~1e-5 relative and the parameter updates to ~1e-3. The HF side
featurises the raw examples with HF's own tokenizer, so featurisation, padding, the head, the loss, the
weight-decay mask, clipping and the schedule are all under test.
"""
import csv
import json
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bertjax import tasks as tasks_lib  # noqa: E402
from bertjax.cli import parity  # noqa: E402
from bertjax.data import tokenizer  # noqa: E402
from configs import finetune as finetune_config  # noqa: E402

WORDS = ("alpha beta gamma delta river mountain city island harbour north south east west old new great small "
         "good bad fine poor nice awful Zanzibar Pemba Island king queen John Smith Paris London").split()


@pytest.fixture(scope="module")
def hf_init(tmp_path_factory, make_vocab):
  """A 2-layer HF BertModel with a WordPiece vocabulary trained on the words above."""
  d = tmp_path_factory.mktemp("parity_init")
  vocab = make_vocab(WORDS, 200)
  n = tokenizer.load(vocab).vocab_size
  torch.manual_seed(0)
  m = transformers.BertModel(transformers.BertConfig(vocab_size=n, hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=4, intermediate_size=64,
                                                     max_position_embeddings=64))
  with torch.no_grad():  # non-zero biases and LayerNorm shifts, so that every mapped tensor matters
    for name, p in m.named_parameters():
      if name.endswith("bias"):
        p.add_(torch.randn_like(p) * 0.1)
  m.save_pretrained(d / "hf")
  (d / "hf" / "vocab.txt").write_text(open(vocab, encoding="utf-8").read())
  (d / "hf" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
  return str(d / "hf")


def sentence(rng, n):
  return " ".join(rng.choice(WORDS) for _ in range(n))


def config_for(task, hf_init, seq=32, **data):
  c = finetune_config.get_config(f"task={task},init={hf_init},lr=2e-3,batch=8,epochs=2,seq={seq}")
  c.unlock()
  for k, v in data.items():
    c.data[k] = v
  c.train.schedule = "linear_from_warmup"
  c.train.warmup_fraction = 0.25
  c.checkpoint_every = 0
  return c


def check(report, loss_rtol=2e-5, update_rtol=2e-3):
  assert len(report.bertjax_losses) == len(report.hf_losses) > 0
  assert report.max_loss_rel_diff < loss_rtol, list(zip(report.bertjax_losses, report.hf_losses))
  assert report.update_rel_diff < update_rtol, report.worst_params
  assert report.update_norm > 1e-2  # the run moved the parameters (lr 2e-3 over ~10 steps)


@pytest.mark.parametrize("pair,labels", [(False, ("neg", "pos")),
                                         pytest.param(True, ("a", "b", "c"), marks=pytest.mark.slow)])
def test_sequence_classification_matches_hf(tmp_path, hf_init, pair, labels):
  rng = random.Random(1)
  with open(tmp_path / "train.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["text_a", "text_b", "label"])
    for i in range(37):  # not a multiple of the batch: the last batch of each epoch is partial
      # lengths up to 40 words: some pairs are truncated to seq 32 (the longer side loses tokens first)
      w.writerow([sentence(rng, rng.randint(2, 40)), sentence(rng, rng.randint(1, 9)) if pair else "",
                  labels[i % len(labels)]])
  c = config_for("local", hf_init, train_file=str(tmp_path / "train.csv"), text_b_column="text_b" if pair else "",
                 labels=labels)
  check(parity.compare(c, str(tmp_path / "run")))


def test_regression_matches_hf(tmp_path, hf_init):
  rng = random.Random(2)
  with open(tmp_path / "train.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["text_a", "text_b", "label"])
    for _ in range(30):
      w.writerow([sentence(rng, rng.randint(2, 10)), sentence(rng, rng.randint(2, 10)), round(rng.random() * 5, 2)])
  c = config_for("local", hf_init, train_file=str(tmp_path / "train.csv"), text_b_column="text_b", regression=True)
  check(parity.compare(c, str(tmp_path / "run")))


def test_token_classification_matches_hf(tmp_path, hf_init):
  rng = random.Random(3)
  tags = ("O", "B-LOC", "I-LOC", "B-PER", "I-PER")
  lines = []
  for _ in range(29):
    for _ in range(rng.randint(1, 14)):
      # capitalised names split into several word pieces: labels go on the first piece only
      lines.append(f"{rng.choice(WORDS)}{rng.choice(['', 'x', 'Zanzibar'])} {rng.choice(tags)}")
    lines.append("")
  (tmp_path / "train.conll").write_text("\n".join(lines) + "\n")
  c = config_for("ner", hf_init, train_file=str(tmp_path / "train.conll"), labels=tags)
  check(parity.compare(c, str(tmp_path / "run")))


def test_question_answering_matches_hf(tmp_path, hf_init):
  rng = random.Random(4)
  data = []
  for i in range(20):
    before, after = sentence(rng, rng.randint(3, 30)), sentence(rng, rng.randint(3, 30))
    answer = "Zanzibar Pemba Island"
    context = f"{before} {answer} {after}"
    data.append({"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": f"q{i}", "question": sentence(rng, 4),
         "answers": [{"text": answer, "answer_start": len(before) + 1}]}]}]})
  (tmp_path / "train.json").write_text(json.dumps({"version": "1.1", "data": data}))
  c = config_for("squad_json", hf_init, seq=48, train_file=str(tmp_path / "train.json"), doc_stride=16,
                 max_query_length=8)
  check(parity.compare(c, str(tmp_path / "run")))


def test_the_harness_catches_a_different_recipe(tmp_path, hf_init):
  """A loop that differs (here: bertjax on the original schedule, HF on its own) fails the comparison."""
  rng = random.Random(5)
  with open(tmp_path / "train.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["text_a", "label"])
    for i in range(40):
      w.writerow([sentence(rng, rng.randint(2, 10)), ("neg", "pos")[i % 2]])
  c = config_for("local", hf_init, train_file=str(tmp_path / "train.csv"), labels=("neg", "pos"))
  real = parity.hf_lr_lambda
  parity.hf_lr_lambda = lambda schedule, w, t: real("linear" if schedule != "linear" else "linear_from_warmup", w, t)
  try:
    report = parity.compare(c, str(tmp_path / "run"))
  finally:
    parity.hf_lr_lambda = real
  assert report.max_loss_rel_diff > 1e-4 or report.update_rel_diff > 1e-2


def test_start_folder_loads_the_head_in_both(tmp_path, hf_init):
  """The start folder holds HF's head; bertjax's fine-tuning init takes it (HF's from_pretrained does too)."""
  from bertjax import finetune
  c = config_for("ner", hf_init, labels=("O", "B-X", "I-X"))
  task = tasks_lib.get("ner", ("O", "B-X", "I-X"))
  start = parity.make_start(c, task, str(tmp_path / "start"))
  c.init = start
  _, _, params, _, _ = finetune.load_init(c, task)
  theirs = transformers.BertForTokenClassification.from_pretrained(start).classifier.weight.detach().numpy()
  np.testing.assert_array_equal(params["classifier"]["kernel"], theirs.T)
  assert "pooler" not in params["bert"]  # HF's token-classification model has none; a fresh one is used


def test_linear_from_warmup_is_hfs_schedule():
  from bertjax.core import optim
  p = torch.nn.Parameter(torch.zeros(1))
  opt = torch.optim.SGD([p], lr=1.0)
  sched = transformers.get_linear_schedule_with_warmup(opt, 10, 100)
  ours = optim.schedule(1.0, 10, 100, "linear_from_warmup")
  for t in range(101):
    assert abs(float(ours(t)) - opt.param_groups[0]["lr"]) < 1e-6, t
    opt.step()
    sched.step()


@pytest.fixture(scope="module")
def family_inits(tmp_path_factory):
  """2-layer HF RoBERTa, ModernBERT and ELECTRA encoders with a byte-level BPE trained on the words above."""
  d = tmp_path_factory.mktemp("family_inits")
  rng = random.Random(0)
  (d / "corpus.txt").write_text("\n".join(sentence(rng, 12) for _ in range(300)))
  path = tokenizer.train([str(d / "corpus.txt")], str(d / "tok"), kind="byte_bpe", vocab_size=300)
  n = tokenizer.load(path).vocab_size
  sizes = dict(vocab_size=n, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
  out = {}
  for family, cfg in (("roberta", transformers.RobertaConfig(**sizes, max_position_embeddings=66, type_vocab_size=1,
                                                             pad_token_id=1)),
                      ("modernbert", transformers.ModernBertConfig(**sizes, max_position_embeddings=64,
                                                                   local_attention=8, global_attn_every_n_layers=2,
                                                                   pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                                                   cls_token_id=0, sep_token_id=2)),
                      ("electra", transformers.ElectraConfig(**sizes, embedding_size=16, max_position_embeddings=64,
                                                             pad_token_id=1))):
    torch.manual_seed(0)
    m = transformers.AutoModel.from_config(cfg)
    with torch.no_grad():
      for name, p in m.named_parameters():
        if name.endswith("bias") or "norm" in name:
          p.add_(torch.randn_like(p) * 0.1)
    m.save_pretrained(d / family)
    for f in ("vocab.json", "merges.txt"):
      (d / family / f).write_bytes((d / "tok" / f).read_bytes())
    out[family] = str(d / family)
  return out


# Two of the six pairs run by default (each family's tagging and classification heads are the shared ones); all six
# run with -m slow.
@pytest.mark.parametrize("kind,family", [
    (kind, family) if (kind, family) in (("tagging", "roberta"), ("classification", "modernbert"))
    else pytest.param(kind, family, marks=pytest.mark.slow)
    for kind in ("classification", "tagging") for family in ("roberta", "modernbert", "electra")])
def test_family_fine_tuning_matches_hf(tmp_path, family_inits, family, kind):
  """The family's own head (RobertaClassificationHead, ModernBERT's prediction head, ElectraClassificationHead) in
  the real fine-tuning loop
  against HF's model of the family: featurised by HF's tokenizer, AdamW with HF Trainer's decay groups."""
  rng = random.Random(2)
  if kind == "classification":
    with open(tmp_path / "train.csv", "w", newline="") as f:
      w = csv.writer(f)
      w.writerow(["text_a", "label"])
      for i in range(27):
        w.writerow([sentence(rng, rng.randint(2, 30)), ("neg", "pos")[i % 2]])
    c = config_for("local", family_inits[family], train_file=str(tmp_path / "train.csv"), labels=("neg", "pos"))
  else:
    lines = []
    for _ in range(27):
      for word in rng.sample(WORDS, rng.randint(3, 9)):
        lines.append(f"{word} {'B-PER' if word in ('John', 'Smith', 'king', 'queen') else 'O'}")
      lines.append("")
    (tmp_path / "train.conll").write_text("\n".join(lines))
    c = config_for("ner", family_inits[family], train_file=str(tmp_path / "train.conll"), labels=("O", "B-PER"))
  # ModernBERT's GLU, rotary and pre-norm stack round differently in float32: its losses agree to ~3e-5.
  check(parity.compare(c, str(tmp_path / "run")), loss_rtol=5e-5 if family == "modernbert" else 2e-5)
