#include "libs/common/numa.h"

#include <dirent.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace rlfleet::common {
namespace {

constexpr int kMaxCpus = CPU_SETSIZE;  // 1024: what cpu_set_t holds
constexpr int kMpolPreferred = 1;      // linux/mempolicy.h's MPOL_PREFERRED
constexpr int kMaxNodes = 1024;        // the node mask's bits

absl::StatusOr<std::string> ReadLine(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": not found"));
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

// "0000:3b:00.0" from CUDA's "00000000:3B:00.0" or lspci's "3b:00.0".
std::string CanonicalBusId(const std::string& bus_id) {
  std::string id = absl::AsciiStrToLower(absl::StripAsciiWhitespace(bus_id));
  std::vector<std::string> parts = absl::StrSplit(id, ':');
  if (parts.size() == 2) parts.insert(parts.begin(), "0000");
  if (parts.size() == 3 && parts[0].size() > 4) parts[0] = parts[0].substr(parts[0].size() - 4);
  return absl::StrJoin(parts, ":");
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text) {
  std::vector<int> cpus;
  const std::string list(absl::StripAsciiWhitespace(text));
  auto bad = [&] { return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not a CPU list like 0-3,8")); };
  if (list.empty()) return bad();
  for (absl::string_view range : absl::StrSplit(list, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(range, '-');
    int first = 0, last = 0;
    if (ends.size() > 2 || !absl::SimpleAtoi(ends[0], &first) ||
        !absl::SimpleAtoi(ends.size() == 2 ? ends[1] : ends[0], &last) || first < 0 || last < first ||
        last >= kMaxCpus) {
      return bad();
    }
    for (int c = first; c <= last; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

absl::StatusOr<int> PciNumaNode(const std::string& sysfs_pci, const std::string& bus_id) {
  const std::string dir = absl::StrCat(sysfs_pci, "/", CanonicalBusId(bus_id));
  absl::StatusOr<std::string> text = ReadLine(dir + "/numa_node");
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("PCI device ", bus_id, ": no ", dir, "/numa_node"));
  int node = -1;
  if (!absl::SimpleAtoi(*text, &node)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/numa_node: \"", *text, "\" is not a number"));
  }
  return std::max(node, -1);
}

absl::StatusOr<std::vector<int>> NodeCpus(const std::string& sysfs_node, int node) {
  const std::string path = absl::StrCat(sysfs_node, "/node", node, "/cpulist");
  absl::StatusOr<std::string> text = ReadLine(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("NUMA node ", node, ": no ", path));
  if (text->empty()) return absl::InvalidArgumentError(absl::StrCat("NUMA node ", node, " has no CPUs (", path, ")"));
  return ParseCpuList(*text);
}

absl::StatusOr<NumaRequest> ParseNumaFlag(const std::string& value) {
  NumaRequest r;
  if (value == "auto") return r;
  if (value == "off") {
    r.mode = NumaRequest::Mode::kOff;
    return r;
  }
  if (absl::SimpleAtoi(value, &r.node) && r.node >= 0 && r.node < kMaxNodes) {
    r.mode = NumaRequest::Mode::kNode;
    return r;
  }
  return absl::InvalidArgumentError(absl::StrCat("--numa=", value, ": auto, off or a NUMA node number"));
}

absl::Status BindToNode(int node, const std::string& sysfs_node, std::vector<int>* cpus) {
  if (node < 0 || node >= kMaxNodes) return absl::InvalidArgumentError(absl::StrCat("NUMA node ", node));
  absl::StatusOr<std::vector<int>> on = NodeCpus(sysfs_node, node);
  if (!on.ok()) return on.status();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : *on) CPU_SET(c, &set);
  // Every thread there is now (a thread's affinity is its own; threads started later
  // inherit their creator's).
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return absl::InternalError(absl::StrCat("/proc/self/task: ", std::strerror(errno)));
  int failed_errno = 0;
  while (dirent* e = readdir(tasks)) {
    int tid = 0;
    if (!absl::SimpleAtoi(e->d_name, &tid)) continue;
    if (sched_setaffinity(tid, sizeof(set), &set) != 0 && errno != ESRCH) failed_errno = errno;
  }
  closedir(tasks);
  if (failed_errno != 0) {
    return absl::InternalError(absl::StrCat("binding to NUMA node ", node, "'s CPUs: ", std::strerror(failed_errno)));
  }
  // Memory: this thread's policy, inherited by the threads it starts.
  unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long))] = {};
  mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
  if (syscall(SYS_set_mempolicy, kMpolPreferred, mask, kMaxNodes) != 0) {
    return absl::InternalError(absl::StrCat("set_mempolicy(preferred node ", node, "): ", std::strerror(errno)));
  }
  if (cpus != nullptr) *cpus = *std::move(on);
  return absl::OkStatus();
}

absl::StatusOr<NumaBinding> ApplyNuma(const NumaRequest& request, const std::string& gpu_bus_id,
                                      const std::string& sysfs_pci, const std::string& sysfs_node) {
  NumaBinding b;
  std::string gpu_said;
  if (!gpu_bus_id.empty()) {
    absl::StatusOr<int> node = PciNumaNode(sysfs_pci, gpu_bus_id);
    b.gpu_node = node.ok() ? *node : -1;
    gpu_said = node.ok() ? (*node >= 0 ? absl::StrCat("GPU ", gpu_bus_id, " is on node ", *node)
                                       : absl::StrCat("GPU ", gpu_bus_id, " reports no NUMA node"))
                         : std::string(node.status().message());
  }
  int target = -1;
  switch (request.mode) {
    case NumaRequest::Mode::kOff:
      b.why = absl::StrCat("not bound (--numa=off)", gpu_said.empty() ? "" : "; ", gpu_said);
      return b;
    case NumaRequest::Mode::kAuto:
      if (b.gpu_node < 0) {
        b.why = absl::StrCat("not bound (--numa=auto: ", gpu_bus_id.empty() ? std::string("no GPU") : gpu_said, ")");
        return b;
      }
      target = b.gpu_node;
      break;
    case NumaRequest::Mode::kNode:
      target = request.node;
      break;
  }
  if (absl::Status s = BindToNode(target, sysfs_node, &b.cpus); !s.ok()) return s;
  b.node = target;
  b.why = absl::StrCat("threads on node ", target, "'s ", b.cpus.size(), " CPUs, memory preferred there",
                       gpu_said.empty() ? "" : "; ", gpu_said,
                       b.gpu_node >= 0 && b.gpu_node != target ? " (not the node bound: slower host copies)" : "");
  return b;
}

}  // namespace rlfleet::common
