// Same-host GPU-to-GPU weight installs (policy.h: DeviceImage, ExportDeviceImage,
// InstallDeviceImage) and the flat parameter storage that makes an install one copy.
//
// An exporter (the trainer) writes its weights as F32 into memory it allocates with
// cudaMalloc (not the caching allocator: an IPC handle then names exactly the image),
// computes the image's BlockSumDigest on the GPU, stamps it with its version and hands
// out the handle; it rewrites a retired image in place (same handle). An importer (a
// rollout replica) maps the handle once and keeps the mapping, and per install checks
// the stamp, copies the image into its own flat buffer in one operation (a cast when
// it serves bf16 / fp16) and checks the stamp again: a rewrite that raced the copy is
// seen. The digest is checked too when asked (one more read pass).
#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <unordered_set>

#ifdef RLFLEET_TORCH_CUDA  // (a CUDA libtorch: deploy/gpu/CMakeLists.txt)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/str_cat.h"
#include "libs/common/checksum.h"
#include "libs/common/status_macros.h"
#include "libs/model/policy.h"
#include "libs/model/policy_impl.h"

namespace rlfleet::model {
namespace {

// An image's memory: the F32 parameters (ref.length_bytes), then, at StampOffset, its
// stamp: the version it holds once written, 0 while being written.
uint64_t StampOffset(uint64_t length) { return (length + 255) / 256 * 256; }

// The allocation behind an image of `length` bytes: the image and its stamp, rounded up
// to whole 2 MiB pages. (An importer reads an allocation of another size, mapped through
// CUDA IPC, ~25% slower: on an H200, 1.98 GB in 1178 us against 932 us.)
uint64_t AllocationBytes(uint64_t length) {
  constexpr uint64_t kPage = uint64_t{2} << 20;
  return (StampOffset(length) + sizeof(uint64_t) + kPage - 1) / kPage * kPage;
}

int64_t MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
}

// common::BlockSumDigest of the bytes of `words` (a contiguous 1-D int32 tensor),
// computed where the tensor is: one read pass, and only the block sums (a thousandth
// of the bytes) come to the host.
uint64_t BlockSumDigestOf(const torch::Tensor& words) {
  const int64_t n = words.numel(), k = common::kBlockSumWords, full = n / k, tail = n % k;
  std::vector<torch::Tensor> parts;
  if (full > 0) parts.push_back(words.narrow(0, 0, full * k).view({full, k}).sum(1, false, torch::kInt32));
  if (tail > 0) parts.push_back(words.narrow(0, full * k, tail).sum(0, false, torch::kInt32).view({1}));
  if (parts.empty()) return common::BlockSumDigest({});
  const torch::Tensor sums = torch::cat(parts).to(torch::kCPU).contiguous();
  return common::Xxh64(
      absl::string_view(reinterpret_cast<const char*>(sums.data_ptr<int32_t>()), sums.numel() * sizeof(int32_t)));
}

// The flat F32 image of `impl`'s parameters, written into `dst` ([numel] F32).
void WriteImage(Policy::Impl& impl, torch::Tensor& dst) {
  if (impl.flat.defined()) {
    dst.copy_(impl.flat);
    return;
  }
  int64_t offset = 0;
  for (const auto& item : impl.named_parameters()) {
    dst.narrow(0, offset, item.value().numel()).copy_(item.value().detach().reshape({-1}));
    offset += item.value().numel();
  }
}

// `src` ([numel] F32, the image) into `impl`'s parameters (cast to their dtype).
void ReadImage(Policy::Impl& impl, const torch::Tensor& src) {
  if (impl.flat.defined()) {
    impl.flat.copy_(src);
    return;
  }
  int64_t offset = 0;
  for (auto& item : impl.named_parameters()) {
    item.value().copy_(src.narrow(0, offset, item.value().numel()).view(item.value().sizes()));
    offset += item.value().numel();
  }
}

}  // namespace

void FlattenParameters(Policy::Impl& impl) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params;
  std::unordered_set<const void*> seen;
  int64_t total = 0;
  for (const auto& item : impl.named_parameters()) {
    const torch::Tensor& p = item.value();
    // A parameter listed twice (tied under two names), or of another dtype or device:
    // left as it is (images are then written and read parameter by parameter).
    if (!seen.insert(p.unsafeGetTensorImpl()).second || p.scalar_type() != impl.dtype || p.device() != impl.device ||
        !p.is_contiguous()) {
      return;
    }
    params.push_back(p);
    total += p.numel();
  }
  if (params.empty()) return;
  torch::Tensor flat = torch::empty({total}, params[0].options().requires_grad(false));
  int64_t offset = 0;
  for (torch::Tensor& p : params) {
    torch::Tensor view = flat.narrow(0, offset, p.numel()).view(p.sizes());
    view.copy_(p);
    p.set_data(view);
    offset += p.numel();
  }
  impl.flat = flat;
}

struct DeviceImage::Rep {
  Ref ref;
  void* ptr = nullptr;  // cudaMalloc'ed: the image and its stamp
  int device = -1;
  Rep() = default;
  Rep(const Rep&) = delete;
  Rep& operator=(const Rep&) = delete;
  ~Rep() {
#ifdef RLFLEET_TORCH_CUDA
    if (ptr != nullptr) {
      int current = 0;
      (void)cudaGetDevice(&current);
      (void)cudaSetDevice(device);
      (void)cudaFree(ptr);
      (void)cudaSetDevice(current);
    }
#endif
  }
};

DeviceImage::DeviceImage() = default;
DeviceImage::~DeviceImage() = default;
DeviceImage::DeviceImage(DeviceImage&&) noexcept = default;
DeviceImage& DeviceImage::operator=(DeviceImage&&) noexcept = default;

const DeviceImage::Ref& DeviceImage::ref() const {
  static const Ref* const kEmpty = new Ref();
  return rep_ != nullptr ? rep_->ref : *kEmpty;
}

bool DeviceImage::empty() const { return rep_ == nullptr; }

uint64_t Policy::LayoutFingerprint() const {
  if (impl_->layout_fingerprint == 0) {  // (once: names and shapes never change)
    std::string text;
    for (const auto& item : impl_->named_parameters()) {
      absl::StrAppend(&text, item.key(), "[");
      for (int64_t d : item.value().sizes()) absl::StrAppend(&text, d, ",");
      absl::StrAppend(&text, "];");
    }
    impl_->layout_fingerprint = common::Xxh64(text) | 1;  // (never 0)
  }
  return impl_->layout_fingerprint;
}

#ifndef RLFLEET_TORCH_CUDA

absl::StatusOr<DeviceImage> Policy::ExportDeviceImage(uint64_t, DeviceImage) {
  return absl::FailedPreconditionError(
      absl::StrCat("device images are CUDA memory; the model backend (", ModelBackend(), ") was built without CUDA"));
}

absl::Status Policy::InstallDeviceImage(const DeviceImage::Ref&, bool, DeviceInstallReport*) {
  return absl::FailedPreconditionError(
      absl::StrCat("device images are CUDA memory; the model backend (", ModelBackend(), ") was built without CUDA"));
}

#else

namespace {

absl::Status CudaError(const char* what, cudaError_t e) {
  (void)cudaGetLastError();  // (clears it: a failed call must not fail the next one)
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

// Two uint64 of pinned host memory for `impl`'s stamp reads (made at the first install).
absl::StatusOr<uint64_t*> StampSlots(Policy::Impl& impl) {
  if (impl.stamps == nullptr) {
    void* slots = nullptr;
    if (cudaError_t e = cudaHostAlloc(&slots, 2 * sizeof(uint64_t), cudaHostAllocDefault); e != cudaSuccess) {
      return CudaError("InstallDeviceImage: cudaHostAlloc", e);
    }
    impl.stamps = std::shared_ptr<void>(slots, [](void* p) { (void)cudaFreeHost(p); });
  }
  return static_cast<uint64_t*>(impl.stamps.get());
}

// Two CUDA events for timing `impl`'s install copies (made at the first install).
absl::StatusOr<cudaEvent_t*> CopyEvents(Policy::Impl& impl) {
  if (impl.copy_events == nullptr) {
    auto* events = new cudaEvent_t[2]{};
    for (int i = 0; i < 2; ++i) {
      if (cudaError_t e = cudaEventCreate(&events[i]); e != cudaSuccess) {
        if (i == 1) (void)cudaEventDestroy(events[0]);
        delete[] events;
        return CudaError("InstallDeviceImage: cudaEventCreate", e);
      }
    }
    impl.copy_events = std::shared_ptr<void>(events, [](void* p) {
      auto* ev = static_cast<cudaEvent_t*>(p);
      (void)cudaEventDestroy(ev[0]);
      (void)cudaEventDestroy(ev[1]);
      delete[] ev;
    });
  }
  return static_cast<cudaEvent_t*>(impl.copy_events.get());
}

// The mapping of `handle` (another process's memory) for `impl`, kept from an earlier
// install or made now (*mapped); the two most recently used are kept.
absl::StatusOr<char*> MapImage(Policy::Impl& impl, const std::string& handle_bytes, bool* mapped) {
  auto& cache = impl.device_mappings;
  for (auto it = cache.begin(); it != cache.end(); ++it) {
    if (it->first == handle_bytes) {
      auto entry = std::move(*it);
      cache.erase(it);
      cache.push_back(std::move(entry));
      *mapped = false;
      return static_cast<char*>(cache.back().second.get());
    }
  }
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, handle_bytes.data(), sizeof(handle));
  void* ptr = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("cannot map the device image (cudaIpcOpenMemHandle: ", cudaGetErrorName(e),
                     "): its exporter exited or freed it, or it is on a GPU this one cannot reach"));
  }
  const int device = impl.device.index();
  cache.emplace_back(handle_bytes, std::shared_ptr<void>(ptr, [device](void* p) {
                       int current = 0;
                       (void)cudaGetDevice(&current);
                       (void)cudaSetDevice(device);
                       (void)cudaDeviceSynchronize();  // (no copy from it still running)
                       (void)cudaIpcCloseMemHandle(p);
                       (void)cudaSetDevice(current);
                     }));
  while (cache.size() > 2) cache.pop_front();
  *mapped = true;
  return static_cast<char*>(ptr);
}

}  // namespace

absl::StatusOr<DeviceImage> Policy::ExportDeviceImage(uint64_t version, DeviceImage reuse) {
  if (!impl_->device.is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device images are CUDA memory; this policy is on ", impl_->device.str()));
  }
  if (version == 0) return absl::InvalidArgumentError("a device image holds a version >= 1");
  return Guarded("ExportDeviceImage", [&]() -> absl::StatusOr<DeviceImage> {
    torch::NoGradGuard no_grad;
    const c10::cuda::CUDAGuard guard(impl_->device);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    const int64_t numel = num_parameters();
    const uint64_t length = static_cast<uint64_t>(numel) * sizeof(float);
    DeviceImage image = std::move(reuse);
    if (image.empty() || image.rep_->ref.length_bytes != length || image.rep_->device != impl_->device.index()) {
      image = DeviceImage();
      auto rep = std::make_unique<DeviceImage::Rep>();
      rep->device = impl_->device.index();
      if (cudaError_t e = cudaMalloc(&rep->ptr, AllocationBytes(length)); e != cudaSuccess) {
        rep->ptr = nullptr;
        (void)cudaGetLastError();
        return absl::ResourceExhaustedError(
            absl::StrCat("ExportDeviceImage: ", length, " bytes of device memory: ", cudaGetErrorString(e)));
      }
      cudaIpcMemHandle_t handle;
      if (cudaError_t e = cudaIpcGetMemHandle(&handle, rep->ptr); e != cudaSuccess) {
        return CudaError("ExportDeviceImage: cudaIpcGetMemHandle", e);
      }
      rep->ref.ipc_handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
      char bus[32] = {};
      if (cudaError_t e = cudaDeviceGetPCIBusId(bus, sizeof(bus), rep->device); e != cudaSuccess) {
        return CudaError("ExportDeviceImage: cudaDeviceGetPCIBusId", e);
      }
      rep->ref.pci_bus_id = bus;
      rep->ref.length_bytes = length;
      image.rep_ = std::move(rep);
    }
    // The stamp says "being written" before anything changes, and the version after.
    char* stamp = static_cast<char*>(image.rep_->ptr) + StampOffset(length);
    const uint64_t writing = 0;
    if (cudaError_t e = cudaMemcpyAsync(stamp, &writing, sizeof(writing), cudaMemcpyHostToDevice, stream);
        e != cudaSuccess) {
      return CudaError("ExportDeviceImage: clearing the stamp", e);
    }
    torch::Tensor dst =
        torch::from_blob(image.rep_->ptr, {numel}, torch::TensorOptions().dtype(torch::kFloat32).device(impl_->device));
    WriteImage(*impl_, dst);
    image.rep_->ref.digest = BlockSumDigestOf(dst.view(torch::kInt32));
    image.rep_->ref.layout = LayoutFingerprint();
    image.rep_->ref.version = version;
    if (cudaError_t e = cudaMemcpyAsync(stamp, &version, sizeof(version), cudaMemcpyHostToDevice, stream);
        e != cudaSuccess) {
      return CudaError("ExportDeviceImage: writing the stamp", e);
    }
    // Written before anyone is told where it is: another process reads it on its own stream.
    if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
      return CudaError("ExportDeviceImage: cudaStreamSynchronize", e);
    }
    return image;
  });
}

absl::Status Policy::InstallDeviceImage(const DeviceImage::Ref& ref, bool verify, DeviceInstallReport* report) {
  DeviceInstallReport unused;
  if (report == nullptr) report = &unused;
  *report = DeviceInstallReport();
  if (!impl_->device.is_cuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device images are CUDA memory; this policy is on ", impl_->device.str()));
  }
  if (ref.ipc_handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ipc_handle has ", ref.ipc_handle.size(), " bytes; want ", sizeof(cudaIpcMemHandle_t)));
  }
  if (const uint64_t layout = LayoutFingerprint(); ref.layout != layout) {
    return absl::InvalidArgumentError(
        absl::StrCat("the device image's layout ", absl::Hex(ref.layout, absl::kZeroPad16), " is not this policy's ",
                     absl::Hex(layout, absl::kZeroPad16), " (another model shape or parameter set)"));
  }
  const int64_t numel = impl_->flat.defined() ? impl_->flat.numel() : num_parameters();
  if (ref.length_bytes != static_cast<uint64_t>(numel) * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("the device image has ", ref.length_bytes, " bytes; this policy's ",
                                                   numel, " F32 parameters are ", numel * sizeof(float)));
  }
  return Guarded("InstallDeviceImage", [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    const c10::cuda::CUDAGuard guard(impl_->device);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    auto start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(char* ptr, MapImage(*impl_, ref.ipc_handle, &report->mapped));
    report->open_us = MicrosSince(start);
    const char* stamp = ptr + StampOffset(ref.length_bytes);
    ASSIGN_OR_RETURN(uint64_t* const slots, StampSlots(*impl_));
    // The stamp into `slot` after what the stream holds; `sync`: and waits for it.
    auto read_stamp = [&](int slot, bool sync) -> absl::Status {
      if (cudaError_t e = cudaMemcpyAsync(&slots[slot], stamp, sizeof(uint64_t), cudaMemcpyDeviceToHost, stream);
          e != cudaSuccess) {
        return CudaError("reading a device image's stamp", e);
      }
      if (cudaError_t e = sync ? cudaStreamSynchronize(stream) : cudaSuccess; e != cudaSuccess) {
        return CudaError("InstallDeviceImage: cudaStreamSynchronize", e);
      }
      return absl::OkStatus();
    };
    auto check_stamp = [&](int slot, const char* when) -> absl::Status {
      const uint64_t holds = slots[slot];
      if (holds == ref.version) return absl::OkStatus();
      const std::string what = holds == 0 ? "is being rewritten" : absl::StrCat("holds version ", holds);
      return report->weights_changed
                 ? absl::DataLossError(absl::StrCat("the device image of version ", ref.version, " ", what, " ", when,
                                                    ": these weights are a mix of two versions"))
                 : absl::UnavailableError(
                       absl::StrCat("the device image of version ", ref.version, " ", what, " ", when));
    };
    RETURN_IF_ERROR(read_stamp(0, /*sync=*/true));
    RETURN_IF_ERROR(check_stamp(0, "before the copy"));
    const torch::Tensor src =
        torch::from_blob(ptr, {numel}, torch::TensorOptions().dtype(torch::kFloat32).device(impl_->device));
    if (verify) {
      start = std::chrono::steady_clock::now();
      const uint64_t digest = BlockSumDigestOf(src.view(torch::kInt32));
      report->verify_us = MicrosSince(start);
      if (digest != ref.digest) {
        return absl::DataLossError(absl::StrCat("the device image's digest does not match (",
                                                absl::Hex(digest, absl::kZeroPad16), ", published ",
                                                absl::Hex(ref.digest, absl::kZeroPad16), "); nothing was installed"));
      }
    }
    ASSIGN_OR_RETURN(cudaEvent_t* const events, CopyEvents(*impl_));
    start = std::chrono::steady_clock::now();
    report->weights_changed = true;
    report->one_copy = impl_->flat.defined();
    (void)cudaEventRecord(events[0], stream);
    if (impl_->flat.defined() && impl_->flat.scalar_type() == torch::kFloat32) {  // (one plain copy)
      if (cudaError_t e =
              cudaMemcpyAsync(impl_->flat.data_ptr(), ptr, ref.length_bytes, cudaMemcpyDeviceToDevice, stream);
          e != cudaSuccess) {
        return CudaError("InstallDeviceImage: cudaMemcpyAsync", e);
      }
    } else {
      ReadImage(*impl_, src);
    }
    (void)cudaEventRecord(events[1], stream);
    RETURN_IF_ERROR(read_stamp(1, /*sync=*/true));  // (after the copy, on its stream: one wait for both)
    report->copy_us = MicrosSince(start);
    if (float ms = 0; cudaEventElapsedTime(&ms, events[0], events[1]) == cudaSuccess) {
      report->copy_gpu_us = static_cast<int64_t>(ms * 1000);
    } else {
      (void)cudaGetLastError();
    }
    ++impl_->weights_generation;
    RETURN_IF_ERROR(check_stamp(1, "after the copy"));
    report->bytes = ref.length_bytes;
    return absl::OkStatus();
  });
}

#endif  // RLFLEET_TORCH_CUDA

}  // namespace rlfleet::model
