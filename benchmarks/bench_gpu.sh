#!/usr/bin/env bash
# GPU benchmark: BERT-large and BERT-base at seq 128 in bfloat16, each beside HF transformers' PyTorch BERT on the
# same GPU (bf16 autocast) in the same run. One JSON + log per row under OUT (default bench_gpu/).
#   bash benchmarks/bench_gpu.sh [OUT] [extra bench args...]
# Default rows (ROWS=...): the GPU recipe (rbg dropout bits, fused Pallas attention with dropout, all layers in one
# scan iteration: model.scan_unroll >= num_layers) for large fixed-length rows (the target: >= 1,800 sequences/s,
# MFU >= 45% on an H100), large on the pretraining length distribution, base; and large with scanned layers
# (scan_unroll=1) and XLA attention (the config defaults before scan_unroll's auto, but rbg bits). Ablation rows:
# large_threefry, large_cudnn (attention dropout off), large_unrolled (scan_layers=False), large_scan_unroll (XLA
# attention), large_pallas (scanned), large_pallas_unrolled, large_recipe_hash (hidden dropout masks hashed, not drawn and stored: bertjax/dropout.py),
# large_nodropout (the recipe with dropout off: the ceiling dropout leaves).
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
  # Hidden dropout as every row here was measured: rng masks (the configs' default is now hash; large_recipe_hash).
  timeout "${ROW_TIMEOUT:-240}" "$py" benchmarks/bench.py --dtype bfloat16 --steps 10 --out "$out/$name.json" \
    --set "model.dropout_impl=${DROPOUT_IMPL:-rng}" "$@" \
    > "$out/$name.log" 2>&1
  local rc=$?
  grep -v '^{' "$out/$name.log" | tail -n 4
  [ $rc -eq 0 ] || echo "   ($name exited $rc; see $out/$name.log)"
}
# cuBLAS for every matrix product (rather than Triton GEMM fusions): faster here, and compiles in a third of the time.
export XLA_FLAGS=${XLA_FLAGS:---xla_gpu_enable_triton_gemm=false}
large=(--variant large --seq 128 --batch 128 --regime fixed)
scanned=(--set model.scan_unroll=1)  # the rows named scanned keep one layer per scan iteration (auto unrolls on GPU)
recipe=(--set train.prng_impl=rbg --set model.attention_impl=pallas --set model.scan_unroll=64)
for spec in ${ROWS:-large_recipe large_recipe_pretrain base_recipe large_fixed}; do
  case $spec in
    large_recipe) row "$spec" "${large[@]}" "${recipe[@]}" "$@" ;;
    large_recipe_pretrain) row "$spec" --variant large --seq 128 --batch 128 --regime pretrain "${recipe[@]}" "$@" ;;
    base_recipe) row "$spec" --variant base --seq 128 --batch 256 --regime fixed "${recipe[@]}" "$@" ;;
    large_recipe_hash) row "$spec" "${large[@]}" "${recipe[@]}" --set model.dropout_impl=hash "$@" ;;
    large_nodropout) row "$spec" "${large[@]}" "${recipe[@]}" --set model.dropout_rate=0.0 \
      --set model.attention_dropout_rate=0.0 "$@" ;;
    large_fixed) row "$spec" "${large[@]}" "${scanned[@]}" --set train.prng_impl=rbg "$@" ;;
    large_threefry) row "$spec" "${large[@]}" "${scanned[@]}" "$@" ;;
    large_cudnn) row "$spec" "${large[@]}" "${scanned[@]}" --set train.prng_impl=rbg --set model.attention_impl=cudnn \
      --set model.attention_dropout_rate=0.0 "$@" ;;
    large_unrolled) row "$spec" "${large[@]}" --set train.prng_impl=rbg --set model.scan_layers=False "$@" ;;
    large_scan_unroll) row "$spec" "${large[@]}" --set train.prng_impl=rbg --set model.scan_unroll=64 "$@" ;;
    large_pallas) row "$spec" "${large[@]}" "${scanned[@]}" --set train.prng_impl=rbg --set model.attention_impl=pallas "$@" ;;
    large_pallas_unrolled) row "$spec" "${large[@]}" --set train.prng_impl=rbg --set model.attention_impl=pallas \
      --set model.scan_layers=False "$@" ;;
    large_pretrain) row "$spec" --variant large --seq 128 --batch 128 --regime pretrain "${scanned[@]}" --set train.prng_impl=rbg "$@" ;;
    base_fixed) row "$spec" --variant base --seq 128 --batch 256 --regime fixed "${scanned[@]}" --set train.prng_impl=rbg "$@" ;;
    *) echo "unknown row $spec" ;;
  esac
done
