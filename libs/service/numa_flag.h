// --numa for the services that run on a GPU (rollout, trainer): binds the process's
// threads and memory to the GPU's NUMA node (libs/common/numa.h), says so on stderr,
// and gives the labels it registers with, which `rlfleet doctor --fleet` checks.
#ifndef RLFLEET_LIBS_SERVICE_NUMA_FLAG_H_
#define RLFLEET_LIBS_SERVICE_NUMA_FLAG_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "libs/common/numa.h"

namespace rlfleet::service {

// Applies --numa for a process whose GPU is `gpu_bus_id` ("" for none; as the model
// backend gave it, model::DevicePciBusId, whose error is returned) and prints
// "<binary>: NUMA: <what was done>". Call before the server and the model start their
// threads. INVALID_ARGUMENT for a bad --numa value or a node not on this host.
absl::StatusOr<common::NumaBinding> BindNumaFromFlags(const std::string& binary,
                                                      const absl::StatusOr<std::string>& gpu_bus_id);

// numa.node, numa.gpu_node and numa.mode ("auto", "off" or "node") for the registry.
std::map<std::string, std::string> NumaLabels(const common::NumaBinding& binding);

}  // namespace rlfleet::service

#endif  // RLFLEET_LIBS_SERVICE_NUMA_FLAG_H_
