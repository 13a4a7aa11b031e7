// MemoryOps for shards in CUDA device memory: copies are cudaMemcpyAsync, the cast and
// the digest are kernels (libs/reshard/cuda/kernels.cu), all on one stream. Compiles
// everywhere; runs where a GPU is (tests tagged "gpu").
#ifndef RLFLEET_LIBS_RESHARD_CUDA_CUDA_MEMORY_OPS_H_
#define RLFLEET_LIBS_RESHARD_CUDA_CUDA_MEMORY_OPS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "libs/reshard/executor.h"

namespace rlfleet::reshard {

// On `device`, enqueuing on `stream` (a cudaStream_t; null: a stream of its own).
// FAILED_PRECONDITION without a usable device.
absl::StatusOr<std::unique_ptr<MemoryOps>> NewCudaMemoryOps(int device, void* stream = nullptr);

}  // namespace rlfleet::reshard

#endif  // RLFLEET_LIBS_RESHARD_CUDA_CUDA_MEMORY_OPS_H_
