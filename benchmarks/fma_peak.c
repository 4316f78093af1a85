/* Peak FP32 FMA throughput of this CPU's cores: twelve independent 256-bit FMA chains per thread (enough to cover
   the FMA latency on two pipes), one thread per core; the ceiling any FP32 GEMM here can reach.
   -O3 keeps the accumulators in registers (at -O2 gcc 12 keeps them in memory and measures the loads and stores instead).
   gcc -O3 -march=native -fopenmp launch/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>

#define CHAINS 12

static double run(long iters) {
  float sink = 0.f;
#pragma omp parallel reduction(+ : sink)
  {
    __m256 acc[CHAINS];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_set1_ps((float)c);
    for (long i = 0; i < iters; i++)
      for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    float out[8];
    for (int c = 1; c < CHAINS; c++) acc[0] = _mm256_add_ps(acc[0], acc[c]);
    _mm256_storeu_ps(out, acc[0]);
    sink += out[0];
  }
  return sink;
}

int main(void) {
  const long iters = 200000000L;
  for (int threads = 1; threads <= omp_get_num_procs(); threads++) {
    omp_set_num_threads(threads);
    double best = 0, sink = 0;
    for (int rep = 0; rep < 3; rep++) {
      double t = omp_get_wtime();
      sink += run(iters);
      t = omp_get_wtime() - t;
      double gflops = 2.0 * 8 * CHAINS * iters * threads / t / 1e9;
      if (gflops > best) best = gflops;
    }
    printf("threads %d: %.1f GFLOP/s FP32 FMA (best of 3)%s\n", threads, best, sink == 42 ? " " : "");
  }
  return 0;
}
