// numa_copy_bw: host <-> device copy bandwidth from pinned host memory, with the
// process unbound (the reference, same run) and bound (threads and memory) to each
// NUMA node of the host in turn (libs/common/numa.h, what --numa does), naming the
// GPU's node. Best of --repeats copies of --mib MiB each way. Writes a table to --out;
// the last line: numa_h2d_ratio_gpu_node_vs_unbound=<bound to the GPU's node / unbound>
// (or "not measured" when the GPU reports no node).
//   on the GPU machine: .carry/bin/bench/numa_copy_bw --out=$OUT/numa_copy_bw.md
#include <cuda_runtime_api.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/cpu_model.h"
#include "bench/cuda_check.h"
#include "libs/common/numa.h"

ABSL_FLAG(std::string, out, "numa_copy_bw.md", "Where the results table is written.");
ABSL_FLAG(int, device, 0, "CUDA device.");
ABSL_FLAG(int, mib, 256, "MiB per copy.");
ABSL_FLAG(int, repeats, 10, "Copies each way per measurement; the best is kept.");

namespace {

struct Bandwidth {
  double h2d = 0, d2h = 0;  // GB/s
};

// A fresh pinned buffer (its pages placed by the current memory policy), copied both ways.
Bandwidth Measure(void* device_buffer, size_t bytes) {
  void* host = nullptr;
  CUDA_OR_DIE(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
  std::fill_n(static_cast<char*>(host), bytes, 1);
  Bandwidth best;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    absl::Time t = absl::Now();
    CUDA_OR_DIE(cudaMemcpy(device_buffer, host, bytes, cudaMemcpyHostToDevice));
    best.h2d = std::max(best.h2d, bytes / absl::ToDoubleSeconds(absl::Now() - t) / 1e9);
    t = absl::Now();
    CUDA_OR_DIE(cudaMemcpy(host, device_buffer, bytes, cudaMemcpyDeviceToHost));
    best.d2h = std::max(best.d2h, bytes / absl::ToDoubleSeconds(absl::Now() - t) / 1e9);
  }
  CUDA_OR_DIE(cudaFreeHost(host));
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_mib)) << 20;
  CUDA_OR_DIE(cudaSetDevice(absl::GetFlag(FLAGS_device)));
  char bus[32] = {};
  CUDA_OR_DIE(cudaDeviceGetPCIBusId(bus, sizeof(bus), absl::GetFlag(FLAGS_device)));
  absl::StatusOr<int> gpu_node = rlfleet::common::PciNumaNode("/sys/bus/pci/devices", bus);
  std::vector<int> nodes;
  for (const auto& e : std::filesystem::directory_iterator("/sys/devices/system/node")) {
    const std::string name = e.path().filename();
    int n = 0;
    if (name.rfind("node", 0) == 0 && absl::SimpleAtoi(name.substr(4), &n)) nodes.push_back(n);
  }
  std::sort(nodes.begin(), nodes.end());
  void* device_buffer = nullptr;
  CUDA_OR_DIE(cudaMalloc(&device_buffer, bytes));
  std::ofstream out(absl::GetFlag(FLAGS_out));
  out << "# numa_copy_bw: pinned host <-> GPU copies, unbound vs bound to each NUMA node\n\n"
      << "GPU " << bus << " (NUMA node "
      << (gpu_node.ok() ? absl::StrFormat("%d", *gpu_node) : std::string(gpu_node.status().message())) << "), CPU "
      << rlfleet::bench::CpuModel() << ", " << nodes.size() << " NUMA node(s), " << absl::GetFlag(FLAGS_mib)
      << " MiB per copy, best of " << absl::GetFlag(FLAGS_repeats) << "\n\n"
      << "| binding | host->device GB/s | device->host GB/s |\n|---|---:|---:|\n";
  const Bandwidth unbound = Measure(device_buffer, bytes);
  out << absl::StrFormat("| unbound (reference) | %.1f | %.1f |\n", unbound.h2d, unbound.d2h);
  std::cerr << absl::StrFormat("unbound: h2d %.1f GB/s, d2h %.1f GB/s\n", unbound.h2d, unbound.d2h);
  double ratio = -1;
  for (int node : nodes) {  // (each binding replaces the one before)
    std::vector<int> cpus;
    if (absl::Status s = rlfleet::common::BindToNode(node, "/sys/devices/system/node", &cpus); !s.ok()) {
      out << "| node " << node << " | not bound: " << s.message() << " | |\n";
      continue;
    }
    const Bandwidth b = Measure(device_buffer, bytes);
    const bool gpus = gpu_node.ok() && *gpu_node == node;
    out << absl::StrFormat("| node %d%s (%d CPUs) | %.1f | %.1f |\n", node, gpus ? ", the GPU's" : "", cpus.size(),
                           b.h2d, b.d2h);
    std::cerr << absl::StrFormat("node %d%s: h2d %.1f GB/s, d2h %.1f GB/s\n", node, gpus ? " (GPU's)" : "", b.h2d,
                                 b.d2h);
    if (gpus) ratio = b.h2d / unbound.h2d;
  }
  const std::string line = ratio > 0
                               ? absl::StrFormat("numa_h2d_ratio_gpu_node_vs_unbound=%.3f", ratio)
                               : "numa_h2d_ratio_gpu_node_vs_unbound: not measured (the GPU reports no NUMA node)";
  out << "\n" << line << "\n";
  std::cout << line << std::endl;
  CUDA_OR_DIE(cudaFree(device_buffer));
  return 0;
}
