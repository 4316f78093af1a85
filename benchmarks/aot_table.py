r"""The AOT table of docs/scaling.md: base and large, sequence 128 and 512, presets dp / fsdp / fsdp_tp, on v4-8,
v5e-16, v5p-8 and v6e-8, each with the largest per-chip batch that compiles within HBM (bertjax.aot.fit_batch).

  python benchmarks/aot_table.py --out benchmarks/results/aot_table.json   # then prints a markdown table
  # ModernBERT at long context (blockwise attention: local layers in chunks, global ones in key blocks)
  python benchmarks/aot_table.py --recipe modernbert --seqs 8192 --presets fsdp --tpus v5e-16,v5p-8 \
      --out benchmarks/results/aot_table_modernbert_8192.json
  # DeBERTa-v3 pre-training (RTD with GDES, disentangled attention, 128,100 pieces)
  python benchmarks/aot_table.py --recipe deberta_v3 --seqs 512 --presets fsdp --tpus v5e-16,v5p-8 \
      --out benchmarks/results/aot_table_deberta_v3.json
"""
import argparse
import json
import os
import sys
import time

from bertjax.cli import aot  # noqa: E402  (sets the libtpu environment first)
from configs import deberta_v3, modernbert, pretrain  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

RECIPES = {"pretrain": pretrain, "modernbert": modernbert, "deberta_v3": deberta_v3}


def markdown(rows):
  out = ["| model | seq | preset | TPU | mesh (data, fsdp, tensor) | max per-chip batch | memory/chip at it (GiB) "
         "| how |",
         "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    mesh = ", ".join(str(v) for v in r["mesh"].values())
    name = {"modernbert": f"ModernBERT-{r['variant']}", "deberta_v3": f"DeBERTa-v3-{r['variant']}"}.get(
        r.get("recipe"), r["variant"])
    r = {**r, "variant": name + (f" ({r['args']})" if r.get("args") else "")}
    if r.get("fits"):
      how = "fit of 2 compiles" if r.get("predicted") else "compiled"
      out.append(f"| {r['variant']} | {r['seq']} | {r['preset']} | {r['name']} | {mesh} | {r['per_chip_batch']} | "
                 f"{r['total_gib']:.1f} / {r['hbm_gib']:.0f} | {how} |")
    else:
      out.append(f"| {r['variant']} | {r['seq']} | {r['preset']} | {r['name']} | {mesh} | does not fit at 1 | - "
                 "| compiled |")
  return "\n".join(out)


def verify_predicted(rows, args):
  """Replaces each predicted row by a compile at its batch (a step down by 8 while it does not fit), saving
  after each so that an interrupted run resumes."""
  for i, r in enumerate(rows):
    if not r.get("predicted") or r["name"] not in args.tpus.split(","):
      continue
    t = time.time()
    config = make_config(r.get("recipe", "pretrain"), r["variant"], r["seq"], r["preset"], r.get("args", ""))
    floor = {**r, "per_chip_batch": 16}
    v = aot.verify_batch(config, r["name"], r["per_chip_batch"], floor)
    if v is floor:  # nothing above 16 fits: 16 was compiled by the fit
      v = aot.compile_step(config, r["name"], 16)
    v["name"] = r["name"]
    rows[i] = v
    print(f"{r['variant']} seq {r['seq']} {r['preset']} {r['name']}: predicted {r['per_chip_batch']}, "
          f"compiled {v['per_chip_batch']} ({'fits' if v['fits'] else 'no fit'}), {time.time() - t:.0f}s", flush=True)
    with open(args.out, "w") as f:
      json.dump(machine.stamp(rows), f, indent=2)


def make_config(recipe: str, variant: str, seq: int, preset: str, extra: str = ""):
  extra = f",{extra}" if extra else ""
  if recipe == "modernbert":  # dynamic masking at 30%; attention whose cost follows its mask
    config = modernbert.get_config(f"variant={variant},seq={seq},shard={preset},batch=8{extra}")
    config.model.attention_impl = "blockwise"
    return config
  if recipe == "deberta_v3":  # the discriminator and its half-depth generator, the released vocabulary
    return deberta_v3.get_config(f"variant={variant},seq={seq},shard={preset},batch=8,vocab=128100{extra}")
  preds = 20 if seq == 128 else 80
  return pretrain.get_config(f"variant={variant},seq={seq},preds={preds},shard={preset},batch=8{extra}")


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--out", default="benchmarks/results/aot_table.json")
  p.add_argument("--recipe", default="pretrain", choices=sorted(RECIPES))
  p.add_argument("--args", default="", help="more of the recipe's arguments, e.g. remat=full,dtype=bfloat16")
  p.add_argument("--variants", default="base,large")
  p.add_argument("--seqs", default="128,512")
  p.add_argument("--presets", default="dp,fsdp,fsdp_tp")
  p.add_argument("--tpus", default="v5e-16,v4-8,v5p-8,v6e-8")
  p.add_argument("--markdown_only", action="store_true", help="print the table from --out without compiling")
  p.add_argument("--verify_predicted", action="store_true",
                 help="compile each row predicted by the two-compile fit at its batch and replace it")
  args = p.parse_args()
  rows = machine.rows(json.load(open(args.out))) if os.path.exists(args.out) else []  # old files: a list
  if args.markdown_only:
    print(markdown(rows))
    return
  print(f"machine: {machine.describe()}")  # the host that compiles; the table's chips are the targets
  if args.verify_predicted:
    verify_predicted(rows, args)
    print(markdown(rows))
    return
  done = {(r["variant"], r["seq"], r["preset"], r["name"]) for r in rows
          if (r.get("recipe", "pretrain"), r.get("args", "")) == (args.recipe, args.args)}
  for variant in args.variants.split(","):
    for seq in map(int, args.seqs.split(",")):
      for preset in args.presets.split(","):
        for name in args.tpus.split(","):
          if (variant, seq, preset, name) in done:
            continue
          t = time.time()
          config = make_config(args.recipe, variant, seq, preset, args.args)
          r = aot.fit_batch(config, name, verify=name == "v5e-16")
          r["name"], r["recipe"], r["variant"], r["args"] = name, args.recipe, variant, args.args
          rows.append(r)
          print(f"{variant} seq {seq} {preset} {name}: per-chip batch {r['per_chip_batch']} "
                f"({'fits' if r['fits'] else 'no fit'}), {time.time() - t:.0f}s", flush=True)
          with open(args.out, "w") as f:
            json.dump(machine.stamp(rows), f, indent=2)
  print(markdown(rows))


if __name__ == "__main__":
  main()
