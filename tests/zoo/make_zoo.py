"""Rebuild the folder zoo (tests/data/zoo/<era>/): model folders written by the real libraries of each era, each
beside that library's own outputs (NAME.expected.npz) and what every bertjax tool should do with it (NAME.zoo.json).
`tests/test_folder_zoo.py` runs every bertjax tool over every folder.

    python tests/zoo/make_zoo.py [--venvs /work/zoo-venvs] [--eras st2,st3,st5,st6,pylate]

Each era is a virtualenv outside the repository (`python3 -m venv`, then pip with the pins below; torch is always
pinned to the CPU build 2.13.0); st6 is the project's own .venv. What each era holds (the zoo in the repository was
written with exactly these, `pip freeze`; every NAME.zoo.json records its writer's under "writer"):

  st2     sentence-transformers 2.7.0, transformers 4.40.2, tokenizers 0.19.1, huggingface-hub 0.25.2, numpy 1.26.4
          (sentence-transformers folders only: dense stacks, the config-only cross-encoder)
  st3     sentence-transformers 3.4.1, transformers 4.46.3, tokenizers 0.20.3, huggingface-hub 0.26.5, numpy 1.26.4
          (HF folders of the 4.x era + sentence-transformers)
  st5     sentence-transformers 5.1.2, transformers 4.57.6, tokenizers 0.22.2, huggingface_hub 0.36.2, numpy 2.4.6
          (ModernBERT's 4.x folders, sparse MLMTransformer, Router, CrossEncoder with activation_fn in config.json)
  st6     sentence-transformers 6.2.0, transformers 5.23.0, tokenizers 0.23.3, huggingface_hub 2.4.0, numpy 2.4.6
          (the project's .venv: every HF family and head, sharded safetensors, pytorch_model.bin only,
          sentence-transformers 6 dense / sparse / cross / multi-vector)
  pylate  pylate 1.6.0, sentence-transformers 5.3.0, transformers 5.3.0, tokenizers 0.22.2, huggingface_hub 1.33.0,
          numpy 2.4.6: its fast-plaid requirement conflicts with torch 2.13.0 (pip: "ResolutionImpossible"), so
          pylate is installed with --no-deps beside its other requirements (fast-plaid and fastkmeans, PLAID indexing
          only, left out); it writes the ColBERT folders.
  all     torch 2.13.0+cpu, safetensors 0.8.0, sentencepiece 0.2.3.

Every model starts from initializer_range 0.3 (zoo_common.INIT) and every sentence-transformers / PyLate Dense is
re-drawn with that std, so each stored output varies across the fixed texts by far more than the tests' 1e-5
(tests/test_folder_zoo.py asserts >= 100x); an HF folder's record also holds torch's masked mean of its
last_hidden_state over the fixed texts (embed_mean, embed_mean_normalized).

The writers (write_era.py -> write_hf.py, write_st.py, write_pylate.py) seed every model and take their words
from Python's own standard-library docstrings, so a rerun with the same versions writes the same folders.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
TORCH = "torch==2.13.0"
PINS = {  # exact: what wrote the zoo in the repository (the docstring's table)
    "st2": ["sentence-transformers==2.7.0", "transformers==4.40.2", "huggingface_hub==0.25.2", "tokenizers==0.19.1",
            "numpy==1.26.4", "sentencepiece==0.2.3", "safetensors==0.8.0"],
    "st3": ["sentence-transformers==3.4.1", "transformers==4.46.3", "huggingface_hub==0.26.5", "tokenizers==0.20.3",
            "numpy==1.26.4", "sentencepiece==0.2.3", "safetensors==0.8.0"],
    "st5": ["sentence-transformers==5.1.2", "transformers==4.57.6", "huggingface_hub==0.36.2", "tokenizers==0.22.2",
            "numpy==2.4.6", "sentencepiece==0.2.3", "safetensors==0.8.0"],
    "pylate": ["sentence-transformers==5.3.0", "transformers==5.3.0", "huggingface_hub==1.33.0", "tokenizers==0.22.2",
               "numpy==2.4.6", "ujson==5.12.0", "datasets", "accelerate", "pandas", "sentencepiece==0.2.3",
               "safetensors==0.8.0"],
}
PARTS = {"st2": ["st"], "st3": ["hf", "st"], "st5": ["hf", "st"], "st6": ["hf", "st"], "pylate": ["pylate"]}
ONLY = {"st5": "modernbert"}  # the 4.x folders of the other families come from st3


def python_of(era: str, venvs: str) -> str:
  if era == "st6":
    return os.path.join(REPO, ".venv", "bin", "python")
  py = os.path.join(venvs, era, "bin", "python")
  if not os.path.exists(py):
    subprocess.run([sys.executable, "-m", "venv", os.path.join(venvs, era)], check=True)
    pip = [py, "-m", "pip", "install", "-q"]
    subprocess.run(pip + [TORCH, *PINS[era]], check=True)
    if era == "pylate":
      subprocess.run(pip + ["--no-deps", "pylate==1.6.0"], check=True)
  return py


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--venvs", default="/work/zoo-venvs")
  ap.add_argument("--eras", default="st2,st3,st5,st6,pylate")
  args = ap.parse_args()
  for era in args.eras.split(","):
    env = {**os.environ, "ZOO_ONLY": ONLY.get(era, "")}
    subprocess.run([python_of(era, args.venvs), os.path.join(HERE, "write_era.py"), era, *PARTS[era]], check=True,
                   env=env)


if __name__ == "__main__":
  main()
