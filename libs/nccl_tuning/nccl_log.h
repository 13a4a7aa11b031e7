// A reader for NCCL_DEBUG=INFO logs: what a communicator was built from and what went
// wrong, summarised from the lines NCCL prints while it initialises and runs (version,
// ranks and nodes, the network plugin, channels, rings and trees, the transport of each
// connection: P2P, SHM, NET/IB with or without GPUDirect RDMA, NET/Socket; warnings,
// errors, timeouts and aborts). The input may interleave many ranks and processes and
// carry other programs' lines (they are skipped). Pure code.
#ifndef RLFLEET_LIBS_NCCL_TUNING_NCCL_LOG_H_
#define RLFLEET_LIBS_NCCL_TUNING_NCCL_LOG_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace rlfleet::nccl {

struct NcclLogSummary {
  int nccl_lines = 0;              // lines NCCL printed (INFO and WARN)
  std::string version;             // "2.28.9+cuda13.0"
  std::set<std::string> hosts;     // host names in the line prefixes
  std::set<int> processes;         // pids
  int ranks = 0;                   // nranks of the communicators seen (largest)
  int nodes = 0;                   // nNodes where NCCL printed it
  std::set<std::string> networks;  // "Using network X": IB, Socket, a plugin's name
  int coll_channels = 0;           // "N coll channels" (largest)
  int nvls_channels = 0;           // "N nvls channels" (largest)
  int p2p_channels = 0;            // "N p2p channels" (largest)
  int rings = 0;                   // distinct ring / channel ids laid out
  int trees = 0;                   // distinct tree ids laid out
  bool connected_rings = false;    // "Connected all rings"
  bool connected_trees = false;    // "Connected all trees"
  // Connections by transport: "P2P/CUMEM/read" counts as P2P, "NET/IB/1/GDRDMA" as
  // NET/IB (and in gdr_connections), "NET/Socket/3" as NET/Socket, "SHM/direct" as SHM.
  std::map<std::string, int> connections;
  int gdr_connections = 0;
  int init_started = 0, init_complete = 0;  // ncclCommInitRank... Init START / COMPLETE
  int aborted = 0, destroyed = 0;           // communicators aborted / destroyed
  std::map<std::string, std::string> env;   // "NCCL_X set by environment to V"
  std::vector<std::string> warnings;        // NCCL WARN messages, in order (deduplicated)
  // Problems a reader should look at first: warnings, errors NCCL returned, timeouts,
  // aborts, communicators that started but never completed init.
  std::vector<std::string> problems;
};

NcclLogSummary ParseNcclLog(absl::string_view log);

// The summary as a text report (and `json`: one JSON object) for `rlfleet nccl-log`.
std::string FormatNcclLogSummary(const NcclLogSummary& summary, bool json);

}  // namespace rlfleet::nccl

#endif  // RLFLEET_LIBS_NCCL_TUNING_NCCL_LOG_H_
