// NCCL's environment: the variables the installed NCCL reads (to catch names it does
// not, which some tuning guides recommend), and named tuning profiles by scale that a
// service applies to its own environment at start (--nccl_profile), each variable with
// what it does. Pure code: no NCCL, no CUDA.
#ifndef RLFLEET_LIBS_NCCL_TUNING_NCCL_ENV_H_
#define RLFLEET_LIBS_NCCL_TUNING_NCCL_ENV_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rlfleet::nccl {

// The variables NCCL 2.19 .. 2.28 reads (NVIDIA's environment-variable documentation).
const std::set<std::string>& KnownNcclVariables();
// Variables with NCCL_ in their name that another layer reads, and what to use instead.
const std::map<std::string, std::string>& ForeignNcclVariables();

struct NcclSetting {
  std::string name;  // NCCL_...
  std::string value;
  std::string what;  // what it does and why this value
};

struct NcclProfile {
  std::string name;   // "single-node", "multi-node", "large-ib"
  std::string scope;  // the deployments it is for
  std::vector<NcclSetting> settings;
};

// The profiles, smallest scale first: single-node (one host, up to 8 GPUs),
// multi-node (8-32 GPUs on 2-4 hosts, Ethernet or a small InfiniBand fabric) and
// large-ib (more than 32 GPUs over InfiniBand / RoCE). Every one keeps NVLink SHARP
// (multicast) off and NCCL_DEBUG at WARN.
const std::vector<NcclProfile>& NcclProfiles();
// NOT_FOUND naming the profiles for an unknown name.
absl::StatusOr<const NcclProfile*> FindNcclProfile(const std::string& name);

// Sets each of the profile's variables in the process environment unless it is already
// set (an operator's explicit setting wins). Returns one line per variable: "set X=V"
// or "kept X=V from the environment (profile: W)". Call before NCCL creates a
// communicator (NCCL reads most variables then).
std::vector<std::string> ApplyNcclProfile(const NcclProfile& profile);

// The --nccl_profile flag (defined with this library): empty = none; otherwise
// ApplyNcclProfile of that profile, with its lines printed to stderr prefixed by
// `name`. NOT_FOUND for an unknown profile.
absl::Status ApplyNcclProfileFromFlags(const std::string& name);

// The profiles as text (for `rlfleet nccl-profiles`): each with its scope and every
// variable with what it does, as `export` lines a shell can source.
std::string FormatNcclProfiles();

}  // namespace rlfleet::nccl

#endif  // RLFLEET_LIBS_NCCL_TUNING_NCCL_ENV_H_
