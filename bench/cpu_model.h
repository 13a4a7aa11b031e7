// The CPU model a benchmark ran on (/proc/cpuinfo's first "model name"), for its table:
// machines of one kind differ (AMD EPYC and Intel Xeon both seen), and a ratio measured
// on one says little about the other.
#ifndef RLFLEET_BENCH_CPU_MODEL_H_
#define RLFLEET_BENCH_CPU_MODEL_H_

#include <fstream>
#include <string>
#include <thread>

namespace rlfleet::bench {

inline std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      return line.substr(colon + 2) + ", " + std::to_string(std::thread::hardware_concurrency()) + " cores";
    }
  }
  return "unknown CPU";
}

}  // namespace rlfleet::bench

#endif  // RLFLEET_BENCH_CPU_MODEL_H_
