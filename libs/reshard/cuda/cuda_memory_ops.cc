#include "libs/reshard/cuda/cuda_memory_ops.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "libs/reshard/cuda/kernels.h"

namespace rlfleet::reshard {
namespace {

absl::Status CudaStatus(int err, const char* what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(static_cast<cudaError_t>(err))));
}

class CudaMemoryOps : public MemoryOps {
 public:
  CudaMemoryOps(int device, cudaStream_t stream, bool owns_stream, uint64_t* accumulators)
      : device_(device), stream_(stream), owns_stream_(owns_stream), acc_(accumulators) {}
  ~CudaMemoryOps() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaFree(acc_);
    if (owns_stream_) cudaStreamDestroy(stream_);
  }

  transport::MemoryKind kind() const override { return transport::MemoryKind::kCuda; }

  void Copy(void* dst, const void* src, uint64_t bytes) override {
    Note(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
  }
  void CastF32ToBf16(void* dst, const void* src, uint64_t count) override {
    Note(cuda::LaunchCastF32ToBf16(dst, src, count, stream_), "cast kernel");
  }
  void ResetDigests(int slots) override {
    if (slots > kMaxSlots) {
      Note(cudaErrorInvalidValue, "more digest slots than kMaxSlots");
      return;
    }
    slots_ = slots;
    Note(cudaMemsetAsync(acc_, 0, sizeof(uint64_t) * slots, stream_), "cudaMemsetAsync");
  }
  void AddDigest(int slot, const void* data, uint64_t bytes, uint64_t shard_offset) override {
    if (slot < 0 || slot >= slots_) {
      Note(cudaErrorInvalidValue, "digest slot out of range");
      return;
    }
    Note(cuda::LaunchDigest(acc_ + slot, data, bytes, shard_offset, stream_), "digest kernel");
  }
  absl::StatusOr<std::vector<uint64_t>> Digests() override {
    std::vector<uint64_t> out(slots_);
    if (slots_ > 0) {
      Note(cudaMemcpyAsync(out.data(), acc_, sizeof(uint64_t) * slots_, cudaMemcpyDeviceToHost, stream_),
           "cudaMemcpyAsync");
    }
    if (absl::Status s = Sync(); !s.ok()) return s;
    return out;
  }
  absl::Status Sync() override {
    Note(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    absl::Status s = first_error_;
    first_error_ = absl::OkStatus();
    return s;
  }

  static constexpr int kMaxSlots = 1024;

 private:
  // Enqueue errors surface at the next Sync().
  void Note(int err, const char* what) {
    if (err != 0 && first_error_.ok()) first_error_ = CudaStatus(err, what);
  }

  const int device_;
  const cudaStream_t stream_;
  const bool owns_stream_;
  uint64_t* const acc_;
  int slots_ = 0;
  absl::Status first_error_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryOps>> NewCudaMemoryOps(int device, void* stream) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", device, " (", count, " visible)"));
  }
  if (auto s = CudaStatus(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool owns = s == nullptr;
  if (owns) {
    if (auto st = CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); !st.ok()) {
      return st;
    }
  }
  uint64_t* acc = nullptr;
  if (auto st = CudaStatus(cudaMalloc(&acc, sizeof(uint64_t) * CudaMemoryOps::kMaxSlots), "cudaMalloc"); !st.ok()) {
    if (owns) cudaStreamDestroy(s);
    return st;
  }
  return std::unique_ptr<MemoryOps>(new CudaMemoryOps(device, s, owns, acc));
}

}  // namespace rlfleet::reshard
