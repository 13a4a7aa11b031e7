// `rlfleet doctor`: the network-diagnosis checklist as checks with pass / warn / fail
// and a fix hint each. This first slice checks the local host: NCCL_* variables that
// the installed NCCL does not know (some operator guides recommend ones that do not
// exist, e.g. NCCL_MIN_NCHANNELS_BEFORE_FUSION, or PyTorch's NCCL_ASYNC_ERROR_HANDLING),
// debug logging left on, NIC errors / drops and MTU (sysfs), GPU <-> NUMA affinity
// (sysfs numa_node of each NVIDIA PCI device) with the numactl line that binds to it.
// Across replicas: NCCL_* settings that differ between registered replicas (each
// replica publishes its NCCL_* variables as registry labels; see registrar.h).
// Pure functions over their inputs, so tests feed them fake environments and sysfs trees.
#ifndef RLFLEET_SERVICES_CONTROLLER_DOCTOR_H_
#define RLFLEET_SERVICES_CONTROLLER_DOCTOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace rlfleet::controller {

enum class CheckStatus { kPass, kWarn, kFail };
const char* CheckStatusName(CheckStatus s);

struct CheckResult {
  std::string check;  // e.g. "nccl_env"
  CheckStatus status = CheckStatus::kPass;
  std::string detail;  // what was found
  std::string fix;     // what to do (empty when it passes)
};

// NCCL_* names in `env` that NCCL (2.19 .. 2.28) does not read: FAIL each; names that
// belong to PyTorch: WARN with the right name.
std::vector<CheckResult> CheckNcclVariables(const std::map<std::string, std::string>& env);
// NCCL_DEBUG=INFO/TRACE or NCCL_DEBUG_SUBSYS=ALL: WARN (slow and noisy outside a diagnosis).
CheckResult CheckNcclDebug(const std::map<std::string, std::string>& env);
// Per interface under `sysfs_net` (e.g. /sys/class/net), except lo: errors -> FAIL,
// drops -> WARN, MTU below 1500 -> WARN.
std::vector<CheckResult> CheckNics(const std::string& sysfs_net);
// Per NVIDIA PCI device under `sysfs_pci` (e.g. /sys/bus/pci/devices): its NUMA node and
// the numactl line for its process; unknown node -> WARN.
std::vector<CheckResult> CheckGpuNuma(const std::string& sysfs_pci);

// One GPU's memory as NVML reports it (libs/gpu/nvml.h).
struct GpuMemory {
  int index = 0;
  std::string name;
  uint64_t used = 0, total = 0;  // bytes
};
// Per GPU: free memory under 10% of the total -> WARN, under 2% -> FAIL (the next
// process, or a KV cache or batch sized for an empty GPU, runs out).
std::vector<CheckResult> CheckGpuMemory(const std::vector<GpuMemory>& gpus);

// Replicas as the registry lists them: id and labels ("env.NCCL_X" -> value).
struct ReplicaLabels {
  std::string id;
  std::map<std::string, std::string> labels;
};
// One result per NCCL_* variable set on any replica: PASS when every replica has the
// same value, FAIL naming who has which value (a replica without it counts as
// "(unset)"). A single PASS "nccl_consistency" when no replica sets any.
std::vector<CheckResult> CheckNcclConsistency(const std::vector<ReplicaLabels>& replicas);

// Per replica that registered NUMA labels (rollout and trainer: numa.node, its
// binding; numa.gpu_node, its GPU's node; numa.mode, --numa): PASS bound to its GPU's
// node, or no GPU / no node reported; WARN not bound although its GPU has a node
// (--numa=off); FAIL bound to another node than its GPU's (host copies cross the
// socket link). Nothing when no replica has the labels.
std::vector<CheckResult> CheckNumaBinding(const std::vector<ReplicaLabels>& replicas);

// One replica's clock as `rlfleet doctor --fleet` read it (its /metrics'
// rlfleet_time_seconds), with when the request left and the answer came back here.
struct ClockSample {
  std::string id;
  absl::Time sent, received;
  std::optional<double> unix_seconds;  // empty: could not be read (see error)
  std::string error;
};
// Per replica: its clock minus this host's at the request's midpoint, less half the
// round trip (the uncertainty): over 1 s FAIL, over 100 ms WARN (time-based leases,
// staleness and logs go wrong across skewed clocks); unreadable: WARN.
std::vector<CheckResult> CheckClockSkew(const std::vector<ClockSample>& samples);

// Everything on this host (the process environment, /sys).
std::vector<CheckResult> RunLocalChecks();
// A table (or JSON with `json`) for people or machines.
std::string FormatResults(const std::vector<CheckResult>& results, bool json);

}  // namespace rlfleet::controller

#endif  // RLFLEET_SERVICES_CONTROLLER_DOCTOR_H_
