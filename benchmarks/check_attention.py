"""Attention implementations agree on this machine's accelerator: xla (einsum) vs cudnn, auto, pallas, splash,
blockwise.

  python benchmarks/check_attention.py [--dtype bfloat16] [--batch 8] [--seq 128] [--window 128]

A base-shaped encoder layer stack (dropout off) in `dtype`, random tokens with padding and, separately, packed rows
(two examples per row with the block-diagonal segment mask) and rows padded on the left. Prints ‖out − ref‖/‖ref‖
of the hidden states and of the parameter gradients against the float32 xla path. Implementations the backend
lacks are reported, not hidden. With `--window W`, ModernBERT's attention pattern: rotary positions, W-token
sliding windows, a global layer every third (the fused implementations refuse windows and are reported so).
"""
import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import model as model_lib
from bertjax.kernels import attention


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--window", type=int, default=0)
  p.add_argument("--block", type=int, default=256, help="blockwise: keys per block of a global layer")
  args = p.parse_args()
  window = dict(position_embedding="rotary", local_attention=args.window, global_every=3) if args.window else {}
  base = model_lib.BertConfig.from_dict({"variant": "base", "num_layers": args.layers, "dropout_rate": 0.0,
                                         "attention_dropout_rate": 0.0, "max_position_embeddings": max(512, args.seq),
                                         "attention_block": args.block, **window})
  rng = np.random.default_rng(0)
  b, s = args.batch, args.seq
  lengths = rng.integers(s // 4, s + 1, b)
  batch = {"input_ids": rng.integers(1000, base.vocab_size, (b, s)).astype(np.int32),
           "input_mask": (np.arange(s)[None] < lengths[:, None]).astype(np.int32),
           "segment_ids": np.zeros((b, s), np.int32)}
  packed = dict(batch)
  half = lengths // 2
  packed["attention_segment_ids"] = np.where(np.arange(s)[None] < half[:, None], 1, 2) * batch["input_mask"]
  packed["position_ids"] = np.where(np.arange(s)[None] < half[:, None], np.arange(s)[None],
                                    np.arange(s)[None] - half[:, None]).astype(np.int32)
  # Rows padded on the left: the fused global kernel takes key lengths, so this batch must take the masked path.
  left = dict(batch, input_mask=batch["input_mask"][:, ::-1].copy())
  ref_model = model_lib.BertModel(dataclasses.replace(base, attention_impl="xla"))
  params = ref_model.init(jax.random.key(0), batch)["params"]
  # A random projection of the real tokens' hidden states as the loss: every parameter gets a real gradient.
  proj = rng.normal(size=(b, s, base.hidden_size)).astype(np.float32) * batch["input_mask"][..., None]

  def run(cfg, x):
    m = model_lib.BertModel(cfg)

    def f(pr):
      h = m.apply({"params": pr}, x)["hidden"].astype(jnp.float32)
      return jnp.sum(h * proj), h
    (_, h), g = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    return np.asarray(h), jax.tree_util.tree_map(np.asarray, g)

  def rel(a, r):
    return float(np.linalg.norm(a - r) / np.linalg.norm(r))

  print(f"{jax.devices()[0].device_kind}: {args.layers} base layers, batch {b} x {s}, {args.dtype}"
        + (f", windows of {args.window}" if args.window else ""))
  for name, x in (("padded", batch), ("packed", packed), ("left", left)):
    h_ref, g_ref = run(dataclasses.replace(base, attention_impl="xla"), x)
    m = x["input_mask"].astype(bool)
    for impl in ("xla", "cudnn", "auto", "pallas", "splash", "blockwise"):
      try:
        h, g = run(dataclasses.replace(base, attention_impl=impl, dtype=args.dtype), x)
      except Exception as e:
        print(f"  {name:7s} {impl:6s} unavailable: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        continue
      gl, rl = jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_ref)
      total = rel(np.concatenate([a.ravel() for a in gl]), np.concatenate([r.ravel() for r in rl]))
      # The key bias's gradient is zero in exact arithmetic (softmax ignores a per-query constant): leaves that
      # small hold only rounding, so the worst leaf is taken over leaves with a real gradient.
      scale = max(np.linalg.norm(r) for r in rl)
      g_err = max(rel(a, r) for a, r in zip(gl, rl) if np.linalg.norm(r) > 1e-4 * scale)
      print(f"  {name:7s} {impl:6s} hidden rel err {rel(h[m], h_ref[m]):.2e}   gradients: all {total:.2e}, "
            f"worst leaf {g_err:.2e}")

  # The fused kernel with dropout (rate 0.1) in `dtype` against the same function in float32 jnp.
  shape = (b, s, base.num_heads, base.head_dim)
  q, k, v = (jnp.asarray(rng.normal(size=shape), jnp.float32) for _ in range(3))
  w = jnp.asarray(rng.normal(size=shape), jnp.float32)
  mask = jnp.asarray(batch["input_mask"].astype(bool))[:, None, None, :]
  dt = jnp.dtype(args.dtype)

  def fused(q, k, v):
    return jnp.sum(attention.fused_attention(q.astype(dt), k.astype(dt), v.astype(dt), mask, dropout_rate=0.1,
                                             seed=7).astype(jnp.float32) * w)

  def ref(q, k, v):
    return jnp.sum(attention.reference(q, k, v, mask, 7, 0.1) * w)
  try:
    gf = jax.jit(jax.grad(fused, (0, 1, 2)))(q, k, v)
    gr = jax.jit(jax.grad(ref, (0, 1, 2)))(q, k, v)
    of = attention.fused_attention(q.astype(dt), k.astype(dt), v.astype(dt), mask, dropout_rate=0.1, seed=7)
    orf = attention.reference(q, k, v, mask, 7, 0.1)
    print(f"  dropout pallas output rel err {rel(np.asarray(of, np.float32), np.asarray(orf)):.2e}   gradients "
          + " ".join(f"{n} {rel(np.asarray(a), np.asarray(r)):.2e}" for n, a, r in zip("qkv", gf, gr)))
  except Exception as e:
    print(f"  dropout pallas unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200]}")


if __name__ == "__main__":
  main()
