#!/usr/bin/env bash
# Cloud TPU VM lifecycle for bertjax. Every multi-host command runs on ALL workers: jax.distributed.initialize()
# waits for every host, so a command started on one worker alone hangs.
#
#   launch/tpu_vm.sh create  NAME ZONE ACCELERATOR [VERSION]   # e.g. bert v5litepod-16 us-west4-a
#   launch/tpu_vm.sh setup   NAME ZONE                         # clone/copy + install bertjax[tpu] on every worker
#   launch/tpu_vm.sh run     NAME ZONE -- ARGS...              # python -m bertjax train ARGS on every worker
#   launch/tpu_vm.sh logs    NAME ZONE                         # follow worker 0's log
#   launch/tpu_vm.sh stop    NAME ZONE                         # stop the run on every worker (SIGTERM: saves)
#   launch/tpu_vm.sh delete  NAME ZONE
#
# Data and workdir live in a bucket: --workdir=gs://BUCKET/runs/NAME --config.data.data_dir=gs://BUCKET/data
# (orbax and tfds read gs:// through gcsfs, installed by the tpu extra). Environment on the workers:
#   JAX_PLATFORMS=tpu (default there); TPU_WORKER_HOSTNAMES is set by the VM, so python -m bertjax train initialises
#   jax.distributed on its own (--multihost=auto). A preempted VM delivers SIGTERM: the run saves and exits 0;
#   rerun the same `run` command to resume from the bucket. JAX_COMPILATION_CACHE_DIR defaults to
#   ~/.cache/bertjax-xla on each worker, so a resumed run on the same VM loads its compiled step.
set -euo pipefail

cmd="${1:?usage: launch/tpu_vm.sh create|setup|run|logs|stop|delete NAME ZONE ...}"
name="${2:?TPU name}"
zone="${3:?zone}"
shift 3
repo_dir="bertjax"
log="/tmp/bertjax.log"
ssh_all() { gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=all --command "$1"; }

case "$cmd" in
  create)
    accel="${1:?accelerator type, e.g. v5litepod-16}"
    version="${2:-v2-alpha-tpuv5-lite}"
    gcloud compute tpus tpu-vm create "$name" --zone "$zone" --accelerator-type "$accel" --version "$version"
    ;;
  setup)
    tar czf /tmp/bertjax_src.tgz --exclude .venv --exclude runs --exclude .git -C "$(dirname "$0")/.." .
    gcloud compute tpus tpu-vm scp /tmp/bertjax_src.tgz "$name":~/ --zone "$zone" --worker=all
    ssh_all "mkdir -p $repo_dir && tar xzf bertjax_src.tgz -C $repo_dir && cd $repo_dir && \
      python3 -m venv .venv && .venv/bin/pip install -q -c requirements.lock -e '.[tpu]'"
    ;;
  run)
    [ "${1:-}" = "--" ] && shift
    args=$(printf '%q ' "$@")
    ssh_all "cd $repo_dir && JAX_COMPILATION_CACHE_DIR=\${JAX_COMPILATION_CACHE_DIR:-\$HOME/.cache/bertjax-xla} \
      nohup .venv/bin/python -m bertjax train $args > $log 2>&1 &"
    echo "started on all workers; follow with: launch/tpu_vm.sh logs $name $zone"
    ;;
  logs)
    gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=0 --command "tail -n 100 -f $log"
    ;;
  stop)
    ssh_all "pkill -TERM -f 'bertjax train' || true"
    ;;
  delete)
    gcloud compute tpus tpu-vm delete "$name" --zone "$zone" --quiet
    ;;
  *)
    echo "unknown command $cmd" >&2
    exit 2
    ;;
esac
