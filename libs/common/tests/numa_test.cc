// NUMA binding: sysfs parsing against fake trees, and a real binding of this process
// (to node 0, which every Linux host has) checked through the kernel's own answers.
#include "libs/common/numa.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gtest/gtest.h"

namespace rlfleet::common {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

std::vector<int> Affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

TEST(Numa, CpuListsParseAndNonsenseIsRefused) {
  EXPECT_EQ(*ParseCpuList("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(*ParseCpuList("5"), (std::vector<int>{5}));
  for (const char* bad : {"", "3-1", "a", "1-2-3", "-1", "0,,2", "99999"}) {
    EXPECT_EQ(ParseCpuList(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(Numa, AGpusNodeComesFromSysfsWhateverTheBusIdsSpelling) {
  const fs::path pci = fs::path(std::getenv("TEST_TMPDIR")) / "pci";
  Write(pci / "0000:3b:00.0" / "numa_node", "1");
  Write(pci / "0000:5e:00.0" / "numa_node", "-1");
  EXPECT_EQ(*PciNumaNode(pci, "00000000:3B:00.0"), 1);  // (CUDA's spelling)
  EXPECT_EQ(*PciNumaNode(pci, "0000:3b:00.0"), 1);
  EXPECT_EQ(*PciNumaNode(pci, "3b:00.0"), 1);
  EXPECT_EQ(*PciNumaNode(pci, "0000:5e:00.0"), -1);
  EXPECT_EQ(PciNumaNode(pci, "0000:99:00.0").status().code(), absl::StatusCode::kNotFound);
}

TEST(Numa, TheFlagIsAutoOffOrANode) {
  EXPECT_EQ(ParseNumaFlag("auto")->mode, NumaRequest::Mode::kAuto);
  EXPECT_EQ(ParseNumaFlag("off")->mode, NumaRequest::Mode::kOff);
  EXPECT_EQ(ParseNumaFlag("3")->node, 3);
  for (const char* bad : {"", "-1", "on", "1.5"}) {
    absl::StatusOr<NumaRequest> r = ParseNumaFlag(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(Numa, AutoBindsOnlyWhenTheGpuReportsANodeAndOffNever) {
  const fs::path pci = fs::path(std::getenv("TEST_TMPDIR")) / "pci2";
  Write(pci / "0000:5e:00.0" / "numa_node", "-1");
  const std::vector<int> before = Affinity();
  absl::StatusOr<NumaBinding> none = ApplyNuma({}, "0000:5e:00.0", pci);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->node, -1);
  EXPECT_NE(none->why.find("reports no NUMA node"), std::string::npos) << none->why;
  absl::StatusOr<NumaBinding> cpu = ApplyNuma({}, "", pci);
  ASSERT_TRUE(cpu.ok());
  EXPECT_NE(cpu->why.find("no GPU"), std::string::npos) << cpu->why;
  absl::StatusOr<NumaBinding> off = ApplyNuma(*ParseNumaFlag("off"), "0000:5e:00.0", pci);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->node, -1);
  EXPECT_EQ(Affinity(), before);  // (nothing was bound)
  // A node that does not exist here is an error naming it, not a silent no-op.
  absl::StatusOr<NumaBinding> missing = ApplyNuma(*ParseNumaFlag("77"), "", pci);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("77"), std::string::npos);
}

// Bound to node 0 (its CPUs as this host's sysfs lists them): this thread and a thread
// started afterwards run only there, and node 0 is the preferred node for memory.
TEST(Numa, BindingSetsEveryThreadsCpusAndTheMemoryPolicy) {
  const fs::path pci = fs::path(std::getenv("TEST_TMPDIR")) / "pci3";
  Write(pci / "0000:3b:00.0" / "numa_node", "0");
  absl::StatusOr<std::vector<int>> node0 = NodeCpus("/sys/devices/system/node", 0);
  ASSERT_TRUE(node0.ok()) << node0.status();
  std::vector<int> seen_by_early;
  std::atomic<bool> go{false};
  std::thread early([&] {  // (started before the binding: still bound by it)
    while (!go.load()) std::this_thread::yield();
    seen_by_early = Affinity();
  });
  absl::StatusOr<NumaBinding> b = ApplyNuma({}, "0000:3b:00.0", pci);
  ASSERT_TRUE(b.ok()) << b.status();
  go = true;
  early.join();
  EXPECT_EQ(b->node, 0);
  EXPECT_EQ(b->gpu_node, 0);
  EXPECT_EQ(b->cpus, *node0);
  EXPECT_EQ(Affinity(), *node0);
  EXPECT_EQ(seen_by_early, *node0);
  std::vector<int> seen_by_later;
  std::thread later([&] { seen_by_later = Affinity(); });
  later.join();
  EXPECT_EQ(seen_by_later, *node0);
  int mode = -1;
  unsigned long mask[16] = {};
  ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask, 16 * 8 * sizeof(unsigned long), nullptr, 0), 0);
  EXPECT_EQ(mode, 1);  // MPOL_PREFERRED (linux/mempolicy.h)
  EXPECT_EQ(mask[0] & 1ul, 1ul);
}

}  // namespace
}  // namespace rlfleet::common
