"""Interim demo: a forward pass of a random tiny BERT with the MLM and NSP heads."""
import jax
import numpy as np

from bertjax import losses, model


def main():
  cfg = model.BertConfig.from_variant("tiny", vocab_size=1000)
  batch = model.dummy_batch(cfg, 2, 32, 5)
  batch["input_ids"] = np.random.default_rng(0).integers(5, 1000, (2, 32)).astype(np.int32)
  m = model.BertForPreTraining(cfg)
  params = m.init(jax.random.key(0), batch)["params"]
  out = m.apply({"params": params}, batch)
  batch["masked_lm_weights"][:] = 1
  loss, metrics = losses.pretraining_loss(out, batch)
  print({k: v.shape for k, v in out.items()})
  print(f"params {model.count_params(params):,}; loss {float(loss):.3f} (ln V = {np.log(cfg.vocab_size):.3f})")


if __name__ == "__main__":
  main()
