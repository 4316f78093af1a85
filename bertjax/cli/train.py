"""python -m bertjax train --config=configs/pretrain.py:variant=base --workdir=DIR [--config.x=y ...]

Pre-training or fine-tuning, as the config's `mode` says (configs/pretrain.py and the families' recipes;
configs/finetune.py).

Multi-process runs (TPU pods, GPU clusters) call `jax.distributed.initialize()` on every process: automatically
on a multi-host TPU VM or under SLURM, or explicitly with --coordinator_address/--num_processes/--process_id.

Compiled programs persist in JAX's compilation cache, ~/.cache/bertjax-xla unless JAX_COMPILATION_CACHE_DIR
names another folder (an empty value turns it off): a resumed run, the next seed of a sweep or another
fine-tuning run of the same shapes loads its programs instead of compiling them again.
"""
import os
import sys

from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from bertjax import errors
from bertjax.cli import common
from bertjax.core import hostmem

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Python config file, e.g. configs/pretrain.py:variant=base",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics, TensorBoard logs and plots go here.")
flags.DEFINE_enum("multihost", "auto", ["auto", "on", "off"], "Call jax.distributed.initialize().")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (explicit multi-process runs).")
flags.DEFINE_integer("num_processes", None, "Number of processes (explicit multi-process runs).")
flags.DEFINE_integer("process_id", None, "This process's index (explicit multi-process runs).")
flags.mark_flags_as_required(["config", "workdir"])


def _multihost_environment() -> bool:
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return len([h for h in hosts.split(",") if h]) > 1 or "SLURM_NTASKS" in os.environ and \
      int(os.environ.get("SLURM_NTASKS", "1")) > 1


def init_distributed() -> None:
  import jax
  if FLAGS.coordinator_address or FLAGS.num_processes is not None or FLAGS.process_id is not None:
    n, i = FLAGS.num_processes, FLAGS.process_id
    if not FLAGS.coordinator_address or n is None or i is None or n < 1 or not 0 <= i < n:
      raise errors.ConfigError("an explicit multi-process run takes --coordinator_address=HOST:PORT, "
                               "--num_processes=N (>= 1) and --process_id=I (0 <= I < N) together; got "
                               f"{FLAGS.coordinator_address or 'no address'}, {n}, {i}")
    jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address, num_processes=FLAGS.num_processes,
                               process_id=FLAGS.process_id)
  elif FLAGS.multihost == "on" or (FLAGS.multihost == "auto" and _multihost_environment()):
    jax.distributed.initialize()


def step_values(config) -> int:
  """Tokens per step x the hidden width of the model a bertjax config trains: its init's (read from the init's
  config files, no weights) or its own model section's; BERT-base's width where neither can be read (the
  config's own checks name what is wrong)."""
  width = hostmem.DEFAULT_WIDTH
  try:
    from bertjax import model as model_lib
    from bertjax.convert import weights
    init = str(config.get("init", "") or "")
    cfg = weights.config_of(init) if init else model_lib.BertConfig.from_dict(config.model.to_dict())
    width = int(cfg.hidden_size) or hostmem.DEFAULT_WIDTH
  except Exception:  # noqa: BLE001 - only a tuning hint; the run reports a bad config or init itself
    pass
  return hostmem.config_tokens(config) * width


def run(argv):
  del argv
  hostmem.tune_for_cpu(step_values(FLAGS.config))  # before JAX's backend starts its threads
  init_distributed()
  import jax
  # Library INFO logs (orbax writes several lines per save) are off; progress is printed by process 0.
  absl_logging.set_verbosity(absl_logging.WARNING if jax.process_index() == 0 else absl_logging.ERROR)
  from bertjax.core import goodput
  started = goodput.process_start()  # start-up is counted from the process's start, imports included
  if FLAGS.config.get("mode") == "finetune":
    from bertjax import finetune
    finetune.finetune(FLAGS.config, FLAGS.workdir, started=started)
    return
  from bertjax import pretrain  # pre-training's data (tfds) is imported only for a pre-training run
  summary = pretrain.train_and_evaluate(FLAGS.config, FLAGS.workdir, started=started)
  if jax.process_index() == 0:
    ev = summary.get("eval") or {}
    print(f"done at step {summary['final_step']}" + (" (preempted; resume with the same command)"
                                                     if summary["preempted"] else "") +
          (f"; eval mlm_accuracy {ev['mlm_accuracy']:.4f}" if "mlm_accuracy" in ev else "") +
          f"; {goodput.line(summary['goodput'])}", flush=True)


def config_doc(path: str) -> str:
  """A config file's description (its docstring), read without running it."""
  import ast
  with open(path, encoding="utf-8") as f:
    return ast.get_docstring(ast.parse(f.read())) or ""


def usage() -> str:
  """This command's help: what it does, its flags, and each recipe in configs/ with the first line of its
  description (each file's docstring gives its arguments)."""
  lines = [__doc__.strip(), "", "Flags:"]
  for name in ("config", "workdir", "multihost", "coordinator_address", "num_processes", "process_id"):
    lines.append(f"  --{name}: {FLAGS[name].help}")
  lines += ["  --config.SECTION.KEY=VALUE: any field of the config (a mistyped key is an error naming the nearest)",
            "", "Configs (`--config=configs/NAME.py:ARGS`; `train --help configs/NAME.py` lists a recipe's ARGS):"]
  folder = os.path.join(common.REPO, "configs")
  for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
    if name.endswith(".py") and name not in ("__init__.py", "common.py"):
      first = " ".join(config_doc(os.path.join(folder, name)).split("\n\n")[0].split()).removesuffix(" Usage:")
      first = first.split(": ")[0] if len(first) > 110 else first
      lines.append(f"  configs/{name}: {first[:100] + ('...' if len(first) > 100 else '')}")
  return "\n".join(lines)


def main(argv=None) -> int:
  """Runs the command with `argv`, the arguments after `train` (default: this process's)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv and argv[0] in ("-h", "--help"):
    if len(argv) > 1:  # one recipe's description and arguments
      path = common.resolve_config_path([f"--config={argv[1]}"])[0].split("=", 1)[1].split(":")[0]
      print(config_doc(path) or f"{path}: no description")
      return 0
    print(usage())
    return 0
  common.run_absl(run, argv=[sys.argv[0], *argv])
  return 0
