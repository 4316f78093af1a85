"""Checkpoints written before the trainer core, the task plug-ins and the model package existed still restore.

tests/data/checkpoints_v0 holds a 2-step pre-training workdir (scanned layers) and a fine-tuned sentence
classifier made from it (its training checkpoint and best parameters), written by bertjax at commit 9c0724a, and
reference_outputs.npz: a batch and the MLM, NSP and classifier logits bertjax computed on it at that commit (from
those checkpoints, with that commit's own loaders and model). checkpoints_v1/electra is the same for ELECTRA at
4763e1c. tests/data/make_compat_references.py recomputes the references in a worktree of each of those commits.
Today's loaders and models must give those outputs.
"""
import json
import os
import shutil
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest
import skip_guard

from bertjax import finetune, predict
from bertjax import model as model_lib
from bertjax import pretrain as train
from bertjax.convert import weights
from bertjax.core import checkpoint as checkpoint_lib

V0 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "checkpoints_v0")


def test_a_pre_training_checkpoint_from_before_restores_whole():
  w = os.path.join(V0, "pretrain")
  with open(os.path.join(w, "config.json"), encoding="utf-8") as f:
    config = ml_collections.ConfigDict(json.load(f))
  mcfg = model_lib.BertConfig.from_dict(config.model.to_dict())
  run = train.build(config, mcfg, jax.devices()[:1])
  state, data_state, step = checkpoint_lib.Checkpointer(w).restore(run.abstract)
  assert step == 2 and data_state["step"] == 2 and int(state.step) == 2
  # The one weight loader reads the same parameters, in either layer layout.
  loaded = weights.load(w)
  assert loaded.source == "pretraining" and loaded.cfg.scan_layers
  for a, b in zip(jax.tree_util.tree_leaves(loaded.params), jax.tree_util.tree_leaves(jax.device_get(state.params))):
    np.testing.assert_array_equal(a, b)
  flat = train.load_init_params(w, mcfg.replace(scan_layers=False))
  assert "layer_1" in flat["bert"]["encoder"]
  ids = np.full((1, 8), 5, np.int32)
  batch = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids),
           "masked_lm_positions": np.array([[1, 2]], np.int32)}
  out = model_lib.BertForPreTraining(mcfg.replace(scan_layers=False)).apply({"params": flat}, batch)
  assert out["mlm_logits"].shape == (1, 2, mcfg.vocab_size) and np.isfinite(out["mlm_logits"]).all()
  # The outputs bertjax computed from this checkpoint when it was written.
  ref = np.load(os.path.join(V0, "reference_outputs.npz"))
  batch = {k: ref[k] for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")}
  out = model_lib.BertForPreTraining(loaded.cfg).apply({"params": loaded.params}, batch)
  np.testing.assert_allclose(out["mlm_logits"], ref["mlm_logits"], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(out["nsp_logits"], ref["nsp_logits"], atol=1e-6, rtol=1e-5)


def test_a_fine_tuned_workdir_from_before_predicts_and_resumes(tmp_path):
  ft = tmp_path / "finetune"
  shutil.copytree(os.path.join(V0, "finetune"), ft)
  meta = json.loads((ft / "finetune.json").read_text())
  meta["tokenizer"] = os.path.join(V0, "vocab.txt")  # the path it was written with is gone
  (ft / "finetune.json").write_text(json.dumps(meta))
  pred = predict.predict_text(str(ft), text="the model reads text")
  _, _, module, params, _ = predict.load_finetuned(str(ft))
  ref = np.load(os.path.join(V0, "reference_outputs.npz"))
  logits = module.apply({"params": params}, {k: ref[k] for k in ("input_ids", "input_mask", "segment_ids")})["logits"]
  np.testing.assert_allclose(logits, ref["classifier_logits"], atol=1e-6, rtol=1e-5)  # as it was at 9c0724a
  # Exported, HF's own model of the old checkpoint gives the same probabilities and label.
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  from bertjax.cli import convert as convert_cli
  convert_cli.write(str(ft), str(tmp_path / "hf"))
  hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  hf_clf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
  with torch.no_grad():
    probs = torch.softmax(hf_clf(**hf_tok("the model reads text", return_tensors="pt")).logits[0], -1).numpy()
  np.testing.assert_allclose([pred["probabilities"]["a"], pred["probabilities"]["b"]], probs, atol=1e-4)
  assert pred["label"] == ("a", "b")[int(np.argmax(probs))]
  # Its training checkpoint restores into the state the fine-tuning loop builds today.
  _, task, module, params, _ = predict.load_finetuned(str(ft))
  from bertjax.core import optim, trainer
  tx, lr_fn = optim.make(ml_collections.ConfigDict({**json.loads((ft / "config.json").read_text())["train"],
                                                    "num_steps": 3, "warmup_steps": 0}))
  ids = np.zeros((8, 32), np.int32)
  dummy = {"input_ids": ids, "input_mask": ids + 1, "segment_ids": ids, "labels": np.zeros(8, np.int32),
           "example_weights": np.ones(8, np.float32)}
  config = ml_collections.ConfigDict(json.loads((ft / "config.json").read_text()))
  t = trainer.build(config, module, tx, lr_fn, dummy, *finetune.make_steps(module, task, tx, lr_fn),
                    devices=jax.devices()[:1], train_scalars=2)
  state, saved, step = checkpoint_lib.Checkpointer(str(ft)).restore(t.abstract)
  assert step == 3 and saved["total_steps"] == 3 and isinstance(state, trainer.TrainState)
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(jax.device_get(state.params))):
    assert a.shape == b.shape


V1 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "checkpoints_v1")


def test_an_electra_workdir_from_before_the_objective_plugins_restores_loads_and_exports(tmp_path):
  """tests/data/checkpoints_v1/electra: a 2-step ELECTRA pre-training workdir (hidden 16) with its tokenizer copy,
  written by bertjax at commit 4763e1c, before objectives were plug-ins."""
  from bertjax import objectives
  from bertjax.cli import convert as convert_cli
  w = os.path.join(V1, "electra")
  with open(os.path.join(w, "config.json"), encoding="utf-8") as f:
    config = ml_collections.ConfigDict(json.load(f))
  assert objectives.get(config).name == "electra"
  mcfg = model_lib.BertConfig.from_dict(config.model.to_dict())
  run = train.build(config, mcfg, jax.devices()[:1])
  state, data_state, step = checkpoint_lib.Checkpointer(w).restore(run.abstract)
  assert step == 2 and int(state.step) == 2 and set(state.params) == {"discriminator", "generator", "embeddings"}
  loaded = weights.load(w)  # the discriminator with the shared embeddings, the data folder long gone
  assert loaded.tokenizer == os.path.join(w, "tokenizer", "vocab.txt") and "bert" in loaded.params
  got = dict(jax.tree_util.tree_leaves_with_path(loaded.params["bert"]["encoder"]))
  want = jax.device_get(state.params["discriminator"]["bert"]["encoder"])
  for path, leaf in jax.tree_util.tree_leaves_with_path(want):
    np.testing.assert_array_equal(got[path], leaf)
  ref = np.load(os.path.join(w, "reference_outputs.npz"))  # computed at 4763e1c from this checkpoint
  batch = {k: ref[k] for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")}
  from bertjax.objectives import electra
  disc, gen = electra.split(jax.device_get(state.params))
  gen_cfg = electra.generator_config(mcfg, config.electra.generator_hidden, config.electra.generator_layers)
  np.testing.assert_allclose(electra.ElectraDiscriminator(mcfg).apply({"params": disc}, batch)["disc_logits"],
                             ref["disc_logits"], atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(model_lib.BertForPreTraining(gen_cfg).apply({"params": gen}, batch)["mlm_logits"],
                             ref["generator_mlm_logits"], atol=1e-5, rtol=1e-5)
  arch = convert_cli.write(w, str(tmp_path / "hf"))
  assert arch == "ElectraForPreTraining + ElectraForMaskedLM"
  for sub, name in (("discriminator", "ElectraForPreTraining"), ("generator", "ElectraForMaskedLM")):
    hf = json.loads((tmp_path / "hf" / sub / "config.json").read_text())
    assert hf["architectures"] == [name] and (tmp_path / "hf" / sub / "vocab.txt").exists()


@pytest.mark.slow
def test_the_references_are_what_the_writing_commits_compute():
  """The stored outputs are recomputed by the code of the commits that wrote the checkpoints (git worktrees)."""
  here = os.path.dirname(os.path.abspath(__file__))
  for commit in ("9c0724a", "4763e1c"):
    if subprocess.run(["git", "-C", here, "cat-file", "-e", commit], capture_output=True).returncode:
      skip_guard.skip_unless_ci(f"commit {commit} is not in this clone's history (a shallow clone)")
  script = os.path.join(here, "data", "make_compat_references.py")
  done = subprocess.run([sys.executable, script], capture_output=True, text=True)
  assert done.returncode == 0, done.stdout + done.stderr[-2000:]
  assert "classifier_logits" in done.stdout and "disc_logits" in done.stdout
