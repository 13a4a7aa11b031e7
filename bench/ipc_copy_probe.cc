// ipc_copy_probe: why a copy out of another process's GPU memory (CUDA IPC) runs slower
// than cudaMemcpy between two buffers of one process (bench/gpu_install: ~3.3 against
// ~4.2 TB/s on an H200). One run separates the candidate causes:
//  - the mapping: the same random bytes read through a legacy IPC mapping
//    (cudaIpcOpenMemHandle), through a VMM import (cuMemCreate exported as a POSIX file
//    descriptor, mapped with cuMemMap at the recommended granularity) and from a local
//    buffer;
//  - the data: a local copy of a constant pattern (what the reference copied) against a
//    local copy of random bytes, and an IPC-mapped constant buffer.
// The parent allocates and fills the exported buffers, then runs itself (`child ...`)
// with the handles; the child times each copy into one local destination with CUDA
// events (median of --repeats) and prints a table; its last lines are name=value pairs.
//   bazel build //bench:ipc_copy_probe; on the GPU host: ipc_copy_probe [--mib=1884]
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "bench/cpu_model.h"
#include "bench/cuda_check.h"
#include "bench/cuda_copy.h"

namespace {

using rlfleet::bench::Median;
using rlfleet::bench::RandomWeights;
using rlfleet::bench::TimedCopyMicros;

#define CU_OR_DIE(call)                                                                 \
  do {                                                                                  \
    if (CUresult cu_result = (call); cu_result != CUDA_SUCCESS) {                       \
      std::fprintf(stderr, "ipc_copy_probe: %s: CUresult %d\n", #call, int(cu_result)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

// The driver entry points used, found through the runtime (no link to libcuda).
struct Driver {
  decltype(&cuMemCreate) create;
  decltype(&cuMemExportToShareableHandle) export_handle;
  decltype(&cuMemImportFromShareableHandle) import_handle;
  decltype(&cuMemAddressReserve) reserve;
  decltype(&cuMemMap) map;
  decltype(&cuMemSetAccess) set_access;
  decltype(&cuMemGetAllocationGranularity) granularity;
};

template <typename F>
void Find(const char* name, F* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CUDA_OR_DIE(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "ipc_copy_probe: no driver entry point %s\n", name);
    std::exit(1);
  }
  *out = reinterpret_cast<F>(fn);
}

Driver LoadDriver() {
  Driver d{};
  Find("cuMemCreate", &d.create);
  Find("cuMemExportToShareableHandle", &d.export_handle);
  Find("cuMemImportFromShareableHandle", &d.import_handle);
  Find("cuMemAddressReserve", &d.reserve);
  Find("cuMemMap", &d.map);
  Find("cuMemSetAccess", &d.set_access);
  Find("cuMemGetAllocationGranularity", &d.granularity);
  return d;
}

CUmemAllocationProp VmmProp(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// `handle` mapped read-write on `device` at a fresh address.
void* MapVmm(const Driver& d, CUmemGenericAllocationHandle handle, size_t bytes, int device) {
  CUdeviceptr ptr = 0;
  CU_OR_DIE(d.reserve(&ptr, bytes, 0, 0, 0));
  CU_OR_DIE(d.map(ptr, bytes, 0, handle, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_OR_DIE(d.set_access(ptr, bytes, &access, 1));
  return reinterpret_cast<void*>(ptr);
}

size_t RoundUp(size_t bytes, size_t granule) { return (bytes + granule - 1) / granule * granule; }

// The copy as an install does it, timed on the host's clock: cudaMemcpyAsync, then an
// 8-byte read of the source's last word into pinned memory, then cudaStreamSynchronize.
double HostTimedInstallMicros(void* dst, const void* src, size_t bytes, int repeats, uint64_t* pinned) {
  std::vector<double> us;
  for (int i = 0; i < repeats + 2; ++i) {
    const auto start = std::chrono::steady_clock::now();
    CUDA_OR_DIE(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
    CUDA_OR_DIE(cudaMemcpyAsync(pinned, static_cast<const char*>(src) + bytes - 8, 8, cudaMemcpyDeviceToHost));
    CUDA_OR_DIE(cudaStreamSynchronize(nullptr));
    if (i >= 2)
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  return Median(us);
}

std::string Hex(const void* p, size_t n) {
  std::string out;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof(b), "%02x", static_cast<const unsigned char*>(p)[i]);
    out += b;
  }
  return out;
}

void FromHex(const char* hex, void* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    unsigned v = 0;
    std::sscanf(hex + 2 * i, "%2x", &v);
    static_cast<unsigned char*>(out)[i] = static_cast<unsigned char>(v);
  }
}

// child BYTES VMM_BYTES RANDOM_IPC_HEX CONST_IPC_HEX VMM_FD REPEATS ODD_IPC_HEX
int Child(char** argv) {
  const size_t bytes = std::strtoull(argv[2], nullptr, 10), vmm_bytes = std::strtoull(argv[3], nullptr, 10);
  const int fd = std::atoi(argv[6]), repeats = std::atoi(argv[7]);
  CUDA_OR_DIE(cudaSetDevice(0));
  const Driver d = LoadDriver();
  void *constant = nullptr, *random = nullptr, *dst = nullptr;
  CUDA_OR_DIE(cudaMalloc(&constant, bytes));
  CUDA_OR_DIE(cudaMalloc(&random, bytes));
  CUDA_OR_DIE(cudaMalloc(&dst, bytes));
  CUDA_OR_DIE(cudaMemset(constant, 0x5a, bytes));
  CUDA_OR_DIE(cudaMemset(dst, 0, bytes));
  cudaIpcMemHandle_t h_random, h_constant, h_odd;
  FromHex(argv[4], &h_random, sizeof(h_random));
  FromHex(argv[5], &h_constant, sizeof(h_constant));
  FromHex(argv[8], &h_odd, sizeof(h_odd));
  void *ipc_random = nullptr, *ipc_constant = nullptr, *ipc_odd = nullptr;
  CUDA_OR_DIE(cudaIpcOpenMemHandle(&ipc_random, h_random, cudaIpcMemLazyEnablePeerAccess));
  CUDA_OR_DIE(cudaIpcOpenMemHandle(&ipc_constant, h_constant, cudaIpcMemLazyEnablePeerAccess));
  CUDA_OR_DIE(cudaIpcOpenMemHandle(&ipc_odd, h_odd, cudaIpcMemLazyEnablePeerAccess));
  CUmemGenericAllocationHandle imported = 0;
  CU_OR_DIE(d.import_handle(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  void* vmm_random = MapVmm(d, imported, vmm_bytes, 0);
  // A local VMM buffer too (its mapping made like the import's).
  CUmemAllocationProp prop = VmmProp(0);
  CUmemGenericAllocationHandle local_handle = 0;
  CU_OR_DIE(d.create(&local_handle, vmm_bytes, &prop, 0));
  void* vmm_local = MapVmm(d, local_handle, vmm_bytes, 0);
  CUDA_OR_DIE(cudaMemcpy(random, ipc_random, bytes, cudaMemcpyDeviceToDevice));  // (the same random bytes, local)
  CUDA_OR_DIE(cudaMemcpy(vmm_local, ipc_random, bytes, cudaMemcpyDeviceToDevice));
  struct Row {
    const char* name;
    const char* what;
    const void* src;
  };
  const Row rows[] = {
      {"local_constant", "local cudaMalloc, constant 0x5a (the old reference)", constant},
      {"local_random", "local cudaMalloc, the random bytes", random},
      {"local_vmm_random", "local cuMemCreate, the random bytes", vmm_local},
      {"ipc_random", "IPC-mapped cudaMalloc of the parent, random", ipc_random},
      {"ipc_constant", "IPC-mapped cudaMalloc of the parent, constant 0x5a", ipc_constant},
      {"vmm_import_random", "VMM import (POSIX fd) of the parent's cuMemCreate, random", vmm_random},
      {"ipc_odd_size", "IPC-mapped cudaMalloc of BYTES + 8 (not a 2 MiB multiple), random", ipc_odd},
  };
  std::printf("| source | us | GB/s (read + write) | vs local_random |\n|---|---:|---:|---:|\n");
  std::vector<std::pair<std::string, double>> results;
  for (int pass = 0; pass < 2; ++pass) {  // (two passes: an order effect would show)
    for (const Row& r : rows) {
      const double us = TimedCopyMicros(dst, r.src, bytes, repeats);
      results.emplace_back(std::string(r.name) + (pass ? "_pass2" : ""), us);
    }
  }
  double base = 0;
  for (const auto& [name, us] : results)
    if (name == "local_random") base = us;
  for (size_t i = 0; i < results.size(); ++i) {
    const Row& r = rows[i % std::size(rows)];
    std::printf("| %s%s | %.0f | %.0f | %.3f |\n", r.what, i >= std::size(rows) ? " (pass 2)" : "", results[i].second,
                2.0 * bytes / (results[i].second * 1e3), base / results[i].second);
  }
  uint64_t* pinned = nullptr;
  CUDA_OR_DIE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 8, cudaHostAllocDefault));
  const double host_local = HostTimedInstallMicros(dst, random, bytes, repeats, pinned);
  const double host_ipc = HostTimedInstallMicros(dst, ipc_random, bytes, repeats, pinned);
  std::printf("\nhost-timed (copy + 8-byte read + stream sync): local %.0f us, IPC-mapped %.0f us\n\n", host_local,
              host_ipc);
  results.emplace_back("host_timed_local", host_local);
  results.emplace_back("host_timed_ipc", host_ipc);
  for (const auto& [name, us] : results) std::printf("%s_us=%.1f\n", name.c_str(), us);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 9 && std::string(argv[1]) == "child") return Child(argv);
  size_t mib = 1884;  // (Qwen2.5-0.5B's F32 image: 494M parameters)
  int repeats = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--mib=", 6) == 0) mib = std::strtoull(argv[i] + 6, nullptr, 10);
    if (std::strncmp(argv[i], "--repeats=", 10) == 0) repeats = std::atoi(argv[i] + 10);
  }
  if (mib < 2 || mib % 2 != 0 || repeats < 1) {
    std::fprintf(stderr, "ipc_copy_probe: --mib wants an even number >= 2 (whole 2 MiB pages), --repeats >= 1\n");
    return 2;
  }
  const size_t bytes = mib << 20;
  CUDA_OR_DIE(cudaSetDevice(0));
  cudaDeviceProp dev{};
  CUDA_OR_DIE(cudaGetDeviceProperties(&dev, 0));
  std::printf("# ipc_copy_probe: %zu MiB per copy, median of %d; GPU %s; CPU %s\n\n", mib, repeats, dev.name,
              rlfleet::bench::CpuModel().c_str());
  const Driver d = LoadDriver();
  const std::vector<float> weights = RandomWeights(bytes);
  void *random = nullptr, *constant = nullptr, *odd = nullptr;
  CUDA_OR_DIE(cudaMalloc(&random, bytes));
  CUDA_OR_DIE(cudaMalloc(&constant, bytes));
  CUDA_OR_DIE(cudaMalloc(&odd, bytes + 8));
  CUDA_OR_DIE(cudaMemcpy(random, weights.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_OR_DIE(cudaMemcpy(odd, weights.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_OR_DIE(cudaMemset(constant, 0x5a, bytes));
  cudaIpcMemHandle_t h_random, h_constant, h_odd;
  CUDA_OR_DIE(cudaIpcGetMemHandle(&h_random, random));
  CUDA_OR_DIE(cudaIpcGetMemHandle(&h_constant, constant));
  CUDA_OR_DIE(cudaIpcGetMemHandle(&h_odd, odd));
  CUmemAllocationProp prop = VmmProp(0);
  size_t granule = 0;
  CU_OR_DIE(d.granularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  const size_t vmm_bytes = RoundUp(bytes, granule);
  std::printf("VMM granularity (recommended): %zu bytes\n\n", granule);
  CUmemGenericAllocationHandle handle = 0;
  CU_OR_DIE(d.create(&handle, vmm_bytes, &prop, 0));
  void* vmm = MapVmm(d, handle, vmm_bytes, 0);
  CUDA_OR_DIE(cudaMemcpy(vmm, weights.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_OR_DIE(cudaDeviceSynchronize());
  int fd = -1;
  CU_OR_DIE(d.export_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  (void)fcntl(fd, F_SETFD, 0);  // (inherited by the child)
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string a = std::to_string(bytes), b = std::to_string(vmm_bytes), hr = Hex(&h_random, sizeof(h_random)),
                      hc = Hex(&h_constant, sizeof(h_constant)), f = std::to_string(fd), r = std::to_string(repeats),
                      ho = Hex(&h_odd, sizeof(h_odd));
    execl("/proc/self/exe", argv[0], "child", a.c_str(), b.c_str(), hr.c_str(), hc.c_str(), f.c_str(), r.c_str(),
          ho.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
