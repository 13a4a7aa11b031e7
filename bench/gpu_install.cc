// gpu_install: a weight version installed GPU to GPU between two processes on one host
// (policy.h's DeviceImage: CUDA IPC), against cudaMemcpy device-to-device of the same
// bytes in the installing process, measured in the same run.
//
// This process (the trainer's side) makes a Qwen2.5-0.5B-shaped policy in fp32 on
// --device (24 layers, d 896, 14 / 2 heads, vocabulary 151936, tied: 494M parameters,
// 1.98 GB) and exports it; then runs itself (`install ...`) once per destination dtype
// (fp32, bf16): that child installs it --repeats times with and without the digest
// check (the first install maps the image, the rest reuse the mapping, as a replica
// does), each timed whole, and times cudaMemcpy of as many bytes between two buffers
// of its own (CUDA events, median), the source holding random weight-like floats as
// the image does (a constant pattern, the reference before 2026-12-04, is timed too:
// it may copy faster than weights do). Medians of each go to the table (--out); last lines, the ratios (reference time
// over install time):
//   gpu_install_ratio_vs_d2d=<fp32, an install as the replica does it by default: the
//                             mapping kept from the first, version stamps checked>
//   gpu_install_verified_ratio_vs_d2d=<the same with the digest checked too>
//   gpu_install_copy_ratio_vs_d2d=<fp32, the copy alone>
//   bazel build //bench:gpu_install; on the GPU host (CUDA backend on LD_LIBRARY_PATH):
//   gpu_install --out=bench/results/gpu_install.md
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/cpu_model.h"
#include "bench/cuda_check.h"
#include "bench/cuda_copy.h"
#include "libs/model/policy.h"
#include "tests/util/subprocess.h"

ABSL_FLAG(std::string, out, "gpu_install.md", "Where the results table is written.");
ABSL_FLAG(std::string, device, "cuda:0", "The GPU both processes use.");
ABSL_FLAG(int, repeats, 20, "Installs (and reference copies) per destination dtype; medians are kept.");
ABSL_FLAG(int, layers, 24, "Layers of the model (24: Qwen2.5-0.5B's shape).");

namespace {

using rlfleet::bench::Median;
using rlfleet::bench::RandomWeights;
using rlfleet::bench::TimedCopyMicros;

using rlfleet::model::DeviceImage;
using rlfleet::model::Policy;
using rlfleet::model::PolicyConfig;

PolicyConfig Qwen05B(const std::string& dtype) {
  PolicyConfig c;
  c.arch = "qwen2";
  c.vocab_size = 151936;
  c.d_model = 896;
  c.n_layers = absl::GetFlag(FLAGS_layers);
  c.n_heads = 14;
  c.n_kv_heads = 2;
  c.ffn_dim = 4864;
  c.tie_embeddings = true;
  c.qkv_bias = true;
  c.max_seq_len = 64;
  c.rope_theta = 1e6;
  c.dtype = dtype;
  return c;
}

// cudaMemcpy device-to-device of `bytes` between two buffers of this process, the
// source holding random weight-like bytes (`constant`: a 0x5a pattern instead):
// microseconds, median.
double ReferenceCopyMicros(uint64_t bytes, int device, int repeats, bool constant) {
  CUDA_OR_DIE(cudaSetDevice(device));
  void *a = nullptr, *b = nullptr;
  CUDA_OR_DIE(cudaMalloc(&a, bytes));
  CUDA_OR_DIE(cudaMalloc(&b, bytes));
  if (constant) {
    CUDA_OR_DIE(cudaMemset(a, 0x5a, bytes));
  } else {
    const std::vector<float> weights = RandomWeights(bytes);
    CUDA_OR_DIE(cudaMemcpy(a, weights.data(), weights.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  CUDA_OR_DIE(cudaMemset(b, 0, bytes));
  const double us = TimedCopyMicros(b, a, bytes, repeats);
  CUDA_OR_DIE(cudaFree(a));
  CUDA_OR_DIE(cudaFree(b));
  return us;
}

// cudaMemcpy device-to-device of `bytes` from the exporter's image itself (its IPC
// handle opened again: the driver counts the opens and returns the same mapping) into a
// buffer of this process: microseconds, median. Tells a slow source from a slow
// destination when an install's copy runs slower than the reference.
double MappedCopyMicros(const std::string& handle_bytes, uint64_t bytes, int device, int repeats) {
  CUDA_OR_DIE(cudaSetDevice(device));
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, handle_bytes.data(), sizeof(handle));
  void *src = nullptr, *dst = nullptr;
  CUDA_OR_DIE(cudaIpcOpenMemHandle(&src, handle, cudaIpcMemLazyEnablePeerAccess));
  CUDA_OR_DIE(cudaMalloc(&dst, bytes));
  const double us = TimedCopyMicros(dst, src, bytes, repeats);
  CUDA_OR_DIE(cudaFree(dst));
  CUDA_OR_DIE(cudaIpcCloseMemHandle(src));
  return us;
}

// The child: `install DTYPE HANDLE_HEX PCI LENGTH DIGEST LAYOUT` (and the flags). Prints
// one "result ..." line of medians.
int InstallChild(const std::vector<char*>& argv) {
  DeviceImage::Ref ref;
  const std::string dtype = argv[2];
  ref.ipc_handle = absl::HexStringToBytes(argv[3]);
  ref.pci_bus_id = argv[4];
  if (!absl::SimpleAtoi(argv[5], &ref.length_bytes) || !absl::SimpleAtoi(argv[6], &ref.digest) ||
      !absl::SimpleAtoi(argv[7], &ref.layout)) {
    return 2;
  }
  ref.version = 1;  // (what the parent exported)
  const std::string device = absl::GetFlag(FLAGS_device);
  auto policy = Policy::Create(Qwen05B(dtype), device, 1);
  if (!policy.ok()) {
    std::printf("error %s\n", policy.status().ToString().c_str());
    return 3;
  }
  const int repeats = absl::GetFlag(FLAGS_repeats);
  // Each install timed whole on this host's clock (map when not mapped yet, stamp
  // checks, the copy, the digest when asked); the first one maps the image.
  std::vector<double> copy, copy_gpu, verify, whole, unverified;
  double first_map = 0;
  bool one_copy = true;
  for (int i = 0; i < repeats + 1; ++i) {
    for (bool check : {false, true}) {
      rlfleet::model::DeviceInstallReport report;
      const auto start = std::chrono::steady_clock::now();
      if (absl::Status s = (*policy)->InstallDeviceImage(ref, check, &report); !s.ok()) {
        std::printf("error %s\n", s.ToString().c_str());
        return 3;
      }
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
      if (report.mapped) first_map = static_cast<double>(report.open_us);
      if (i == 0) continue;  // (a warm-up of each)
      if (check) {
        verify.push_back(report.verify_us);
        whole.push_back(us);
      } else {
        copy.push_back(report.copy_us);
        copy_gpu.push_back(report.copy_gpu_us);
        one_copy = one_copy && report.one_copy;
        unverified.push_back(us);
      }
    }
  }
  const int index = device.find(':') == std::string::npos ? 0 : std::stoi(device.substr(device.find(':') + 1));
  cudaDeviceProp prop{};
  CUDA_OR_DIE(cudaGetDeviceProperties(&prop, index));
  const double reference = ReferenceCopyMicros(ref.length_bytes, index, repeats, /*constant=*/false);
  const double constant = ReferenceCopyMicros(ref.length_bytes, index, repeats, /*constant=*/true);
  std::printf("diagnostic %s: the image -> a cudaMalloc buffer %.1f us (events)\n", dtype.c_str(),
              MappedCopyMicros(ref.ipc_handle, ref.length_bytes, index, repeats));
  std::printf("result %s %.1f %.1f %.1f %.1f %.1f %.1f %.1f %.1f %d gpu=%s\n", dtype.c_str(), first_map, Median(copy),
              Median(verify), Median(whole), Median(unverified), reference, constant, Median(copy_gpu),
              one_copy ? 1 : 0, prop.name);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() == 8 && std::string(args[1]) == "install") return InstallChild(args);
  const std::string device = absl::GetFlag(FLAGS_device);
  std::cout << "model backend: " << rlfleet::model::ModelBackend() << std::endl;
  auto policy = Policy::Create(Qwen05B("fp32"), device, 7);
  if (!policy.ok()) {
    std::cerr << policy.status() << std::endl;
    return 1;
  }
  auto image = (*policy)->ExportDeviceImage(1);
  if (!image.ok()) {
    std::cerr << image.status() << std::endl;
    return 1;
  }
  const DeviceImage::Ref& ref = image->ref();
  std::cout << "exported " << (*policy)->num_parameters() << " parameters, " << ref.length_bytes << " bytes on "
            << ref.pci_bus_id << std::endl;
  std::string table = absl::StrCat(
      "# gpu_install: a version installed GPU to GPU between two processes (CUDA IPC) vs cudaMemcpy D2D\n\n",
      "CPU: ", rlfleet::bench::CpuModel(), "\n", "model: qwen2, ", absl::GetFlag(FLAGS_layers),
      " layers, d 896, vocabulary 151936: ", (*policy)->num_parameters(), " parameters, ", ref.length_bytes,
      " bytes (F32 image); medians of ", absl::GetFlag(FLAGS_repeats), " installs\n\n",
      "| destination | first map us | copy us | copy us on the GPU's clock | digest us | install us (digest checked) | "
      "install us (stamps "
      "only: the default) | cudaMemcpy D2D us (weight-like bytes: the reference) | cudaMemcpy D2D us (a constant "
      "pattern) | ratio with digest | ratio (default) | ratio copy alone |\n",
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::string gpu, ratio_lines, diagnostics;
  for (const char* dtype : {"fp32", "bf16"}) {
    const rlfleet::testing::Exited child = rlfleet::testing::RunToExit(
        {"/proc/self/exe", "install", dtype, absl::BytesToHexString(ref.ipc_handle), ref.pci_bus_id,
         absl::StrCat(ref.length_bytes), absl::StrCat(ref.digest), absl::StrCat(ref.layout),
         absl::StrCat("--device=", device), absl::StrCat("--repeats=", absl::GetFlag(FLAGS_repeats)),
         absl::StrCat("--layers=", absl::GetFlag(FLAGS_layers))},
        absl::Minutes(5));
    const size_t at = child.output.find("result ");
    if (child.code != 0 || at == std::string::npos) {
      std::cerr << "the installing process failed (" << child.code << "):\n" << child.output << std::endl;
      return 1;
    }
    std::vector<std::string> f = absl::StrSplit(child.output.substr(at, child.output.find('\n', at) - at), ' ');
    double open = 0, copy = 0, verify = 0, whole = 0, unverified = 0, reference = 0, constant = 0, copy_gpu = 0;
    int one_copy = 0;
    if (f.size() < 12 || !absl::SimpleAtod(f[8], &constant) || !absl::SimpleAtod(f[9], &copy_gpu) ||
        !absl::SimpleAtoi(f[10], &one_copy) || !absl::SimpleAtod(f[2], &open) || !absl::SimpleAtod(f[3], &copy) ||
        !absl::SimpleAtod(f[4], &verify) || !absl::SimpleAtod(f[5], &whole) || !absl::SimpleAtod(f[6], &unverified) ||
        !absl::SimpleAtod(f[7], &reference)) {
      std::cerr << "cannot read: " << child.output << std::endl;
      return 1;
    }
    if (size_t d = child.output.find("diagnostic "); d != std::string::npos) {
      absl::StrAppend(&diagnostics, child.output.substr(d, child.output.find('\n', d) - d), "\n");
    }
    gpu = child.output.substr(child.output.find("gpu=", at) + 4);
    gpu = gpu.substr(0, gpu.find('\n'));
    absl::StrAppendFormat(&table,
                          "| %s | %.0f | %.0f | %.0f (%s) | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f |\n",
                          dtype, open, copy, copy_gpu, one_copy ? "one copy" : "per parameter", verify, whole,
                          unverified, reference, constant, reference / whole, reference / unverified, reference / copy);
    if (std::string(dtype) == "fp32") {
      ratio_lines = absl::StrFormat(
          "gpu_install_ratio_vs_d2d=%.3f\ngpu_install_verified_ratio_vs_d2d=%.3f\ngpu_install_copy_ratio_vs_d2d=%.3f\n",
          reference / unverified, reference / whole, reference / copy);
    } else {
      absl::StrAppendFormat(&ratio_lines, "gpu_install_bf16_ratio_vs_d2d=%.3f\n", reference / unverified);
    }
  }
  absl::StrAppend(&table, "\nGPU: ", gpu, "\n\n", diagnostics, "\n", ratio_lines);
  std::ofstream(absl::GetFlag(FLAGS_out)) << table;
  std::cout << table;
  return 0;
}
