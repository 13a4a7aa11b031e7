#include "libs/service/numa_flag.h"

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, numa, "auto",
          "NUMA binding: auto (threads and memory on the GPU's NUMA node, when it reports one), off, or a node "
          "number. Said at start; `rlfleet doctor --fleet` checks it.");

namespace rlfleet::service {

absl::StatusOr<common::NumaBinding> BindNumaFromFlags(const std::string& binary,
                                                      const absl::StatusOr<std::string>& gpu_bus_id) {
  if (!gpu_bus_id.ok()) return gpu_bus_id.status();
  absl::StatusOr<common::NumaRequest> request = common::ParseNumaFlag(absl::GetFlag(FLAGS_numa));
  if (!request.ok()) return request.status();
  absl::StatusOr<common::NumaBinding> binding = common::ApplyNuma(*request, *gpu_bus_id);
  if (!binding.ok()) return binding.status();
  std::cerr << binary << ": NUMA: " << binding->why << std::endl;
  return binding;
}

std::map<std::string, std::string> NumaLabels(const common::NumaBinding& binding) {
  const std::string flag = absl::GetFlag(FLAGS_numa);
  return {{"numa.node", absl::StrCat(binding.node)},
          {"numa.gpu_node", absl::StrCat(binding.gpu_node)},
          {"numa.mode", flag == "auto" || flag == "off" ? flag : "node"}};
}

}  // namespace rlfleet::service
