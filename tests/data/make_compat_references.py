"""Recomputes the compat references with the code of the commit that wrote each checkpoint.

    python tests/data/make_compat_references.py           # checks the stored outputs (exit 1 on a difference)
    python tests/data/make_compat_references.py --write   # rewrites them

For each stored workdir the script checks out the commit that wrote it into a temporary git worktree, imports
that commit's own bertjax (its loaders and model), restores the checkpoint, applies the model to the batch stored
in reference_outputs.npz and compares the outputs with the stored ones. tests/test_compat.py then requires today's
code to give the same outputs, so the references never come from the code under test.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Each reference: the commit whose code wrote the checkpoint, the npz, and the program run inside that commit's
# tree (argv: the data folder, the output npz). The batch inputs are read from the stored npz.
V0 = """
import json, shutil, sys, tempfile, numpy as np, ml_collections
from bertjax import checkpoint, finetune, model as model_lib
data, out = sys.argv[1:]
ref = np.load(data + "/reference_outputs.npz")
batch = {k: ref[k] for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")}
config = ml_collections.ConfigDict(json.load(open(data + "/pretrain/config.json")))
mcfg = model_lib.BertConfig.from_dict(config.model.to_dict())
params = checkpoint.Checkpointer(data + "/pretrain").restore_params()
o = model_lib.BertForPreTraining(mcfg).apply({"params": params}, batch)
ft = tempfile.mkdtemp() + "/finetune"
shutil.copytree(data + "/finetune", ft)
meta = json.load(open(ft + "/finetune.json"))
meta["tokenizer"] = data + "/vocab.txt"
json.dump(meta, open(ft + "/finetune.json", "w"))
_, _, module, cparams, _ = finetune.load_finetuned(ft)
c = module.apply({"params": cparams}, {k: batch[k] for k in ("input_ids", "input_mask", "segment_ids")})
np.savez(out, **batch, mlm_logits=np.asarray(o["mlm_logits"]), nsp_logits=np.asarray(o["nsp_logits"]),
         classifier_logits=np.asarray(c["logits"]))
"""

V1_ELECTRA = """
import json, sys, numpy as np, ml_collections
from bertjax import checkpoint, model as model_lib
from bertjax.model import electra
data, out = sys.argv[1:]
ref = np.load(data + "/reference_outputs.npz")
batch = {k: ref[k] for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")}
config = ml_collections.ConfigDict(json.load(open(data + "/config.json")))
mcfg = model_lib.BertConfig.from_dict(config.model.to_dict())
params = checkpoint.Checkpointer(data).restore_params(announce=lambda *a: None)
disc, gen = electra.split(params)
gen_cfg = electra.generator_config(mcfg, config.electra.generator_hidden, config.electra.generator_layers)
d = electra.ElectraDiscriminator(mcfg).apply({"params": disc}, batch)["disc_logits"]
g = model_lib.BertForPreTraining(gen_cfg).apply({"params": gen}, batch)["mlm_logits"]
np.savez(out, **batch, disc_logits=np.asarray(d), generator_mlm_logits=np.asarray(g))
"""

REFERENCES = (("9c0724a", "checkpoints_v0", V0), ("4763e1c", os.path.join("checkpoints_v1", "electra"), V1_ELECTRA))


def produce(commit: str, data: str, program: str, tmp: str) -> str:
  tree = os.path.join(tmp, commit)
  subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", "-f", tree, commit], check=True,
                 capture_output=True)
  try:
    out = os.path.join(tmp, commit + ".npz")
    env = {**os.environ, "PYTHONPATH": tree, "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, "-c", program, data, out], check=True, cwd=tree, env=env)
    return out
  finally:
    subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", tree], check=False, capture_output=True)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--write", action="store_true", help="rewrite the stored references")
  args = p.parse_args(argv)
  import numpy as np
  failed = 0
  with tempfile.TemporaryDirectory() as tmp:
    for commit, rel, program in REFERENCES:
      data = os.path.join(HERE, rel)
      got = np.load(produce(commit, data, program, tmp))
      stored_path = os.path.join(data, "reference_outputs.npz")
      if args.write:
        np.savez(stored_path, **{k: got[k] for k in got})
        print(f"{rel}: written from {commit}")
        continue
      stored = np.load(stored_path)
      for k in stored:
        diff = float(np.max(np.abs(stored[k].astype(np.float64) - got[k].astype(np.float64))))
        ok = diff <= 1e-5 * max(1.0, float(np.max(np.abs(stored[k]))))
        failed += not ok
        print(f"{rel} {k}: max |stored - {commit}| = {diff:.2e}{'' if ok else '  DIFFERS'}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
