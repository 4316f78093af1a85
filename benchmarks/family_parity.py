"""Largest float32 differences between bertjax and HF transformers' PyTorch models of each family, both ways.

  python benchmarks/family_parity.py [--out benchmarks/results/family_parity.json]

For each family and shape: a randomly initialised HF masked-LM model (biases and norms perturbed so every tensor
matters) is imported with `convert.from_hf` and run by bertjax (import); bertjax's parameters, perturbed, are
exported with `convert.to_hf` and loaded by `AutoModelForMaskedLM` (export). Compared on a padded batch (rows of
64, 45 and 17 tokens): the encoder's last hidden states at real tokens and the MLM logits at the masked positions.
tests/test_families.py asserts the same at 1e-5.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402


def hf_models():
  import torch
  import transformers
  shapes = {
      "bert": lambda: transformers.BertForPreTraining(transformers.BertConfig(
          vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)),
      "roberta": lambda: transformers.RobertaForMaskedLM(transformers.RobertaConfig(
          vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
          max_position_embeddings=130, type_vocab_size=1, pad_token_id=1)),
      "modernbert": lambda: transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
          vocab_size=1024, hidden_size=256, num_hidden_layers=6, num_attention_heads=4, intermediate_size=384,
          local_attention=16, pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)),
  }
  for name, make in shapes.items():
    torch.manual_seed(0)
    m = make().eval()
    with torch.no_grad():
      for pname, p in m.named_parameters():
        if pname.endswith("bias") or "norm" in pname.lower():
          p.add_(torch.randn_like(p) * 0.1)
    yield name, m


def compare(cfg, params, m, batch):
  import torch

  from bertjax import model
  ids, mask = torch.tensor(batch["input_ids"]), torch.tensor(batch["input_mask"])
  with torch.no_grad():
    out = m(input_ids=ids, attention_mask=mask)
    logits = (out["logits"] if "logits" in out else out["prediction_logits"]).numpy()
    base = getattr(m, m.base_model_prefix)
    hidden = base(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
  jb = {k: np.asarray(v, np.int32) for k, v in batch.items()}
  ours = model.for_pretraining(cfg).apply({"params": params}, jb)
  full = model.BertModel(cfg).apply({"params": params["bert"]}, jb, pool=False)["hidden"]
  valid = batch["input_mask"].astype(bool)
  theirs = np.take_along_axis(logits, batch["masked_lm_positions"][..., None], axis=1)
  return {"hidden": float(np.abs(np.asarray(full) - hidden)[valid].max()),
          "mlm_logits": float(np.abs(np.asarray(ours["mlm_logits"]) - theirs[..., :cfg.vocab_size]).max())}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default="family_parity.json")
  args = p.parse_args(argv)
  import jax
  import transformers

  from bertjax import convert
  rows = []
  for name, m in hf_models():
    rng = np.random.default_rng(0)
    pad = m.config.pad_token_id or 0
    ids = rng.integers(4, 1000, (3, 64))
    mask = np.ones_like(ids)
    mask[1, 45:], mask[2, 17:] = 0, 0
    batch = {"input_ids": np.where(mask > 0, ids, pad), "input_mask": mask, "segment_ids": np.zeros_like(ids),
             "masked_lm_positions": np.stack([np.sort(rng.choice(17, 6, replace=False)) for _ in range(3)])}
    with tempfile.TemporaryDirectory() as d:
      m.save_pretrained(d + "/hf")
      cfg, params = convert.from_hf(d + "/hf", head="pretraining")
      imported = compare(cfg, params, m, batch)
      params = jax.tree_util.tree_map(lambda a: np.asarray(a) + rng.normal(0, 0.01, np.shape(a)).astype(np.float32),
                                      params)
      convert.to_hf(cfg, params, d + "/out", family=name)
      back = transformers.AutoModelForMaskedLM.from_pretrained(d + "/out").eval()
      exported = compare(cfg, params, back, batch)
    row = {"family": name, "hf_class": type(m).__name__, "layers": cfg.num_layers, "hidden": cfg.hidden_size,
           "import": imported, "export": exported, "transformers": transformers.__version__}
    rows.append(row)
    print(json.dumps(row), flush=True)
  print(f"\nmachine: {machine.describe()}")
  print(f"{'family':11s} {'import hidden':>14s} {'import logits':>14s} {'export hidden':>14s} {'export logits':>14s}")
  for r in rows:
    print(f"{r['family']:11s} {r['import']['hidden']:14.2e} {r['import']['mlm_logits']:14.2e} "
          f"{r['export']['hidden']:14.2e} {r['export']['mlm_logits']:14.2e}")
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(machine.stamp(rows), f, indent=2)


if __name__ == "__main__":
  main()
