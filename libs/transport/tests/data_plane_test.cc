// The data plane from flags: the fleet secret wraps UCX in the authenticated decorator;
// a bad secret file, or devices UCX refuses, are errors at start rather than a silent
// fallback to an open data plane.
#include "libs/transport/data_plane.h"

#include <fstream>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(std::string, data_plane_secret_file);
ABSL_DECLARE_FLAG(std::string, data_plane_devices);

namespace rlfleet::transport {
namespace {

std::string WriteFile(const std::string& name, const std::string& content) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << content;
  return path;
}

class DataPlaneFlagsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    absl::SetFlag(&FLAGS_data_plane_secret_file, "");
    absl::SetFlag(&FLAGS_data_plane_devices, "");
  }
};

TEST_F(DataPlaneFlagsTest, ASecretFileSignsTheDataPlane) {
  absl::SetFlag(&FLAGS_data_plane_secret_file, WriteFile("secret", "0123456789abcdef0123\n"));
  auto t = OpenDataPlaneFromFlags("127.0.0.1", "test", "none");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(*t, nullptr);
  EXPECT_EQ((*t)->GetCapabilities().backend, "authenticated(ucx)");
  EXPECT_EQ(BaseBackend((*t)->GetCapabilities()), "ucx");
}

TEST_F(DataPlaneFlagsTest, WithoutASecretTheDataPlaneIsPlainUcx) {
  auto t = OpenDataPlaneFromFlags("127.0.0.1", "test", "none");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(*t, nullptr);
  EXPECT_EQ((*t)->GetCapabilities().backend, "ucx");
}

TEST_F(DataPlaneFlagsTest, ABadSecretFileIsAnError) {
  absl::SetFlag(&FLAGS_data_plane_secret_file, WriteFile("short", "tooshort"));
  auto t = OpenDataPlaneFromFlags("127.0.0.1", "test", "none");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_TRUE(absl::StrContains(t.status().message(), "at least 16")) << t.status();
  absl::SetFlag(&FLAGS_data_plane_secret_file, "/dev/zero");
  EXPECT_FALSE(OpenDataPlaneFromFlags("127.0.0.1", "test", "none").ok());
  absl::SetFlag(&FLAGS_data_plane_secret_file, "/nonexistent/secret");
  EXPECT_EQ(OpenDataPlaneFromFlags("127.0.0.1", "test", "none").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DataPlaneFlagsTest, DevicesUcxCannotUseAreAnError) {
  absl::SetFlag(&FLAGS_data_plane_devices, "no-such-device0");
  auto t = OpenDataPlaneFromFlags("127.0.0.1", "test", "none");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << "a data plane opened on a missing device";
  EXPECT_TRUE(absl::StrContains(t.status().message(), "no-such-device0")) << t.status();
  absl::SetFlag(&FLAGS_data_plane_devices, "lo");  // the loopback interface exists everywhere
  auto lo = OpenDataPlaneFromFlags("0.0.0.0", "test", "none");
  ASSERT_TRUE(lo.ok()) << lo.status();
  ASSERT_NE(*lo, nullptr);
  EXPECT_TRUE(absl::StrContains((*lo)->GetCapabilities().detail, "lo")) << (*lo)->GetCapabilities().detail;
}

}  // namespace
}  // namespace rlfleet::transport
