#include "services/controller/doctor.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "libs/gpu/nvml.h"
#include "libs/nccl_tuning/nccl_env.h"

extern char** environ;

namespace rlfleet::controller {
namespace {

namespace fs = std::filesystem;

using nccl::ForeignNcclVariables;
using nccl::KnownNcclVariables;

std::string ReadTrimmed(const fs::path& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return std::string(absl::StripAsciiWhitespace(s));
}

int64_t ReadNumber(const fs::path& path, int64_t fallback) {
  int64_t v = fallback;
  if (!absl::SimpleAtoi(ReadTrimmed(path), &v)) return fallback;
  return v;
}

}  // namespace

const char* CheckStatusName(CheckStatus s) {
  switch (s) {
    case CheckStatus::kPass:
      return "pass";
    case CheckStatus::kWarn:
      return "warn";
    case CheckStatus::kFail:
      return "fail";
  }
  return "?";
}

std::vector<CheckResult> CheckNcclVariables(const std::map<std::string, std::string>& env) {
  std::vector<CheckResult> out;
  std::vector<std::string> known_set;
  for (const auto& [name, value] : env) {
    if (!absl::StartsWith(name, "NCCL_")) continue;
    if (auto f = ForeignNcclVariables().find(name); f != ForeignNcclVariables().end()) {
      out.push_back({"nccl_env", CheckStatus::kWarn, absl::StrCat(name, "=", value, ": ", f->second),
                     absl::StrCat("set the TORCH_ name if PyTorch is meant; unset ", name)});
    } else if (!KnownNcclVariables().count(name)) {
      out.push_back({"nccl_env", CheckStatus::kFail,
                     absl::StrCat(name, "=", value, " is not an NCCL variable (NCCL 2.19-2.28): it does nothing"),
                     absl::StrCat("unset ", name, "; see NVIDIA's NCCL environment-variable list")});
    } else {
      known_set.push_back(absl::StrCat(name, "=", value));
    }
  }
  if (out.empty()) {
    out.push_back({"nccl_env", CheckStatus::kPass,
                   known_set.empty() ? "no NCCL_* variables set" : absl::StrJoin(known_set, " "), ""});
  }
  return out;
}

CheckResult CheckNcclDebug(const std::map<std::string, std::string>& env) {
  auto get = [&](const char* k) {
    auto it = env.find(k);
    return it == env.end() ? std::string() : absl::AsciiStrToUpper(it->second);
  };
  const std::string debug = get("NCCL_DEBUG"), subsys = get("NCCL_DEBUG_SUBSYS");
  if (debug == "INFO" || debug == "TRACE" || absl::StrContains(subsys, "ALL")) {
    return {"nccl_debug", CheckStatus::kWarn,
            absl::StrCat("NCCL_DEBUG=", debug, subsys.empty() ? "" : " NCCL_DEBUG_SUBSYS=" + subsys,
                         ": verbose NCCL logging slows start-up and floods logs"),
            "use NCCL_DEBUG=WARN outside a diagnosis (INFO with NCCL_DEBUG_SUBSYS=INIT,NET to diagnose)"};
  }
  return {"nccl_debug", CheckStatus::kPass, debug.empty() ? "NCCL_DEBUG unset" : "NCCL_DEBUG=" + debug, ""};
}

std::vector<CheckResult> CheckNics(const std::string& sysfs_net) {
  std::vector<CheckResult> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(sysfs_net, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "lo") continue;
    const fs::path stats = entry.path() / "statistics";
    const int64_t errors = ReadNumber(stats / "rx_errors", 0) + ReadNumber(stats / "tx_errors", 0);
    const int64_t drops = ReadNumber(stats / "rx_dropped", 0) + ReadNumber(stats / "tx_dropped", 0);
    const int64_t mtu = ReadNumber(entry.path() / "mtu", -1);
    const std::string counts = absl::StrCat(name, ": mtu ", mtu, ", errors ", errors, ", drops ", drops);
    if (errors > 0) {
      out.push_back({"nic", CheckStatus::kFail, counts,
                     absl::StrCat("ethtool -S ", name, " (CRC / link errors: cable, optics, or the switch port)")});
    } else if (drops > 0) {
      out.push_back({"nic", CheckStatus::kWarn, counts,
                     absl::StrCat("ethtool -S ", name, "; raise ring buffers (ethtool -G) or check congestion")});
    } else if (mtu >= 0 && mtu < 1500) {
      out.push_back({"nic", CheckStatus::kWarn, counts,
                     absl::StrCat("ip link set ", name, " mtu 1500 (or 9000 for jumbo frames)")});
    } else {
      out.push_back({"nic", CheckStatus::kPass, counts, ""});
    }
  }
  if (out.empty()) out.push_back({"nic", CheckStatus::kPass, "no network interfaces besides lo", ""});
  return out;
}

std::vector<CheckResult> CheckGpuNuma(const std::string& sysfs_pci) {
  std::vector<CheckResult> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(sysfs_pci, ec)) {
    if (ReadTrimmed(entry.path() / "vendor") != "0x10de") continue;  // NVIDIA
    const std::string cls = ReadTrimmed(entry.path() / "class");
    if (!absl::StartsWith(cls, "0x0300") && !absl::StartsWith(cls, "0x0302")) continue;  // VGA / 3D
    const std::string bus = entry.path().filename().string();
    const int64_t node = ReadNumber(entry.path() / "numa_node", -1);
    if (node < 0) {
      out.push_back({"gpu_numa", CheckStatus::kWarn, absl::StrCat("GPU ", bus, ": no NUMA node reported"),
                     "single-socket host or NUMA off in firmware; nothing to bind"});
    } else {
      out.push_back({"gpu_numa", CheckStatus::kPass, absl::StrCat("GPU ", bus, ": NUMA node ", node),
                     absl::StrCat("run its process under numactl --cpunodebind=", node, " --membind=", node)});
    }
  }
  if (out.empty()) out.push_back({"gpu_numa", CheckStatus::kPass, "no NVIDIA GPU on this host", ""});
  return out;
}

std::vector<CheckResult> CheckNumaBinding(const std::vector<ReplicaLabels>& replicas) {
  std::vector<CheckResult> out;
  for (const ReplicaLabels& r : replicas) {
    auto label = [&](const std::string& key) -> std::optional<int> {
      auto it = r.labels.find(key);
      int v = 0;
      if (it == r.labels.end() || !absl::SimpleAtoi(it->second, &v)) return std::nullopt;
      return v;
    };
    const std::optional<int> node = label("numa.node"), gpu = label("numa.gpu_node");
    if (!node || !gpu) continue;
    CheckResult c;
    c.check = absl::StrCat("numa ", r.id);
    if (*gpu < 0) {
      c.detail = *node >= 0 ? absl::StrCat("bound to node ", *node, "; its GPU reports no node (or it has none)")
                            : "no GPU NUMA node reported: nothing to bind";
    } else if (*node == *gpu) {
      c.detail = absl::StrCat("bound to node ", *node, ", its GPU's");
    } else if (*node < 0) {
      c.status = CheckStatus::kWarn;
      c.detail = absl::StrCat("not bound; its GPU is on node ", *gpu);
      c.fix = "start it with --numa=auto (the default)";
    } else {
      c.status = CheckStatus::kFail;
      c.detail = absl::StrCat("bound to node ", *node, " but its GPU is on node ", *gpu,
                              ": its host copies cross the socket link");
      c.fix = absl::StrCat("start it with --numa=auto or --numa=", *gpu);
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<CheckResult> CheckNcclConsistency(const std::vector<ReplicaLabels>& replicas) {
  std::set<std::string> names;
  for (const ReplicaLabels& r : replicas) {
    for (const auto& [key, value] : r.labels) {
      if (key.rfind("env.NCCL_", 0) == 0) names.insert(key.substr(4));
    }
  }
  std::vector<CheckResult> results;
  if (names.empty()) {
    results.push_back({"nccl_consistency", CheckStatus::kPass,
                       absl::StrCat("no NCCL_* variable set on any of ", replicas.size(), " registered replicas"), ""});
    return results;
  }
  for (const std::string& name : names) {
    std::map<std::string, std::vector<std::string>> by_value;  // value -> replica ids
    for (const ReplicaLabels& r : replicas) {
      auto it = r.labels.find("env." + name);
      by_value[it == r.labels.end() ? "(unset)" : it->second].push_back(r.id);
    }
    CheckResult c;
    c.check = absl::StrCat("nccl_consistency ", name);
    if (by_value.size() == 1) {
      c.detail = absl::StrCat(name, "=", by_value.begin()->first, " on all ", replicas.size(), " replicas");
    } else {
      c.status = CheckStatus::kFail;
      std::vector<std::string> parts;
      for (const auto& [value, ids] : by_value) {
        parts.push_back(absl::StrCat(value, " on ", absl::StrJoin(ids, ", ")));
      }
      c.detail = absl::StrCat(name, " differs: ", absl::StrJoin(parts, "; "));
      c.fix = absl::StrCat("set the same ", name,
                           " on every replica (ranks of one NCCL communicator must agree on transports, "
                           "algorithms and interfaces, or they hang or fall back to slow paths)");
    }
    results.push_back(std::move(c));
  }
  return results;
}

std::vector<CheckResult> CheckClockSkew(const std::vector<ClockSample>& samples) {
  std::vector<CheckResult> results;
  for (const ClockSample& s : samples) {
    CheckResult c;
    c.check = absl::StrCat("clock_skew ", s.id);
    if (!s.unix_seconds) {
      c.status = CheckStatus::kWarn;
      c.detail = absl::StrCat("could not read its clock: ", s.error);
      c.fix = "serve /metrics on the replica (--metrics_port) and let this host reach it";
      results.push_back(std::move(c));
      continue;
    }
    const double mid = absl::ToDoubleSeconds((s.sent + (s.received - s.sent) / 2) - absl::UnixEpoch());
    const double skew = *s.unix_seconds - mid;
    const double uncertainty = absl::ToDoubleSeconds(s.received - s.sent) / 2;
    const double at_least = std::max(0.0, std::fabs(skew) - uncertainty);
    c.detail = absl::StrFormat("%+.3f s against this host (+- %.3f s)", skew, uncertainty);
    if (at_least > 1.0) {
      c.status = CheckStatus::kFail;
    } else if (at_least > 0.1) {
      c.status = CheckStatus::kWarn;
    }
    if (c.status != CheckStatus::kPass) c.fix = "run NTP (chrony / systemd-timesyncd) on every host of the fleet";
    results.push_back(std::move(c));
  }
  return results;
}

std::vector<CheckResult> CheckGpuMemory(const std::vector<GpuMemory>& gpus) {
  std::vector<CheckResult> out;
  for (const GpuMemory& g : gpus) {
    const uint64_t free_bytes = g.total > g.used ? g.total - g.used : 0;
    const double free_fraction = g.total > 0 ? static_cast<double>(free_bytes) / g.total : 0.0;
    const std::string detail = absl::StrFormat("GPU %d (%s): %.1f of %.1f GiB free (%.0f%%)", g.index, g.name,
                                               free_bytes / 1073741824.0, g.total / 1073741824.0, free_fraction * 100);
    if (free_fraction < 0.02) {
      out.push_back({"gpu_memory", CheckStatus::kFail, detail,
                     "free GPU memory first: find the processes with nvidia-smi, or shrink the KV cache / batch "
                     "(rollout --max_batch) of what runs there"});
    } else if (free_fraction < 0.10) {
      out.push_back({"gpu_memory", CheckStatus::kWarn, detail,
                     "under 10% free: a larger batch or another process will run out of memory"});
    } else {
      out.push_back({"gpu_memory", CheckStatus::kPass, detail, ""});
    }
  }
  return out;
}

std::vector<CheckResult> RunLocalChecks() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view kv(*e);
    const size_t eq = kv.find('=');
    if (eq == absl::string_view::npos) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  std::vector<CheckResult> out = CheckNcclVariables(env);
  out.push_back(CheckNcclDebug(env));
  for (auto& r : CheckNics("/sys/class/net")) out.push_back(std::move(r));
  for (auto& r : CheckGpuNuma("/sys/bus/pci/devices")) out.push_back(std::move(r));
  absl::StatusOr<std::vector<gpu::GpuSample>> gpus = gpu::SampleGpus();
  if (gpus.ok()) {
    std::vector<GpuMemory> memory;
    for (const gpu::GpuSample& g : *gpus) memory.push_back({g.index, g.name, g.memory_used, g.memory_total});
    for (auto& r : CheckGpuMemory(memory)) out.push_back(std::move(r));
  } else {
    out.push_back({"gpu_memory", CheckStatus::kPass, absl::StrCat("not checked: ", gpus.status().message()), ""});
  }
  return out;
}

std::string FormatResults(const std::vector<CheckResult>& results, bool json) {
  std::string out;
  if (json) {
    auto esc = [](const std::string& s) {
      std::string r;
      for (char c : s) {
        if (c == '"' || c == '\\') r += '\\';
        r += c;
      }
      return r;
    };
    out = "[";
    for (size_t i = 0; i < results.size(); ++i) {
      const CheckResult& r = results[i];
      absl::StrAppend(&out, i ? ",\n " : "", "{\"check\": \"", esc(r.check), "\", \"status\": \"",
                      CheckStatusName(r.status), "\", \"detail\": \"", esc(r.detail), "\", \"fix\": \"", esc(r.fix),
                      "\"}");
    }
    out += "]\n";
    return out;
  }
  for (const CheckResult& r : results) {
    absl::StrAppend(&out, absl::StrFormat("%-5s %-10s %s\n", CheckStatusName(r.status), r.check, r.detail));
    if (!r.fix.empty() && r.status != CheckStatus::kPass) absl::StrAppend(&out, "                 fix: ", r.fix, "\n");
    if (!r.fix.empty() && r.status == CheckStatus::kPass) absl::StrAppend(&out, "                 hint: ", r.fix, "\n");
  }
  return out;
}

}  // namespace rlfleet::controller
