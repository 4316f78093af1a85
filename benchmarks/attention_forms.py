"""Attention's forward and forward + backward on this CPU, in the forms an encoder can write it: bertjax's XLA path
(`kernels.xla.dot_product_attention`: the mask added as a bias, the row sums dividing the context, a hand-written
backward), the textbook form (a select for the mask, softmax, then the product with V, differentiated by JAX),
`jax.nn.dot_product_attention(implementation="xla")`, and torch's `scaled_dot_product_attention` (what HF's BERT
runs) on the same arrays. Each jitted function is timed after a first call (median of --steps); prints a table
and writes JSON.

  python benchmarks/attention_forms.py [--shapes 32x256x12x32,32x64x12x32,16x256x12x64] [--steps 7]
      [--out benchmarks/results/attention_forms_cpu.json]

A shape is batch x length x heads x head size; half the rows are padded from the middle on.
"""
import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import machine  # noqa: E402
from profile_vs_torch import median_time  # noqa: E402

from bertjax.kernels import xla  # noqa: E402


def textbook(q, k, v, mask):
  q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))
  s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * np.float32(1 / np.sqrt(q.shape[-1]))
  p = jax.nn.softmax(jnp.where(mask, s, jnp.finfo(jnp.float32).min), axis=-1)
  return jnp.swapaxes(jnp.einsum("bhqk,bhkd->bhqd", p, v), 1, 2)


FORMS = {"bertjax": xla.dot_product_attention, "textbook": textbook,
         "jax.nn (xla)": lambda q, k, v, mask: jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")}


def median_ms(f, steps: int) -> float:
  return round(1000 * median_time(f, steps), 1)


def torch_times(q, k, v, mask, steps: int) -> dict:
  import torch
  import torch.nn.functional as F
  tq, tk, tv = (torch.tensor(np.asarray(t)).transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
  tm = torch.tensor(np.asarray(mask))
  w = torch.tensor(np.random.default_rng(1).normal(size=tq.shape).astype(np.float32))

  def forward():
    with torch.inference_mode():
      F.scaled_dot_product_attention(tq.detach(), tk.detach(), tv.detach(), attn_mask=tm)

  def backward():
    (F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm) * w).sum().backward()
  return {"forward_ms": median_ms(forward, steps), "forward_backward_ms": median_ms(backward, steps)}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--shapes", default="32x256x12x32,32x64x12x32,16x256x12x64")
  ap.add_argument("--steps", type=int, default=7)
  ap.add_argument("--out", default="")
  a = ap.parse_args()
  print(f"machine: {machine.describe()}", flush=True)
  rows = []
  for shape in a.shapes.split(","):
    b, length, h, d = (int(x) for x in shape.split("x"))
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(b, length, h, d)).astype(np.float32)) for _ in range(3))
    real = np.ones((b, length), bool)
    real[b // 2:, length // 2:] = False
    mask = jnp.asarray(real)[:, None, None, :]
    w = jnp.asarray(rng.normal(size=q.shape).astype(np.float32))
    want = np.asarray(jax.jit(textbook)(q, k, v, mask))
    for name, form in FORMS.items():
      fwd = jax.jit(form)
      grad = jax.jit(jax.grad(lambda q, k, v, form=form: jnp.sum(form(q, k, v, mask) * w), argnums=(0, 1, 2)))
      rows.append({"shape": shape, "form": name,
                   "forward_ms": median_ms(lambda: fwd(q, k, v, mask).block_until_ready(), a.steps),
                   "forward_backward_ms": median_ms(lambda: jax.block_until_ready(grad(q, k, v)), a.steps),
                   "max_diff": float(np.abs(np.asarray(fwd(q, k, v, mask)) - want).max())})
      print(json.dumps(rows[-1]), flush=True)
    rows.append({"shape": shape, "form": "torch sdpa", **torch_times(q, k, v, mask, a.steps)})
    print(json.dumps(rows[-1]), flush=True)
  print("\n| shape (B x L x H x D) | form | forward (ms) | forward + backward (ms) |\n|---|---|---|---|")
  for r in rows:
    print(f"| {r['shape']} | {r['form']} | {r['forward_ms']} | {r['forward_backward_ms']} |")
  if a.out:
    with open(a.out, "w", encoding="utf-8") as f:
      json.dump(machine.stamp({"command": "python benchmarks/attention_forms.py", "rows": rows}), f, indent=2)


if __name__ == "__main__":
  main()
