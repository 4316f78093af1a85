"""Entry point: python -m bertjax.main --config=configs/pretrain.py:variant=base --workdir=DIR [--config.x=y ...]

Multi-process runs (TPU pods, GPU clusters) call `jax.distributed.initialize()` on every process: automatically
on a multi-host TPU VM or under SLURM, or explicitly with --coordinator_address/--num_processes/--process_id.
"""
import os
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

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
  import jax  # pylint: disable=import-outside-toplevel
  if FLAGS.coordinator_address:
    jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address, num_processes=FLAGS.num_processes,
                               process_id=FLAGS.process_id)
  elif FLAGS.multihost == "on" or (FLAGS.multihost == "auto" and _multihost_environment()):
    jax.distributed.initialize()


def main(argv):
  del argv
  init_distributed()
  import jax  # pylint: disable=import-outside-toplevel
  from bertjax import checkpoint, train  # pylint: disable=import-outside-toplevel
  # Library INFO logs (orbax writes several lines per save) are off; progress is printed by process 0.
  absl_logging.set_verbosity(absl_logging.WARNING if jax.process_index() == 0 else absl_logging.ERROR)
  from bertjax import convert  # pylint: disable=import-outside-toplevel
  from bertjax.data import tasks, tokenizer  # pylint: disable=import-outside-toplevel
  # The same mistakes give the same one-line error and exit code in every mode.
  errors = (train.ConfigError, train.NonFiniteError, tasks.TaskDataError, checkpoint.CheckpointError,
            checkpoint.WorkdirLockedError, convert.ConversionError, tokenizer.TokenizerError, OSError)
  try:
    if FLAGS.config.get("mode") == "finetune":
      from bertjax import finetune  # pylint: disable=import-outside-toplevel
      finetune.finetune(FLAGS.config, FLAGS.workdir)
      return
    summary = train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except errors as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  if jax.process_index() == 0:
    ev = summary.get("eval") or {}
    print(f"done at step {summary['final_step']}" + (" (preempted; resume with the same command)"
                                                     if summary["preempted"] else "") +
          (f"; eval mlm_accuracy {ev['mlm_accuracy']:.4f}" if "mlm_accuracy" in ev else ""), flush=True)


if __name__ == "__main__":
  app.run(main)
