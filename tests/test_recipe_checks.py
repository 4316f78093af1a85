"""The checks of the recipes' moving parts, each from a user's report: an init checkpoint's `init_step` honoured by
init_optimizer=reset, dynamic masking at a cap other than the data's (configs/continued.py at any seq), data of
another vocabulary named once with its fix (configs/modernbert_phases.py's vocab=), and a phased run's plan held
fixed across resumes and written into its metrics rows."""
from pathlib import Path

import helpers as tt
import jax
import ml_collections
import numpy as np
import pytest

from bertjax import errors
from bertjax import pretrain as train
from bertjax.core import checkpoint as checkpoint_lib
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data.pretraining import dataset
from bertjax.data.pretraining import examples as pretraining
from bertjax.data.pretraining import pipeline as input_pipeline
from bertjax.pretrain import checks, plan, start
from configs import common, continued, modernbert_phases


def vocab_file(data_dir) -> str:
  return str(Path(data_dir).parent / "tok" / "vocab.txt")


def phased(data_dir, more, **over):
  """Two phases on two sources of the small model (dynamic masking): 'first' 3 steps at 15% masking with the mixture
  web 0.75 / more 0.25, 'second' 3 steps at 10% with 0.5 / 0.5."""
  c = tt.small_config(data_dir)
  c.unlock()
  c.data.data_dir = ""
  c.data.sources = ml_collections.ConfigDict({"web": data_dir, "more": more})
  c.data.dynamic_masking = True
  c.train.num_steps = 0
  c.eval_every, c.checkpoint_every, c.keep_checkpoints = 0, 3, 3
  c.phases = ml_collections.ConfigDict({
      "first": common.phase(steps=3, mixture="web=0.75,more=0.25", masked_lm_prob=0.15),
      "second": common.phase(steps=3, mixture="web=0.5,more=0.5", masked_lm_prob=0.1)})
  c.phase_order = "first,second"
  for key, value in over.items():
    node, _, leaf = key.rpartition(".")
    target = c
    for part in node.split(".") if node else []:
      target = target[part]
    target[leaf] = value
  c.lock()
  return c


@pytest.fixture(scope="module")
def more_data(data_dir, tmp_path_factory):
  """A second source made with data_dir's tokenizer and options (seq 32, 5 predictions)."""
  out = tmp_path_factory.mktemp("more") / "data"
  opts = pretraining.CreationOptions(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1, random_seed=7)
  dataset.create([Path(data_dir).parent / "corpus.txt"], vocab_file(data_dir), out, opts, heldout_every=8)
  return str(out)


@pytest.fixture(scope="module")
def phased_run(data_dir, more_data, tmp_path_factory):
  """The two-phase run, trained to its end: its workdir (checkpoints at steps 3 and 6)."""
  w = tmp_path_factory.mktemp("phased") / "w"
  summary = train.train_and_evaluate(phased(data_dir, more_data), str(w))
  assert summary["final_step"] == 6
  return w


# ----------------------------------------------------------------------------- 1: init_step with reset
class _Stop(Exception):
  pass


def test_reset_init_loads_the_params_of_init_step(phased_run, data_dir, tmp_path, monkeypatch):
  """init_optimizer=reset with init_step=3 starts from step 3's parameters (where the rate is looked up), not the
  workdir's newest (6); a step the workdir lacks is one line naming the steps it holds."""
  ckpt = checkpoint_lib.Checkpointer(str(phased_run), read_only=True)
  assert ckpt.steps() == [3, 6]
  at3, at6 = ckpt.restore_params(3), ckpt.restore_params(6)
  ckpt.manager.close()
  seen = {}
  real = start.fit_init_params

  def capture(init, abstract, path, announce=print):
    seen["init"] = init
    raise _Stop  # the params are what this test reads: no need to train
  monkeypatch.setattr(start, "fit_init_params", capture)
  c = tt.small_config(data_dir, num_steps=1)
  c.unlock()
  c.init_checkpoint, c.init_step, c.init_optimizer, c.eval_every = str(phased_run), 3, "reset", 0
  c.lock()
  with pytest.raises(_Stop):
    train.train_and_evaluate(c, str(tmp_path / "a"))
  got = jax.tree_util.tree_leaves(seen["init"]["bert"])
  assert len(got) == len(jax.tree_util.tree_leaves(at3["bert"]))
  for x, y in zip(got, jax.tree_util.tree_leaves(at3["bert"])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert any(not np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(got, jax.tree_util.tree_leaves(at6["bert"])))
  monkeypatch.setattr(start, "fit_init_params", real)
  c.unlock()
  c.init_step = 5
  c.lock()
  with pytest.raises(errors.ConfigError) as e:
    train.train_and_evaluate(c, str(tmp_path / "b"))
  assert "\n" not in str(e.value) and "init_step 5" in str(e.value) and "[3, 6]" in str(e.value)


# ----------------------------------------------------------------------------- 2: dynamic masking's own cap
def test_dynamic_masking_may_read_data_made_with_another_cap(data_dir):
  """The data holds 5 predictions a row; a dynamic run at 3 or 8 is accepted and its rows hold its own cap with the
  original tokens kept; a static run at another cap is refused with the fix."""
  creation = dataset.read_creation(data_dir)
  vocab = pretraining.Vocab.of(tokenizer_lib.load(*dataset.tokenizer_of(data_dir, creation)))
  source = dataset.load_source(data_dir, "train")
  for cap in (3, 8):
    c = tt.small_config(data_dir)
    c.unlock()
    c.data.dynamic_masking, c.data.max_predictions_per_seq = True, cap
    c.lock()
    checks.validate(c, 1, creation)
    opts = pretraining.CreationOptions(**{**creation["options"], "max_predictions_per_seq": cap})
    fn = input_pipeline.fit_predictions(input_pipeline.dynamic_masking(vocab, opts, 0), cap)
    for g in range(8):
      ex = dict(source[g])
      out = fn(ex, g)
      assert all(len(out[k]) == cap for k in input_pipeline.PREDICTION_KEYS)
      assert 0 < out["masked_lm_weights"].sum() <= cap
      np.testing.assert_array_equal(pretraining.unmask(out), pretraining.unmask(ex))
  c = tt.small_config(data_dir)
  c.unlock()
  c.data.dynamic_masking, c.data.max_predictions_per_seq = False, 8
  c.lock()
  with pytest.raises(errors.ConfigError, match="was made with 5: set --config.data.max_predictions_per_seq=5"):
    checks.validate(c, 1, creation)


def test_continued_recipe_reads_data_made_as_its_docstring_says(phased_run, data_dir, tmp_path):
  """configs/continued.py at seq 32 (cap 5 at 15%) on FULL-SENTENCES data made without --max_predictions_per_seq
  (the tool's 20): accepted, and it trains."""
  opts = pretraining.CreationOptions(max_seq_length=32, example_mode="full_sentences", dupe_factor=1)
  assert opts.max_predictions_per_seq == 20
  data = tmp_path / "full"
  dataset.create([Path(data_dir).parent / "corpus.txt"], vocab_file(data_dir), data, opts, heldout_every=8)
  c = continued.get_config(f"init={phased_run},seq=32,batch=16,steps=2")
  c.unlock()
  c.data.data_dir, c.data.prefetch, c.eval_every, c.model.max_position_embeddings = str(data), 0, 0, 64
  c.lock()
  creation = dataset.read_creation(str(data))
  checks.validate(c, 1, creation)
  assert c.data.max_predictions_per_seq == 5
  summary = train.train_and_evaluate(c, str(tmp_path / "w"))
  assert summary["final_step"] == 2 and np.isfinite(summary["train"]["loss"])


# ----------------------------------------------------------------------------- 3: the vocabulary's fix
def test_modernbert_phases_takes_vocab_and_the_refusal_names_the_fix(data_dir):
  made = dataset.read_creation(data_dir)["vocab_size"]
  arg = (f"variant=tiny,data={data_dir},long_data={data_dir},seq=32,long_seq=32,batch=16,batch_from=8,"
         f"tokens={16 * 32 * 4},long_tokens={16 * 32 * 2},decay_tokens={16 * 32 * 2},batch_warmup_tokens=0,"
         f"warmup_tokens=512,lr=1e-3,shard=dp")

  def problems(config):
    creations, unread = plan.read_creations(config)
    assert not unread
    with pytest.raises(errors.ConfigError) as e:
      checks.validate(config, 1, None, creations=creations)
    assert "\n" not in str(e.value)
    return str(e.value)
  said = problems(modernbert_phases.get_config(arg))  # 50,368 by default; data of `made`: also other mistakes
  assert said.count("--config.model.vocab_size") == 1 and said.count("cannot change the vocabulary") == 1, said
  assert f"--config.model.vocab_size={made}" in said and f"vocab={made}" in said
  c = modernbert_phases.get_config(f"{arg},vocab={made}")
  assert c.model.vocab_size == made
  assert "vocabulary" not in problems(c)  # what is left: the recipe's 30% masking against this data's


# ----------------------------------------------------------------------------- 4: the phase plan on resume
def test_a_phased_run_writes_its_phase_masking_and_mixture_per_row(phased_run):
  rows = {r["step"]: r for r in tt.metrics_rows(phased_run) if r["split"] == "train"}
  assert sorted(rows) == [1, 2, 3, 4, 5, 6]
  for step in (1, 3):
    assert rows[step]["phase"] == 0 and rows[step]["masked_lm_prob"] == pytest.approx(0.15)
    assert rows[step]["mixture/web"] == pytest.approx(0.75) and rows[step]["mixture/more"] == pytest.approx(0.25)
  for step in (4, 6):
    assert rows[step]["phase"] == 1 and rows[step]["masked_lm_prob"] == pytest.approx(0.1)
    assert rows[step]["mixture/web"] == pytest.approx(0.5) and rows[step]["mixture/more"] == pytest.approx(0.5)


@pytest.mark.parametrize("field,value", [("phases.second.steps", 4), ("phases.second.masked_lm_prob", 0.05),
                                         ("phases.first.mixture", "web=0.5,more=0.5"),
                                         ("phase_order", "first")])
def test_a_resume_that_changes_the_phase_plan_is_refused(phased_run, data_dir, more_data, field, value):
  before = (phased_run / "config.json").read_text()
  with pytest.raises(errors.ConfigError) as e:
    train.train_and_evaluate(phased(data_dir, more_data, **{field: value}), str(phased_run))
  said = str(e.value)
  assert "\n" not in said and f"{field} " in said and "resume it with its own settings" in said
  assert (phased_run / "config.json").read_text() == before
