"""Launch scripts parse (and pass shellcheck where installed); the train step compiles for a TPU topology here."""
import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "launch", "*.sh")) + glob.glob(os.path.join(ROOT, "benchmarks", "*.sh"))
                 + [os.path.join(ROOT, "launch", "slurm_gpu.sbatch"), os.path.join(ROOT, ".ci", "run")])


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_shell_scripts_parse(script):
  out = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
  assert out.returncode == 0, out.stderr
  if shutil.which("shellcheck"):
    out = subprocess.run(["shellcheck", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_tpu_vm_script_refuses_unknown_commands():
  out = subprocess.run(["bash", os.path.join(ROOT, "launch", "tpu_vm.sh"), "explode", "n", "z"],
                       capture_output=True, text=True)
  assert out.returncode == 2 and "unknown command explode" in out.stderr


def _aot(code):
  """The last line `code` prints, as JSON: aot.compile_step results compiled for a TPU topology on this host."""
  pytest.importorskip("libtpu")
  code = "import json; from bertjax.cli import aot; from configs import modernbert, pretrain\n" + code
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  import json
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_aot_compile_for_a_tpu_topology():
  ok, big, modern_splash = _aot(
      "c = pretrain.get_config('variant=tiny,seq=64,preds=8,shard=fsdp')\n"
      "ok = aot.compile_step(c, 'v5e:2x2', 8)\n"
      "c = pretrain.get_config('variant=large,seq=512,preds=80,shard=dp')\n"
      "big = aot.compile_step(c, 'v5e:2x2', 64)\n"
      "c = modernbert.get_config('variant=tiny,seq=256,shard=fsdp')\n"
      "c.model.attention_impl = 'splash'\n"
      "print(json.dumps([ok, big, aot.compile_step(c, 'v5e:2x2', 8)]))")
  assert ok["fits"] and ok["chips"] == 4 and ok["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
  assert ok["scan_unroll"] == 1  # the config's auto unroll is resolved for the TPU, not for this CPU host
  assert ok["mosaic_kernels"] == 0 and 0 < ok["total_gib"] < ok["hbm_gib"] and ok["temporaries_gib"] > 0
  assert not big["fits"] and "RESOURCE_EXHAUSTED" in big["error"]  # BERT-large, 64 x 512 per 16 GiB chip: no
  # The ModernBERT recipe (rotary, sliding windows, GeGLU, no NSP) with splash: the global and the sliding-window
  # (LocalMask) kernels, each compiled by Mosaic for the chip (not Pallas' interpreter).
  assert modern_splash["fits"] and modern_splash["mosaic_kernels"] > 0


@pytest.mark.slow
def test_aot_compile_of_bert_with_splash_and_modernbert_on_xla():
  splash, modern = _aot(
      "c = pretrain.get_config('variant=tiny,seq=64,preds=8,shard=fsdp')\n"
      "c.model.attention_impl, c.model.attention_dropout_rate = 'splash', 0.0\n"
      "splash = aot.compile_step(c, 'v5e:2x2', 8)\n"
      "c = modernbert.get_config('variant=tiny,seq=256,shard=fsdp')\n"
      "print(json.dumps([splash, aot.compile_step(c, 'v5e:2x2', 8)]))")
  assert splash["fits"] and splash["mosaic_kernels"] > 0
  assert modern["fits"]


@pytest.mark.slow
def test_bench_writes_the_agreed_fields(tmp_path):
  """Only the output's shape is checked here: timings belong to the benchmark, never to assertions."""
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench.py"), "--variant", "tiny", "--seq",
                        "32", "--batch", "8",
                        "--preds", "5", "--steps", "1", "--regime", "glue", "--peer", "hf", "--out",
                        str(tmp_path / "b.json")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  import json
  data = json.loads((tmp_path / "b.json").read_text())
  (row,) = data["rows"]
  assert data["machine"]["describe"] and data["versions"]["jax"]  # the CPU and versions it ran with
  for key in ("config", "tokens_per_s", "step_time_s", "compile_s", "model_tflops_per_s", "matmul_peak_tflops_per_s",
              "mfu", "peer", "peer_tokens_per_s", "ratio"):
    assert key in row, key
  (peer,) = row["peers"]
  assert peer["name"] == "hf" and "eager" in peer["peer"] and peer["ratio"] == row["ratio"]


def test_bench_refuses_peer_none_beside_a_peer(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench.py"), "--variant", "tiny", "--peer",
                        "none", "--peer",
                        "hf_compile", "--out", str(tmp_path / "b.json")], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
  assert out.returncode == 2 and "--peer none cannot be combined" in out.stderr
  assert not (tmp_path / "b.json").exists()

def test_sweep_prints_the_grid_and_tabulates_whatever_finished(tmp_path):
  """The grid's commands, then the table over the runs' own result files (fine-tuning reports in the format
  bertjax.finetune writes, one run that never finished); the full sweep through real runs is a slow test."""
  import json

  import numpy as np
  env = dict(os.environ, PYTHONPATH=ROOT)
  root = tmp_path / "sweep"
  sweep = [sys.executable, os.path.join(ROOT, "launch", "sweep.py")]
  out = subprocess.run([*sweep, "run", "--config", "configs/finetune.py:task=glue/mrpc", "--grid", "lr=2e-5,5e-5",
                        "--grid", "seed=0,1,2", "--root", str(root), "--print", "--", "--config.log_every=5"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
  assert out.returncode == 0, out.stderr
  lines = out.stdout.strip().splitlines()
  assert len(lines) == 6 and all(x.endswith("--config.log_every=5") for x in lines)
  assert f"--config={ROOT}/configs/finetune.py:task=glue/mrpc,lr=5e-5,seed=2 --workdir=" in lines[-1], lines[-1]
  scores = {("2e-5", "0"): 0.81, ("2e-5", "1"): 0.84, ("2e-5", "2"): 0.79, ("5e-5", "0"): 0.86, ("5e-5", "2"): 0.70}
  for (lr, seed), f1 in scores.items():  # lr=5e-5,seed=1 never finished: no report
    d = root / f"lr-{lr}_seed-{seed}"
    d.mkdir(parents=True)
    best = {"epoch": 2, "value": f1, "metrics": {"validation": {"f1": f1, "accuracy": f1 - 0.05}}}
    (d / "report.json").write_text(json.dumps({"task": "glue/mrpc", "main_metric": "f1", "epochs": [], "best": best}))
  out = subprocess.run([*sweep, "table", "--root", str(root)], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  rows = json.loads((root / "sweep.json").read_text())
  assert [r["setting"] for r in rows] == [{"lr": "2e-5"}, {"lr": "5e-5"}]
  for r in rows:
    mine = [v for (lr, _), v in scores.items() if lr == r["setting"]["lr"]]
    assert r["metric"] == "f1" and r["runs"] == len(mine)
    assert (r["median"], r["best"], r["worst"]) == pytest.approx((np.median(mine), max(mine), min(mine)))
  assert (root / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_profile_summary_reads_the_host_when_a_device_process_is_empty(tmp_path):
  """A CPU trace with libtpu installed names an empty device process beside the host's; the host's kernels count."""
  import gzip
  import json
  meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:CUSTOM:Megascale Trace"}},
          {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/host:CPU"}}]
  # Three profiled steps: 3 x 600 us of products, 3 x 300 us of an elementwise fusion, bookkeeping left out.
  kernels = [{"ph": "X", "pid": 7, "tid": 1, "ts": i, "dur": dur, "name": name}
             for i, (name, dur) in enumerate([("ynn_fusion.1", 600), ("multiply_add_fusion.2", 300)] * 3)]
  kernels.append({"ph": "X", "pid": 7, "tid": 1, "ts": 9, "dur": 10 ** 6, "name": "ThunkExecutor::Execute"})
  folder = tmp_path / "plugins" / "profile" / "run"
  folder.mkdir(parents=True)
  with gzip.open(folder / "perfetto_trace.json.gz", "wt") as f:
    json.dump({"traceEvents": meta + kernels}, f)
  out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "profile_summary.py"), str(tmp_path)],
                       capture_output=True, text=True, check=True).stdout
  assert "processes: /host:CPU" in out and "kernel time per step: 0.90 ms" in out, out
  assert "matmul                    0.60 ms" in out and "elementwise fusion        0.30 ms" in out, out


def _demo_launcher():
  import importlib.util
  spec = importlib.util.spec_from_file_location("demo_launcher", os.path.join(ROOT, "launch", "demo.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_demo_fills_blanks_from_heldout_documents_and_reports_heldout_shares(data_dir, capsys):
  """The demo's fill-mask and held-out report on a tiny model: every blank is a sentence of a held-out document
  (never of a training one) with the word taken out beside it; the top-answer share over the held-out blanks is
  the share whose argmax is the true token, the top-five share is at least that; the printed lines carry both,
  and an NSP accuracy below the target prints why."""
  import jax
  import numpy as np

  from bertjax import model as model_lib
  from bertjax.data import tokenizer
  from bertjax.data.pretraining import corpus, dataset, demo_corpus, generation
  from bertjax.data.pretraining import pipeline as input_pipeline
  creation = dataset.read_creation(data_dir)
  tok = tokenizer.load(dataset.tokenizer_of(data_dir, creation)[0])
  docs = list(corpus.read_documents(creation["input"], opts=dataset.reader_options(creation)))
  held = {s.lower() for d in generation.split_documents(docs, creation["heldout_every"], True) for s in d}
  trained = {s.lower() for d in generation.split_documents(docs, creation["heldout_every"], False) for s in d}
  blanks = demo_corpus.heldout_blanks(data_dir, tok, 4, seed=0)
  assert len(blanks) == 4 and blanks == demo_corpus.heldout_blanks(data_dir, tok, 4, seed=0)
  assert blanks != demo_corpus.heldout_blanks(data_dir, tok, 4, seed=1)
  for sentence, word in blanks:
    whole = sentence.replace("[MASK]", word).lower()
    assert sentence.count("[MASK]") == 1 and whole in held and whole not in trained, (sentence, word)
    assert len(tok.encode(word)) == 1

  cfg = model_lib.BertConfig.from_variant("tiny", vocab_size=creation["vocab_size"], hidden_size=64, num_heads=4,
                                          intermediate_size=128, max_position_embeddings=64)
  module = model_lib.BertForPreTraining(cfg)
  source = dataset.load_source(data_dir, "validation")
  (batch,) = list(input_pipeline.eval_batches(source, len(source)))
  params = module.init(jax.random.key(0), batch)["params"]
  demo = _demo_launcher()
  got = demo.heldout_top_k(module, params, data_dir, 16)
  w = np.asarray(batch["masked_lm_weights"]) > 0
  argmax = np.asarray(module.apply({"params": params}, batch)["mlm_logits"]).argmax(-1)
  assert got["blanks"] == w.sum()
  assert got["top1"] == pytest.approx((argmax == np.asarray(batch["masked_lm_ids"]))[w].mean())
  assert got["top1"] <= got["top5"] <= 1

  summary = {"initial_eval": {"mlm_accuracy": 0.0, "mlm_loss": 9.0}, "train": {"nsp_accuracy": 0.9},
             "eval": {"mlm_accuracy": got["top1"], "mlm_loss": 4.0, "nsp_accuracy": 0.55}}
  demo.report_heldout(summary, data_dir, module, params, 16)
  out = capsys.readouterr().out
  assert f"the true token is the top answer for {got['top1']:.1%} and in the top five for {got['top5']:.1%}" in out
  assert "held-out accuracy 0.550 (chance 0.500), on the last training batches 0.900" in out
  assert f"below {demo.NSP_GENERALISES}: " in out
  summary["eval"]["nsp_accuracy"] = 0.7
  demo.report_heldout(summary, data_dir, module, params, 16)
  assert "below" not in capsys.readouterr().out
