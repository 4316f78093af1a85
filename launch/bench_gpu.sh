#!/usr/bin/env bash
# GPU benchmark: BERT-large and BERT-base at seq 128 in bfloat16, each beside HF transformers' PyTorch BERT on the
# same GPU (bf16 autocast) in the same run. One JSON + log per row under OUT (default bench_gpu/).
#   bash launch/bench_gpu.sh [OUT] [extra bench args...]
# Rows (ROWS=...): large fixed-length with rbg dropout bits (the target: >= 1,800 sequences/s, MFU >= 45% on an
# H100), the same with threefry bits, with cuDNN attention (attention-probability dropout off), with the layers
# unrolled instead of scanned (scan_layers=False, or scan_unroll=24 keeping the scanned parameters), with the fused
# Pallas attention (dropout on; scanned and unrolled); base.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
out=${1:-bench_gpu}
shift || true
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
row() {
  local name=$1
  shift
  echo "== $name: $*"
  timeout "${ROW_TIMEOUT:-240}" "$py" -m bertjax.bench --dtype bfloat16 --steps 10 --out "$out/$name.json" "$@" \
    > "$out/$name.log" 2>&1
  local rc=$?
  grep -v '^{' "$out/$name.log" | tail -n 4
  [ $rc -eq 0 ] || echo "   ($name exited $rc; see $out/$name.log)"
}
# cuBLAS for every matrix product (rather than Triton GEMM fusions): faster here, and compiles in a third of the time.
export XLA_FLAGS=${XLA_FLAGS:---xla_gpu_enable_triton_gemm=false}
large=(--variant large --seq 128 --batch 128 --regime fixed)
for spec in ${ROWS:-large_fixed large_threefry large_cudnn large_unrolled base_fixed}; do
  case $spec in
    large_fixed) row "$spec" "${large[@]}" --set train.prng_impl=rbg "$@" ;;
    large_threefry) row "$spec" "${large[@]}" "$@" ;;
    large_cudnn) row "$spec" "${large[@]}" --set train.prng_impl=rbg --set model.attention_impl=cudnn \
      --set model.attention_dropout_rate=0.0 "$@" ;;
    large_unrolled) row "$spec" "${large[@]}" --set train.prng_impl=rbg --set model.scan_layers=False "$@" ;;
    large_scan_unroll) row "$spec" "${large[@]}" --set train.prng_impl=rbg --set model.scan_unroll=24 "$@" ;;
    large_pallas) row "$spec" "${large[@]}" --set train.prng_impl=rbg --set model.attention_impl=pallas "$@" ;;
    large_pallas_unrolled) row "$spec" "${large[@]}" --set train.prng_impl=rbg --set model.attention_impl=pallas \
      --set model.scan_layers=False "$@" ;;
    large_pretrain) row "$spec" --variant large --seq 128 --batch 128 --regime pretrain --set train.prng_impl=rbg "$@" ;;
    base_fixed) row "$spec" --variant base --seq 128 --batch 256 --regime fixed --set train.prng_impl=rbg "$@" ;;
    *) echo "unknown row $spec" ;;
  esac
done
