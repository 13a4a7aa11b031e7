// gpu_probe: prints what GPU stack this machine has; with --check, runs a kernel and a
// 1-rank NCCL all-reduce. Exit 0 when the probe (and checks) succeed.
#include <cstring>
#include <iostream>

#include "libs/gpu/gpu_probe.h"

int main(int argc, char** argv) {
  const bool check = argc > 1 && std::strcmp(argv[1], "--check") == 0;
  auto info = rlfleet::gpu::ProbeGpu(check);
  if (!info.ok()) {
    std::cerr << "gpu_probe: " << info.status() << "\n";
    return 1;
  }
  std::cout << info->ToString() << "\n";
  if (check && (info->device_count == 0 || !info->kernel_checked || !info->nccl_checked)) {
    return 1;
  }
  return 0;
}
