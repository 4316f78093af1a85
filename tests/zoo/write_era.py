"""Run by one era's Python (`make_zoo.py` does): writes that era's folders under tests/data/zoo/<era>/.
Usage: <era python> tests/zoo/write_era.py ERA [hf] [st] [pylate]"""
from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "zoo")


def main(argv: list[str]) -> None:
  era, parts = argv[0], set(argv[1:]) or {"hf", "st"}
  root = os.path.normpath(os.path.join(ZOO, era))
  os.makedirs(root, exist_ok=True)
  import torch
  torch.set_num_threads(1)
  with tempfile.TemporaryDirectory() as tmp:
    if "hf" in parts:
      import write_hf
      only = os.environ.get("ZOO_ONLY")
      write_hf.write_all(root, tmp, only.split(",") if only else None)
    if "st" in parts:
      import write_st
      write_st.write_all(root, tmp)
    if "pylate" in parts:
      import write_pylate
      write_pylate.write_all(root, tmp)


if __name__ == "__main__":
  main(sys.argv[1:])
