// CUDA_OR_DIE(call): a CUDA runtime call in a GPU benchmark; on an error it prints the
// program, the call and CUDA's message, and exits 1 (a benchmark has nothing to go on
// with).
#ifndef RLFLEET_BENCH_CUDA_CHECK_H_
#define RLFLEET_BENCH_CUDA_CHECK_H_

#include <cuda_runtime_api.h>
#include <errno.h>  // program_invocation_short_name (glibc)

#include <cstdio>
#include <cstdlib>

#define CUDA_OR_DIE(call)                                                                                         \
  do {                                                                                                            \
    if (cudaError_t cuda_error = (call); cuda_error != cudaSuccess) {                                             \
      std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, #call, cudaGetErrorString(cuda_error)); \
      std::exit(1);                                                                                               \
    }                                                                                                             \
  } while (0)

#endif  // RLFLEET_BENCH_CUDA_CHECK_H_
