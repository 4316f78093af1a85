"""Packing: each example's outputs in a packed row equal its unpacked outputs; plans are complete and within caps."""
import flax.linen as nn
import helpers as tt
import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertjax import model as model_lib
from bertjax import pretrain as train
from bertjax.data import packing
from bertjax.objectives import mlm as mlm_objective


def examples(n=7, src_len=24, preds=4, vocab=97, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    length = int(rng.integers(5, src_len + 1))
    ids = np.zeros(src_len, np.int32)
    ids[:length] = rng.integers(5, vocab, length)
    ids[0] = 2
    seg = np.zeros(src_len, np.int32)
    seg[length // 2:length] = 1
    p = int(rng.integers(1, min(preds, length - 1) + 1))
    pos = np.zeros(preds, np.int32)
    pos[:p] = np.sort(rng.choice(np.arange(1, length), p, replace=False))
    w = np.zeros(preds, np.float32)
    w[:p] = 1
    out.append({"input_ids": ids, "input_mask": (np.arange(src_len) < length).astype(np.int32), "segment_ids": seg,
                "masked_lm_positions": pos, "masked_lm_ids": rng.integers(0, vocab, preds).astype(np.int32),
                "masked_lm_weights": w, "next_sentence_labels": np.int32(rng.integers(0, 2))})
  return out


SWITCHES = {
    "bert": {},
    "rotary-local-glu": dict(position_embedding="rotary", rope_theta_local=500.0, local_attention=6, global_every=2,
                             ffn="glu", layer_norm="pre", use_bias=False, norm_bias=False),
    "alibi-rmsnorm": dict(position_embedding="alibi", norm="rmsnorm", norm_bias=False, layer_norm="pre"),
}


@pytest.mark.parametrize("switches", sorted(SWITCHES))
@pytest.mark.parametrize("prune", [False, True])
def test_packed_outputs_equal_unpacked(prune, switches):
  """With `prune` the packed rows' last layer runs at each example's [CLS] and masked positions only (the
  reference stays the whole unpacked model). Rotary, ALiBi and the sliding window read the restarting positions
  and the block-diagonal mask of packed rows."""
  cfg = model_lib.BertConfig.from_variant("tiny", vocab_size=97, max_position_embeddings=64, prune_final_layer=False,
                                          **SWITCHES[switches])
  m = model_lib.BertForPreTraining(cfg)
  exs = examples()
  unpacked = {k: np.stack([e[k] for e in exs]) for k in exs[0]}
  params = nn.meta.unbox(m.init(jax.random.key(0), unpacked)["params"])
  ref = m.apply({"params": params}, unpacked)
  lengths = [int(e["input_mask"].sum()) for e in exs]
  preds = [int(e["masked_lm_weights"].sum()) for e in exs]
  rows = packing.plan(lengths, preds, 48, 12, 4)
  assert sorted(sum(rows, [])) == list(range(len(exs))) and len(rows) < len(exs)
  packed = [packing.pack_row([exs[i] for i in r], 48, 12, 4) for r in rows]
  batch = {k: np.stack([p[k] for p in packed]) for k in packed[0]}
  out = model_lib.BertForPreTraining(cfg.replace(prune_final_layer=prune)).apply({"params": params}, batch)
  for b, r in enumerate(rows):
    t = q = 0
    for k, i in enumerate(r):
      n, p = lengths[i], preds[i]
      if not prune:
        np.testing.assert_allclose(out["hidden"][b, t:t + n], ref["hidden"][i, :n], atol=1e-5)
      np.testing.assert_allclose(out["nsp_logits"][b, k], ref["nsp_logits"][i], atol=1e-5)
      np.testing.assert_allclose(out["pooled"][b, k], ref["pooled"][i], atol=1e-5)
      np.testing.assert_allclose(out["mlm_logits"][b, q:q + p], ref["mlm_logits"][i, :p], atol=1e-5)
      t, q = t + n, q + p
  # The loss sums agree too: packing changes the layout, not the objective.
  unpacked["next_sentence_weights"] = np.ones(len(exs), np.float32)
  s_ref = mlm_objective.pretraining_sums(ref, unpacked)
  s_out = mlm_objective.pretraining_sums(out, batch)
  for k in s_ref:
    np.testing.assert_allclose(s_out[k], s_ref[k], rtol=1e-5, atol=1e-4)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.integers(0, 10)), min_size=1, max_size=60), st.integers(1, 5))
def test_plan_invariants(items, k):
  lengths, preds = zip(*items)
  rows = packing.plan(lengths, preds, 64, 12, k)
  assert sorted(sum(rows, [])) == list(range(len(items)))  # every example exactly once
  for r in rows:
    assert 1 <= len(r) <= k
    assert sum(lengths[i] for i in r) <= 64 and sum(preds[i] for i in r) <= 12
  assert rows == packing.plan(lengths, preds, 64, 12, k)  # deterministic


def test_pretraining_loop_with_packing(tmp_path, data_dir, capsys):
  c = tt.small_config(data_dir, stop_after_steps=2)
  c.data.packing = True
  summary = train.train_and_evaluate(c, str(tmp_path / "w"))
  assert summary["final_step"] == 2 and np.isfinite(summary["train"]["loss"])
  assert "packing:" in capsys.readouterr().out
  import glob
  import os
  assert glob.glob(os.path.join(data_dir, "packing_train_32_*.npz"))  # the plan is cached beside the data


def test_plan_refuses_what_cannot_fit():
  import pytest
  with pytest.raises(ValueError, match="65 tokens does not fit a row of 64"):
    packing.plan([65], [1], 64, 12, 4)
  with pytest.raises(ValueError, match="13 masked positions"):
    packing.plan([10], [13], 64, 12, 4)
