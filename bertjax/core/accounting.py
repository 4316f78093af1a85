"""Model FLOPs, hardware peaks and MFU, in one place for training, ahead-of-time compile and the benchmark.

Model FLOPs count the maths the model needs, not what a kernel happens to run: training = 3 x forward, the MLM
head at the gathered positions only, attention as Σ nᵢ² over the examples of a (packed) row, and what the
pruned last layer leaves out subtracted. MFU = model FLOP/s over the peak: a chip's dense bf16 specification,
or on CPU the best `jnp.dot` FLOP/s measured on the machine.
"""
from __future__ import annotations

import math
import time

import jax
import numpy as np

# Dense bf16 peak TFLOP/s per chip, by `device_kind` prefix (public specifications).
PEAK_TFLOPS = {"TPU v4": 275.0, "TPU v5 lite": 197.0, "TPU v5e": 197.0, "TPU v5p": 459.0, "TPU v5": 459.0,
               "TPU v6 lite": 918.0, "TPU v6e": 918.0, "NVIDIA H100": 989.0, "NVIDIA H200": 989.0,
               "NVIDIA A100": 312.0}


def count_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def model_flops_per_sequence(cfg, seq_len: int, num_predictions: int,
                             seq_len_squared: float | None = None, final_layer_rows: int | None = None) -> float:
  """Training FLOPs (forward + backward = 3x forward) of one sequence, MLM head at gathered positions only.

  3·[L·(24·S·d² + 4·S²·d) + 2·P·(d² + d·V) + 2·d²]; for packed rows pass the sum of each example's squared
  length as `seq_len_squared`. (Counts the 4·d² attention projections and 2·d·d_ff FFN with d_ff = 4d, as
  the usual 24·S·d²; for other FFN widths the FFN term is scaled, and a gated FFN has three matrices.
  Sliding-window layers are counted as dense attention, as bertjax computes them: a banded mask on the scores.)
  With `final_layer_rows` Q (prune_final_layer:
  [CLS] and the masked positions of an unpacked row), less what the last layer then leaves out.
  """
  d, L, V, P = cfg.hidden_size, cfg.num_layers, cfg.vocab_size, num_predictions
  s2 = seq_len * seq_len if seq_len_squared is None else seq_len_squared
  per_layer = 2 * seq_len * (4 * d * d + ffn_matrices(cfg) * d * cfg.intermediate_size) + 4 * s2 * d
  total = 3.0 * (L * per_layer + 2 * P * (d * d + d * V) + 2 * d * d)
  if final_layer_rows is not None:
    total -= pruned_final_layer_flops(cfg, seq_len - final_layer_rows, s2 - final_layer_rows * seq_len)
  return total


def pruned_final_layer_flops(cfg, rows: float, score_pairs: float) -> float:
  """Training FLOPs the pruned last layer leaves out: for each of `rows` positions no head reads, its query and
  output projections and FFN (its key and value projections stay: every position is a key); `score_pairs`
  (query, key) pairs fewer in QKᵀ and in the probabilities times V."""
  d = cfg.hidden_size
  return 3.0 * (2 * rows * (2 * d * d + ffn_matrices(cfg) * d * cfg.intermediate_size) + 4 * score_pairs * d)


def ffn_matrices(cfg) -> int:
  """d x d_ff matrices per FFN: 2 (in, out), 3 for a gated FFN (GeGLU/SwiGLU: in, gate, out)."""
  return 3 if getattr(cfg, "ffn", "mlp") == "glu" else 2


def pretraining_step_flops(cfg, seq_len: int, num_predictions: int, global_batch: int) -> float:
  """Model FLOPs of one pre-training step over full rows (the training loop's and `bertjax.aot`'s count)."""
  rows = 1 + num_predictions if cfg.prune_final_layer else None
  return model_flops_per_sequence(cfg, seq_len, num_predictions, final_layer_rows=rows) * global_batch


def batch_flops(cfg, batch, predicted=()) -> float:
  """Model FLOPs of one training step on a concrete batch (padded or packed), counted conservatively: tokens
  are the rows' full length, attention Σ nᵢ² over each row's examples, the MLM head at the `predicted` (row,
  position) pairs the objective names (`objectives.mlm.batch_flops`; none for a fine-tuning head) and, with
  `prune_final_layer`, every position but the real [CLS] tokens and the predicted ones left out of the last
  layer, each kept query scored against its own example's tokens."""
  mask = np.asarray(batch["input_mask"])
  seg = np.asarray(batch.get("attention_segment_ids", mask))
  rows, seq = mask.shape
  d = cfg.hidden_size
  example_sq = [int(((seg[r] == s) & (mask[r] > 0)).sum()) ** 2 for r in range(rows)
                for s in np.unique(seg[r][mask[r] > 0])]
  total = rows * model_flops_per_sequence(cfg, seq, 0, seq_len_squared=0.0)
  total += 3 * cfg.num_layers * 4 * sum(example_sq) * d
  total += 3 * 2 * float(len(predicted)) * (d * d + d * cfg.vocab_size)
  if not cfg.prune_final_layer:
    return total
  if "cls_positions" in batch:
    weights = np.asarray(batch.get("example_weights", batch.get("next_sentence_weights")))
    rr, cc = np.nonzero(weights > 0)
    queries = [(r, int(batch["cls_positions"][r, c])) for r, c in zip(rr, cc)]
  else:
    queries = [(r, 0) for r in range(rows)]
  queries += list(predicted)
  keys = sum(int(((seg[r] == seg[r, t]) & (mask[r] > 0)).sum()) for r, t in queries)
  return total - pruned_final_layer_flops(cfg, mask.size - len(queries), sum(example_sq) - keys)


def measure_matmul_tflops(n: int = 2048, repeats: int = 5, dtype=np.float32) -> float:
  """Best observed `jnp.dot` TFLOP/s on the default device (the CPU reference peak), on random data."""
  a, b = (jax.random.normal(jax.random.key(i), (n, n), dtype) for i in (0, 1))
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  best = math.inf
  for _ in range(repeats):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n ** 3 / best / 1e12


_MEASURED: dict = {}


def peak_tflops_per_device(configured: float = 0.0) -> tuple[float, str]:
  """(peak TFLOP/s per device, where it comes from): `configured` if > 0, else the chip's specification, else
  the `jnp.dot` peak measured once per process."""
  if configured and configured > 0:
    return configured, "configured"
  kind = jax.devices()[0].device_kind
  for prefix, peak in PEAK_TFLOPS.items():
    if kind.startswith(prefix):
      return peak, kind
  if kind not in _MEASURED:
    _MEASURED[kind] = measure_matmul_tflops()
  measured = _MEASURED[kind]
  if jax.devices()[0].platform == "cpu" and jax.local_device_count() > 1:
    # Fake CPU devices (--xla_force_host_platform_device_count) share the host's cores, and one device's jnp.dot
    # already uses all of them: each device's share of the machine is the peak per device.
    n = jax.local_device_count()
    return measured / n, f"measured jnp.dot on {kind}, shared by {n} host devices"
  return measured, f"measured jnp.dot on {kind}"


def mfu(flops_per_step: float, step_seconds: float, peak_tflops_per_device: float, devices: int) -> float:
  return flops_per_step / step_seconds / (peak_tflops_per_device * 1e12 * devices)
