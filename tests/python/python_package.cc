#include "tests/python/python_package.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/util/subprocess.h"

namespace rlfleet::testing {

std::string PreparePythonPackage(const std::string& module, const std::string& source) {
  namespace fs = std::filesystem;
  const std::string tmp = std::getenv("TEST_TMPDIR");
  const std::string src = tmp + "/src";
  if (!fs::exists(src + "/python/rlfleet/v1/reward_pb2.py")) {
    fs::create_directories(src + "/proto/rlfleet");
    fs::copy(RunfilePath("python"), src + "/python", fs::copy_options::recursive);
    fs::copy(RunfilePath("proto/rlfleet/v1"), src + "/proto/rlfleet/v1", fs::copy_options::recursive);
    std::vector<std::string> argv = {"/usr/bin/protoc", "-I" + src + "/proto", "--python_out=" + src + "/python",
                                     "--grpc_python_out=" + src + "/python",
                                     "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin"};
    for (const char* p : {"common", "controller", "rollout", "reward", "buffer", "trainer", "weights"}) {
      argv.push_back(absl::StrCat(src, "/proto/rlfleet/v1/", p, ".proto"));
    }
    Exited made = RunToExit(argv);
    EXPECT_EQ(made.code, 0) << made.output;
  }
  std::ofstream(src + "/python/" + module + ".py") << source;
  return src + "/python";
}

}  // namespace rlfleet::testing
