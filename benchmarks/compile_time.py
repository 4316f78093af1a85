"""Compile time of the real train step on this host, with and without nn.scan over layers.

  python benchmarks/compile_time.py [--variants base,large] [--out compile_time.json]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--variants", default="base,large")
  p.add_argument("--out", default="compile_time.json")
  args = p.parse_args()
  import jax

  from bertjax import model as model_lib
  from bertjax import pretrain as train
  from bertjax.core import sharding as sharding_lib
  from configs import pretrain
  rows = []
  for variant in args.variants.split(","):
    for scan in (True, False):
      c = pretrain.get_config(f"variant={variant},seq=128,batch=8,shard=dp,scan={scan}")
      mcfg = model_lib.BertConfig.from_dict(c.model.to_dict())
      run = train.build(c, mcfg)
      batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=run.batch_sharding) for k, v in run.dummy.items()}
      t = time.perf_counter()
      with sharding_lib.use_mesh(run.mesh, run.rules):
        run.train_step.lower(run.abstract, batch).compile()
      rows.append({"variant": variant, "layers": mcfg.num_layers, "scan": scan, "compile_s": time.perf_counter() - t})
      print(json.dumps(rows[-1]), flush=True)
  with open(args.out, "w") as f:
    json.dump(machine.stamp(rows), f, indent=2)


if __name__ == "__main__":
  main()
