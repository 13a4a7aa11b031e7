#include "libs/nccl_tuning/nccl_log.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace rlfleet::nccl {
namespace {

// ncclResult_t names, for the "file.cc:NNN -> N" traces NCCL prints as an error unwinds.
const char* ResultName(int code) {
  switch (code) {
    case 1:
      return "ncclUnhandledCudaError";
    case 2:
      return "ncclSystemError";
    case 3:
      return "ncclInternalError";
    case 4:
      return "ncclInvalidArgument";
    case 5:
      return "ncclInvalidUsage";
    case 6:
      return "ncclRemoteError";
    default:
      return "an NCCL error";
  }
}

// The integer after `key ` in `text` ("nranks 8" -> 8), or -1.
int IntAfter(absl::string_view text, absl::string_view key) {
  const size_t at = text.find(absl::StrCat(key, " "));
  if (at == absl::string_view::npos) return -1;
  absl::string_view rest = text.substr(at + key.size() + 1);
  const size_t end = rest.find_first_not_of("0123456789");
  int value = -1;
  if (!absl::SimpleAtoi(rest.substr(0, end), &value)) return -1;
  return value;
}

// The leading number of `text` ("07/64 : ..." -> 7), or -1.
int LeadingInt(absl::string_view text) {
  const size_t end = text.find_first_not_of("0123456789");
  int value = -1;
  if (end == 0 || !absl::SimpleAtoi(text.substr(0, end), &value)) return -1;
  return value;
}

void AddOnce(std::vector<std::string>& list, std::string item) {
  if (std::find(list.begin(), list.end(), item) == list.end()) list.push_back(std::move(item));
}

// "P2P/CUMEM/read" -> "P2P"; "NET/IB/1/GDRDMA" -> "NET/IB"; "NET/Socket/3" -> "NET/Socket".
std::string TransportKind(absl::string_view transport) {
  std::vector<absl::string_view> parts = absl::StrSplit(transport, '/');
  if (parts.size() >= 2 && parts[0] == "NET") return absl::StrCat("NET/", parts[1]);
  return std::string(parts[0]);
}

// Communicator life cycle, per "host:pid comm 0x...": started, completed, aborted.
enum class CommState { kStarted, kComplete, kAborted };

// The "comm 0x..." token of a line ("" if none).
std::string CommOf(absl::string_view m) {
  const size_t at = m.find("comm 0x");
  if (at == absl::string_view::npos) return "";
  absl::string_view rest = m.substr(at + 5);
  return std::string(rest.substr(0, rest.find(' ')));
}

void ParseInfo(absl::string_view m, const std::string& who, NcclLogSummary& s, std::set<int>& rings,
               std::set<int>& trees, std::map<std::string, CommState>& comms) {
  if (absl::ConsumePrefix(&m, "NCCL version ")) {
    s.version = std::string(m.substr(0, m.find(' ')));
    return;
  }
  if (absl::ConsumePrefix(&m, "Using network ")) {
    s.networks.insert(std::string(absl::StripAsciiWhitespace(m)));
    return;
  }
  if (m == "Connected all rings" || absl::StartsWith(m, "Connected all rings,")) {
    s.connected_rings = true;
    return;
  }
  if (absl::StartsWith(m, "Connected all trees")) {
    s.connected_trees = true;
    return;
  }
  if (const size_t at = m.find(" set by environment to ");
      at != absl::string_view::npos && absl::StartsWith(m, "NCCL_")) {
    s.env[std::string(m.substr(0, at))] =
        std::string(absl::StripSuffix(absl::StripAsciiWhitespace(m.substr(at + 23)), "."));
    return;
  }
  if (absl::StrContains(m, " coll channels")) {
    s.coll_channels = std::max(s.coll_channels, LeadingInt(m));
    if (const size_t at = m.find(" nvls channels"); at != absl::string_view::npos) {
      const size_t start = m.rfind(' ', at - 1);
      s.nvls_channels =
          std::max(s.nvls_channels, LeadingInt(m.substr(start == absl::string_view::npos ? 0 : start + 1)));
    }
    if (const size_t at = m.find(" p2p channels"); at != absl::string_view::npos) {
      const size_t start = m.rfind(' ', at - 1);
      s.p2p_channels = std::max(s.p2p_channels, LeadingInt(m.substr(start == absl::string_view::npos ? 0 : start + 1)));
    }
    return;
  }
  // Communicator life cycle.
  const std::string comm = absl::StrCat(who, " ", CommOf(m));
  if (absl::StrContains(m, " rank ") && absl::StartsWith(m, "ncclCommInit")) {
    s.ranks = std::max(s.ranks, IntAfter(m, "nranks"));
    if (absl::EndsWith(m, "Init START")) {
      ++s.init_started;
      comms[comm] = CommState::kStarted;
    }
    if (absl::EndsWith(m, "Init COMPLETE")) {
      ++s.init_complete;
      comms[comm] = CommState::kComplete;
    }
    return;
  }
  if (absl::StartsWith(m, "comm ")) {
    s.ranks = std::max({s.ranks, IntAfter(m, "nRanks"), IntAfter(m, "nranks")});
    s.nodes = std::max(s.nodes, IntAfter(m, "nNodes"));
    if (absl::EndsWith(m, "Abort COMPLETE")) {
      ++s.aborted;
      comms[comm] = CommState::kAborted;
    }
    if (absl::EndsWith(m, "Destroy COMPLETE")) ++s.destroyed;
    return;
  }
  // Connections: "Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/1/GDRDMA" (older NCCL:
  // "Ring 00 : ... via P2P/IPC").
  if (const size_t via = m.find(" via ");
      via != absl::string_view::npos && (absl::StartsWith(m, "Channel ") || absl::StartsWith(m, "Ring "))) {
    absl::string_view transport = absl::StripAsciiWhitespace(m.substr(via + 5));
    transport = transport.substr(0, transport.find(' '));
    ++s.connections[TransportKind(transport)];
    if (absl::StrContains(transport, "GDRDMA")) ++s.gdr_connections;
    return;
  }
  // Layout: "Ring 07 : 0 -> 1 -> 0", "Channel 07/64 : 0 1 2 3", "Tree 7 : ...", "Trees [0] ... [1] ...".
  absl::string_view rest = m;
  if (absl::ConsumePrefix(&rest, "Ring ") || absl::ConsumePrefix(&rest, "Channel ")) {
    if (int id = LeadingInt(rest); id >= 0 && absl::StrContains(rest, " : ")) rings.insert(id);
    return;
  }
  if (absl::ConsumePrefix(&rest, "Tree ")) {
    if (int id = LeadingInt(rest); id >= 0) trees.insert(id);
    return;
  }
  if (absl::ConsumePrefix(&rest, "Trees ")) {
    for (absl::string_view part : absl::StrSplit(rest, '[', absl::SkipEmpty())) {
      if (int id = LeadingInt(part); id >= 0) trees.insert(id);
    }
    return;
  }
  // Error unwinding: "init.cc:1582 -> 5" (the first such line names the error).
  if (const size_t arrow = m.find(" -> ");
      arrow != absl::string_view::npos && absl::StrContains(m.substr(0, arrow), ".cc:")) {
    const int code = LeadingInt(m.substr(arrow + 4));
    if (code > 0) AddOnce(s.problems, absl::StrCat("NCCL returned error ", code, " (", ResultName(code), ")"));
  }
}

}  // namespace

NcclLogSummary ParseNcclLog(absl::string_view log) {
  NcclLogSummary s;
  std::set<int> rings, trees;
  std::map<std::string, CommState> comms;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    line = absl::StripTrailingAsciiWhitespace(line);
    size_t at = line.find(" NCCL INFO ");
    bool warn = false;
    if (at == absl::string_view::npos) {
      at = line.find(" NCCL WARN ");
      warn = at != absl::string_view::npos;
    }
    if (at == absl::string_view::npos) {
      // Lines of the framework around NCCL that report its failures.
      if (absl::StrContains(line, "NCCL error")) AddOnce(s.problems, std::string(absl::StripAsciiWhitespace(line)));
      if (absl::StrContains(line, "Watchdog caught collective operation timeout")) {
        AddOnce(s.problems, std::string(absl::StripAsciiWhitespace(line)));
      }
      continue;
    }
    ++s.nccl_lines;
    // The prefix: [timestamp] host:pid:tid [device] [file.cc:line]
    std::string who;  // host:pid
    for (absl::string_view token : absl::StrSplit(line.substr(0, at), ' ', absl::SkipEmpty())) {
      std::vector<absl::string_view> parts = absl::StrSplit(token, ':');
      int pid = 0, tid = 0;
      if (parts.size() == 3 && !parts[0].empty() && absl::SimpleAtoi(parts[1], &pid) &&
          absl::SimpleAtoi(parts[2], &tid)) {
        s.hosts.insert(std::string(parts[0]));
        s.processes.insert(pid);
        who = absl::StrCat(parts[0], ":", pid);
      }
    }
    absl::string_view message = line.substr(at + 11);
    if (warn) {
      AddOnce(s.warnings, std::string(message));
      AddOnce(s.problems, absl::StrCat("WARN ", message));
      continue;
    }
    if (absl::StrContains(absl::AsciiStrToLower(message), "timeout") &&
        !absl::StrContains(message, "set by environment")) {
      AddOnce(s.problems, std::string(message));
    }
    ParseInfo(message, who, s, rings, trees, comms);
  }
  s.rings = rings.size();
  s.trees = trees.size();
  int unfinished = 0;  // communicators whose init started and neither completed nor was aborted
  for (const auto& [comm, state] : comms) unfinished += state == CommState::kStarted;
  if (unfinished > 0) {
    s.problems.push_back(absl::StrCat(unfinished, " communicator(s) started init and never completed it"));
  }
  if (s.aborted > 0) s.problems.push_back(absl::StrCat(s.aborted, " communicator(s) aborted"));
  return s;
}

namespace {

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

template <typename Container>
std::string JsonList(const Container& items) {
  std::vector<std::string> quoted;
  for (const auto& item : items) quoted.push_back(JsonString(item));
  return absl::StrCat("[", absl::StrJoin(quoted, ","), "]");
}

}  // namespace

std::string FormatNcclLogSummary(const NcclLogSummary& s, bool json) {
  std::vector<std::string> connections, env;
  for (const auto& [kind, n] : s.connections) connections.push_back(absl::StrCat(kind, " ", n));
  for (const auto& [name, value] : s.env) env.push_back(absl::StrCat(name, "=", value));
  if (json) {
    std::vector<std::string> conn_json;
    for (const auto& [kind, n] : s.connections) conn_json.push_back(absl::StrCat(JsonString(kind), ":", n));
    return absl::StrCat("{\"nccl_lines\":", s.nccl_lines, ",\"version\":", JsonString(s.version),
                        ",\"hosts\":", s.hosts.size(), ",\"processes\":", s.processes.size(), ",\"ranks\":", s.ranks,
                        ",\"nodes\":", s.nodes, ",\"networks\":", JsonList(s.networks),
                        ",\"coll_channels\":", s.coll_channels, ",\"nvls_channels\":", s.nvls_channels,
                        ",\"p2p_channels\":", s.p2p_channels, ",\"rings\":", s.rings, ",\"trees\":", s.trees,
                        ",\"connected_rings\":", s.connected_rings ? "true" : "false",
                        ",\"connected_trees\":", s.connected_trees ? "true" : "false", ",\"connections\":{",
                        absl::StrJoin(conn_json, ","), "},\"gdr_connections\":", s.gdr_connections,
                        ",\"init_started\":", s.init_started, ",\"init_complete\":", s.init_complete,
                        ",\"aborted\":", s.aborted, ",\"destroyed\":", s.destroyed, ",\"env\":", JsonList(env),
                        ",\"warnings\":", JsonList(s.warnings), ",\"problems\":", JsonList(s.problems), "}\n");
  }
  std::string out =
      absl::StrCat("NCCL ", s.version.empty() ? "(version not logged)" : s.version, ": ", s.nccl_lines, " lines from ",
                   s.processes.size(), " process(es) on ", s.hosts.size(), " host(s); ", s.ranks, " rank(s)",
                   s.nodes > 0 ? absl::StrCat(" on ", s.nodes, " node(s)") : "", "\n");
  absl::StrAppend(&out, "network:     ", s.networks.empty() ? "-" : absl::StrJoin(s.networks, ", "), "\n");
  absl::StrAppend(&out, "channels:    ", s.coll_channels, " collective, ", s.nvls_channels, " NVLS, ", s.p2p_channels,
                  " p2p; ", s.rings, " ring(s)", s.connected_rings ? " connected" : "", ", ", s.trees, " tree(s)",
                  s.connected_trees ? " connected" : "", "\n");
  absl::StrAppend(&out, "connections: ", connections.empty() ? "-" : absl::StrJoin(connections, ", "),
                  s.gdr_connections > 0 ? absl::StrCat(" (", s.gdr_connections, " with GPUDirect RDMA)") : "", "\n");
  absl::StrAppend(&out, "init:        ", s.init_started, " started, ", s.init_complete, " complete; ", s.aborted,
                  " aborted, ", s.destroyed, " destroyed\n");
  absl::StrAppend(&out, "env:         ", env.empty() ? "-" : absl::StrJoin(env, " "), "\n");
  if (s.problems.empty()) {
    absl::StrAppend(&out, "problems:    none\n");
  } else {
    absl::StrAppend(&out, "problems:\n");
    for (const std::string& p : s.problems) absl::StrAppend(&out, "  - ", p, "\n");
  }
  return out;
}

}  // namespace rlfleet::nccl
