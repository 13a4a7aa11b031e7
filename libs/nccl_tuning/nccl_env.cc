#include "libs/nccl_tuning/nccl_env.h"

#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

ABSL_FLAG(std::string, nccl_profile, "",
          "NCCL tuning profile applied to this process's environment at start (variables already set win): "
          "single-node, multi-node or large-ib (`rlfleet nccl-profiles` lists them); empty: none.");

namespace rlfleet::nccl {

// The variables NCCL 2.19 .. 2.28 reads (NVIDIA's environment-variable documentation).
const std::set<std::string>& KnownNcclVariables() {
  static const auto* known = new std::set<std::string>{
      "NCCL_ALGO",
      "NCCL_BUFFSIZE",
      "NCCL_CHECK_POINTERS",
      "NCCL_CHECKS_DISABLE",
      "NCCL_COLLNET_ENABLE",
      "NCCL_COLLNET_NODE_THRESHOLD",
      "NCCL_COMM_BLOCKING",
      "NCCL_COMM_ID",
      "NCCL_CONF_FILE",
      "NCCL_CROSS_NIC",
      "NCCL_CUMEM_ENABLE",
      "NCCL_CUMEM_HOST_ENABLE",
      "NCCL_DEBUG",
      "NCCL_DEBUG_FILE",
      "NCCL_DEBUG_SUBSYS",
      "NCCL_DMABUF_ENABLE",
      "NCCL_GRAPH_DUMP_FILE",
      "NCCL_GRAPH_FILE",
      "NCCL_GRAPH_MIXING_SUPPORT",
      "NCCL_HOSTID",
      "NCCL_IB_ADAPTIVE_ROUTING",
      "NCCL_IB_ADDR_FAMILY",
      "NCCL_IB_ADDR_RANGE",
      "NCCL_IB_AR_THRESHOLD",
      "NCCL_IB_DISABLE",
      "NCCL_IB_ECE_ENABLE",
      "NCCL_IB_FIFO_TC",
      "NCCL_IB_GID_INDEX",
      "NCCL_IB_HCA",
      "NCCL_IB_MERGE_NICS",
      "NCCL_IB_MERGE_VFS",
      "NCCL_IB_PCI_RELAXED_ORDERING",
      "NCCL_IB_QPS_PER_CONNECTION",
      "NCCL_IB_RETRY_CNT",
      "NCCL_IB_ROCE_VERSION_NUM",
      "NCCL_IB_SL",
      "NCCL_IB_SPLIT_DATA_ON_QPS",
      "NCCL_IB_TC",
      "NCCL_IB_TIMEOUT",
      "NCCL_IB_USE_INLINE",
      "NCCL_IGNORE_CPU_AFFINITY",
      "NCCL_IGNORE_DISABLED_P2P",
      "NCCL_LAUNCH_MODE",
      "NCCL_LL128_BUFFSIZE",
      "NCCL_LL_BUFFSIZE",
      "NCCL_LOCAL_REGISTER",
      "NCCL_MAX_CTAS",
      "NCCL_MAX_NCHANNELS",
      "NCCL_MAX_P2P_NCHANNELS",
      "NCCL_MIN_CTAS",
      "NCCL_MIN_NCHANNELS",
      "NCCL_MIN_P2P_NCHANNELS",
      "NCCL_MNNVL_ENABLE",
      "NCCL_NCHANNELS_PER_NET_PEER",
      "NCCL_NET",
      "NCCL_NET_DISABLE_INTRA",
      "NCCL_NET_FORCE_FLUSH",
      "NCCL_NET_GDR_LEVEL",
      "NCCL_NET_GDR_READ",
      "NCCL_NET_OVERHEAD",
      "NCCL_NET_PLUGIN",
      "NCCL_NET_SHARED_BUFFERS",
      "NCCL_NET_SHARED_COMMS",
      "NCCL_NSOCKS_PERTHREAD",
      "NCCL_NTHREADS",
      "NCCL_NVB_DISABLE",
      "NCCL_NVLS_CHUNKSIZE",
      "NCCL_NVLS_ENABLE",
      "NCCL_NVLS_NCHANNELS",
      "NCCL_P2P_DIRECT_DISABLE",
      "NCCL_P2P_DISABLE",
      "NCCL_P2P_LEVEL",
      "NCCL_P2P_NET_CHUNKSIZE",
      "NCCL_P2P_NVL_CHUNKSIZE",
      "NCCL_P2P_PCI_CHUNKSIZE",
      "NCCL_P2P_READ_ENABLE",
      "NCCL_PROFILER_PLUGIN",
      "NCCL_PROTO",
      "NCCL_PXN_DISABLE",
      "NCCL_RAS_ADDR",
      "NCCL_RAS_ENABLE",
      "NCCL_RAS_TIMEOUT_FACTOR",
      "NCCL_RUNTIME_CONNECT",
      "NCCL_SET_STACK_SIZE",
      "NCCL_SET_THREAD_NAME",
      "NCCL_SHM_DISABLE",
      "NCCL_SHM_USE_CUDA_MEMCPY",
      "NCCL_SINGLE_RING_THRESHOLD",
      "NCCL_SOCKET_FAMILY",
      "NCCL_SOCKET_IFNAME",
      "NCCL_SOCKET_NTHREADS",
      "NCCL_SOCKET_RETRY_CNT",
      "NCCL_SOCKET_RETRY_SLEEP_MSEC",
      "NCCL_TOPO_DUMP_FILE",
      "NCCL_TOPO_FILE",
      "NCCL_TUNER_PLUGIN",
      "NCCL_WIN_ENABLE",
      "NCCL_WORK_FIFO_DEPTH",
  };
  return *known;
}

// Variables with NCCL_ in their name that another layer reads, and what to use.
const std::map<std::string, std::string>& ForeignNcclVariables() {
  static const auto* foreign = new std::map<std::string, std::string>{
      {"NCCL_ASYNC_ERROR_HANDLING",
       "PyTorch reads it (deprecated there for TORCH_NCCL_ASYNC_ERROR_HANDLING); NCCL ignores it"},
      {"NCCL_BLOCKING_WAIT", "PyTorch reads it (now TORCH_NCCL_BLOCKING_WAIT); NCCL ignores it"},
      {"NCCL_ENABLE_MONITORING", "PyTorch's (TORCH_NCCL_ENABLE_MONITORING); NCCL ignores it"},
  };
  return *foreign;
}

const std::vector<NcclProfile>& NcclProfiles() {
  static const auto* profiles = new std::vector<NcclProfile>{
      {"single-node",
       "one host, up to 8 GPUs (NVLink / NVSwitch or PCIe); no traffic leaves the host",
       {
           {"NCCL_IB_DISABLE", "1",
            "never use the InfiniBand / RoCE transport: ranks talk over P2P (NVLink, PCIe) or shared "
            "memory, and init skips probing IB devices"},
           {"NCCL_SOCKET_IFNAME", "lo",
            "bootstrap (and the socket fallback) over loopback: every rank is on this host"},
           {"NCCL_NVLS_ENABLE", "0",
            "NVLink SHARP (multicast) off: on shared hosts multicast can take the GPUs out of service; it costs "
            "some all-reduce bandwidth on NVSwitch systems"},
           {"NCCL_DEBUG", "WARN", "warnings only: INFO logs every connection and slows start-up"},
       }},
      {"multi-node",
       "8-32 GPUs on 2-4 hosts over Ethernet (TCP sockets) or a small InfiniBand / RoCE fabric",
       {
           {"NCCL_SOCKET_IFNAME", "^lo,docker,virbr",
            "bootstrap and sockets on the real NICs, never loopback or container bridges (a leading ^ "
            "excludes interfaces by prefix)"},
           {"NCCL_SOCKET_NTHREADS", "4",
            "with the socket transport, 4 helper threads per connection: one TCP stream cannot fill a 25-100 "
            "GbE link (threads x sockets is capped at 64)"},
           {"NCCL_NSOCKS_PERTHREAD", "4", "4 TCP sockets per helper thread (16 per connection with the above)"},
           {"NCCL_NET_GDR_LEVEL", "PHB",
            "GPUDirect RDMA when GPU and NIC share a PCIe host bridge; farther apart, stage through host "
            "memory"},
           {"NCCL_IB_TIMEOUT", "22",
            "InfiniBand retransmission timeout 4.096 us x 2^22 (about 17 s): rides out congestion, and a dead "
            "link still ends in an error rather than a hang"},
           {"NCCL_NVLS_ENABLE", "0", "NVLink SHARP (multicast) off (see single-node)"},
           {"NCCL_DEBUG", "WARN", "warnings only: INFO logs every connection and slows start-up"},
       }},
      {"large-ib",
       "more than 32 GPUs over InfiniBand or RoCE (multi-rail fat trees)",
       {
           {"NCCL_IB_HCA", "mlx5",
            "the Mellanox / NVIDIA HCAs (prefix match); list ports (=mlx5_0:1,mlx5_1:1) where not every "
            "HCA is for NCCL"},
           {"NCCL_IB_GID_INDEX", "3",
            "RoCE v2 with an IPv4-mapped GID on most RoCE setups (InfiniBand ignores it); check with "
            "show_gids"},
           {"NCCL_IB_TC", "106",
            "RoCE traffic class (DSCP 26, the lossless class on many fabrics): use your switches'"},
           {"NCCL_IB_QPS_PER_CONNECTION", "4",
            "each connection over 4 queue pairs: spreads traffic better across ECMP / adaptive-routing paths"},
           {"NCCL_IB_TIMEOUT", "22", "retransmission timeout about 17 s (see multi-node)"},
           {"NCCL_IB_RETRY_CNT", "7", "retries before an error, the maximum"},
           {"NCCL_NET_GDR_LEVEL", "PXB",
            "GPUDirect RDMA when GPU and NIC sit behind the same PCIe switch(es), not through the CPU"},
           {"NCCL_SOCKET_IFNAME", "^lo,docker,virbr", "bootstrap on the real NICs"},
           {"NCCL_NVLS_ENABLE", "0", "NVLink SHARP (multicast) off (see single-node)"},
           {"NCCL_DEBUG", "WARN", "warnings only: INFO logs every connection and slows start-up"},
       }},
  };
  return *profiles;
}

absl::StatusOr<const NcclProfile*> FindNcclProfile(const std::string& name) {
  std::vector<std::string> names;
  for (const NcclProfile& p : NcclProfiles()) {
    if (p.name == name) return &p;
    names.push_back(p.name);
  }
  return absl::NotFoundError(
      absl::StrCat("unknown NCCL profile '", name, "'; the profiles are ", absl::StrJoin(names, ", ")));
}

std::vector<std::string> ApplyNcclProfile(const NcclProfile& profile) {
  std::vector<std::string> lines;
  for (const NcclSetting& s : profile.settings) {
    if (const char* current = getenv(s.name.c_str()); current != nullptr) {
      lines.push_back(absl::StrCat("kept ", s.name, "=", current, " from the environment (profile ", profile.name, ": ",
                                   s.value, ")"));
      continue;
    }
    setenv(s.name.c_str(), s.value.c_str(), 1);
    lines.push_back(absl::StrCat("set ", s.name, "=", s.value));
  }
  return lines;
}

absl::Status ApplyNcclProfileFromFlags(const std::string& name) {
  const std::string profile_name = absl::GetFlag(FLAGS_nccl_profile);
  if (profile_name.empty()) return absl::OkStatus();
  absl::StatusOr<const NcclProfile*> profile = FindNcclProfile(profile_name);
  if (!profile.ok()) return profile.status();
  for (const std::string& line : ApplyNcclProfile(**profile)) {
    std::cerr << name << ": NCCL profile " << profile_name << ": " << line << "\n";
  }
  return absl::OkStatus();
}

std::string FormatNcclProfiles() {
  std::string out;
  for (const NcclProfile& p : NcclProfiles()) {
    absl::StrAppend(&out, "# ", p.name, ": ", p.scope, "\n");
    for (const NcclSetting& s : p.settings)
      absl::StrAppend(&out, "export ", s.name, "=", s.value, "  # ", s.what, "\n");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace rlfleet::nccl
