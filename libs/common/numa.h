// NUMA binding for a GPU service: the node its GPU hangs off (sysfs), and binding the
// process's threads and its future memory there, so that the pinned host buffers a GPU
// copies from sit next to it and the threads that fill them run there too.
#ifndef RLFLEET_LIBS_COMMON_NUMA_H_
#define RLFLEET_LIBS_COMMON_NUMA_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rlfleet::common {

// "0-3,8,10-11" (a sysfs cpulist) -> {0, 1, 2, 3, 8, 10, 11}. INVALID_ARGUMENT naming
// the text for anything else (an empty list included).
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text);

// The NUMA node of the PCI device `bus_id` ("0000:3B:00.0", or CUDA's
// "00000000:3B:00.0": case and the domain's width do not matter) from
// `sysfs_pci`/<bus>/numa_node (e.g. /sys/bus/pci/devices): -1 when it reports none
// (a single-node host, NUMA off in firmware). NOT_FOUND for a device not there.
absl::StatusOr<int> PciNumaNode(const std::string& sysfs_pci, const std::string& bus_id);

// The CPUs of node `node` (`sysfs_node`/node<N>/cpulist, e.g. /sys/devices/system/node).
absl::StatusOr<std::vector<int>> NodeCpus(const std::string& sysfs_node, int node);

// --numa: "auto" (the GPU's node, when it reports one), "off", or a node number.
struct NumaRequest {
  enum class Mode { kAuto, kOff, kNode } mode = Mode::kAuto;
  int node = -1;  // with kNode
};
absl::StatusOr<NumaRequest> ParseNumaFlag(const std::string& value);

// What a service did, for its start line and its registry labels.
struct NumaBinding {
  int node = -1;          // bound to; -1: not bound
  int gpu_node = -1;      // its GPU's node; -1: unknown or no GPU
  std::vector<int> cpus;  // the node's CPUs the threads may run on
  std::string why;        // one line: what was done and why
};

// Binds every thread of this process (and, by inheritance, those it starts later) to
// `node`'s CPUs, and makes `node` the preferred node for memory the calling thread and
// the threads it starts later allocate (set_mempolicy MPOL_PREFERRED: allocations fall
// back to other nodes rather than fail). Call early in main, before the servers' and
// libtorch's threads start. INVALID_ARGUMENT for a node with no CPUs online here;
// INTERNAL with errno's text when the kernel refuses.
absl::Status BindToNode(int node, const std::string& sysfs_node, std::vector<int>* cpus);

// --numa for a service whose GPU is `gpu_bus_id` (empty: no GPU, e.g. --device=cpu):
// auto binds to the GPU's node when it reports one; off does nothing; N binds to N
// (and says when that is not the GPU's node). The sysfs roots are parameters for tests.
absl::StatusOr<NumaBinding> ApplyNuma(const NumaRequest& request, const std::string& gpu_bus_id,
                                      const std::string& sysfs_pci = "/sys/bus/pci/devices",
                                      const std::string& sysfs_node = "/sys/devices/system/node");

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_NUMA_H_
