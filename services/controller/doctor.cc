#include "services/controller/doctor.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace rlfleet::controller {
namespace {

namespace fs = std::filesystem;

// The variables NCCL 2.19 .. 2.28 reads (NVIDIA's environment-variable documentation).
const std::set<std::string>& KnownNcclVariables() {
  static const auto* known = new std::set<std::string>{
      "NCCL_ALGO", "NCCL_BUFFSIZE", "NCCL_CHECK_POINTERS", "NCCL_CHECKS_DISABLE", "NCCL_COLLNET_ENABLE",
      "NCCL_COLLNET_NODE_THRESHOLD", "NCCL_COMM_BLOCKING", "NCCL_COMM_ID", "NCCL_CONF_FILE", "NCCL_CROSS_NIC",
      "NCCL_CUMEM_ENABLE", "NCCL_CUMEM_HOST_ENABLE", "NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS",
      "NCCL_DMABUF_ENABLE", "NCCL_GRAPH_DUMP_FILE", "NCCL_GRAPH_FILE", "NCCL_GRAPH_MIXING_SUPPORT",
      "NCCL_HOSTID", "NCCL_IB_ADAPTIVE_ROUTING", "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ADDR_RANGE",
      "NCCL_IB_AR_THRESHOLD", "NCCL_IB_DISABLE", "NCCL_IB_ECE_ENABLE", "NCCL_IB_FIFO_TC", "NCCL_IB_GID_INDEX",
      "NCCL_IB_HCA", "NCCL_IB_MERGE_NICS", "NCCL_IB_MERGE_VFS", "NCCL_IB_PCI_RELAXED_ORDERING",
      "NCCL_IB_QPS_PER_CONNECTION", "NCCL_IB_RETRY_CNT", "NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_SL",
      "NCCL_IB_SPLIT_DATA_ON_QPS", "NCCL_IB_TC", "NCCL_IB_TIMEOUT", "NCCL_IB_USE_INLINE",
      "NCCL_IGNORE_CPU_AFFINITY", "NCCL_IGNORE_DISABLED_P2P", "NCCL_LAUNCH_MODE", "NCCL_LL128_BUFFSIZE",
      "NCCL_LL_BUFFSIZE", "NCCL_LOCAL_REGISTER", "NCCL_MAX_CTAS", "NCCL_MAX_NCHANNELS",
      "NCCL_MAX_P2P_NCHANNELS", "NCCL_MIN_CTAS", "NCCL_MIN_NCHANNELS", "NCCL_MIN_P2P_NCHANNELS",
      "NCCL_MNNVL_ENABLE", "NCCL_NCHANNELS_PER_NET_PEER", "NCCL_NET", "NCCL_NET_DISABLE_INTRA",
      "NCCL_NET_FORCE_FLUSH", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_NET_OVERHEAD",
      "NCCL_NET_PLUGIN", "NCCL_NET_SHARED_BUFFERS", "NCCL_NET_SHARED_COMMS", "NCCL_NSOCKS_PERTHREAD",
      "NCCL_NTHREADS", "NCCL_NVB_DISABLE", "NCCL_NVLS_CHUNKSIZE", "NCCL_NVLS_ENABLE", "NCCL_NVLS_NCHANNELS",
      "NCCL_P2P_DIRECT_DISABLE", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_P2P_NET_CHUNKSIZE",
      "NCCL_P2P_NVL_CHUNKSIZE", "NCCL_P2P_PCI_CHUNKSIZE", "NCCL_P2P_READ_ENABLE", "NCCL_PROFILER_PLUGIN",
      "NCCL_PROTO", "NCCL_PXN_DISABLE", "NCCL_RAS_ADDR", "NCCL_RAS_ENABLE", "NCCL_RAS_TIMEOUT_FACTOR",
      "NCCL_RUNTIME_CONNECT", "NCCL_SET_STACK_SIZE", "NCCL_SET_THREAD_NAME", "NCCL_SHM_DISABLE",
      "NCCL_SHM_USE_CUDA_MEMCPY", "NCCL_SINGLE_RING_THRESHOLD", "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_IFNAME",
      "NCCL_SOCKET_NTHREADS", "NCCL_SOCKET_RETRY_CNT", "NCCL_SOCKET_RETRY_SLEEP_MSEC", "NCCL_TOPO_DUMP_FILE",
      "NCCL_TOPO_FILE", "NCCL_TUNER_PLUGIN", "NCCL_WIN_ENABLE", "NCCL_WORK_FIFO_DEPTH",
  };
  return *known;
}

// Variables with NCCL_ in their name that another layer reads, and what to use.
const std::map<std::string, std::string>& ForeignNcclVariables() {
  static const auto* foreign = new std::map<std::string, std::string>{
      {"NCCL_ASYNC_ERROR_HANDLING", "PyTorch reads it (deprecated there for TORCH_NCCL_ASYNC_ERROR_HANDLING); NCCL ignores it"},
      {"NCCL_BLOCKING_WAIT", "PyTorch reads it (now TORCH_NCCL_BLOCKING_WAIT); NCCL ignores it"},
      {"NCCL_ENABLE_MONITORING", "PyTorch's (TORCH_NCCL_ENABLE_MONITORING); NCCL ignores it"},
  };
  return *foreign;
}

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
    case CheckStatus::kPass: return "pass";
    case CheckStatus::kWarn: return "warn";
    case CheckStatus::kFail: return "fail";
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
      out.push_back({"nic", CheckStatus::kWarn, counts, absl::StrCat("ip link set ", name, " mtu 1500 (or 9000 for jumbo frames)")});
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
