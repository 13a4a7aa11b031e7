// DeviceImage (policy.h) between two processes on one GPU: this binary exports, and runs
// itself with --install to map and install the image (CUDA IPC works only between
// processes). Needs a CUDA device and a CUDA build of the model backend: tagged `gpu`
// (tools/device/run_gpu_tests.sh runs it on the GPU machine).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "libs/common/checksum.h"
#include "libs/model/policy.h"
#include "libs/model/safetensors.h"
#include "libs/model/test_util.h"
#include "tests/util/subprocess.h"

namespace rlfleet::model {
namespace {

PolicyConfig Config(const std::string& arch, const std::string& dtype) {
  PolicyConfig c = WithArch(TinyConfig(), arch);
  c.dtype = dtype;
  return c;
}

// The child: installs the image given on the command line into a fresh policy (another
// seed) and prints "installed <XXH64 of its safetensors image>" or "error <status>".
//   --install ARCH DTYPE VERIFY HANDLE_HEX PCI LENGTH DIGEST LAYOUT VERSION
int InstallChild(int argc, char** argv) {
  if (argc != 11) return 2;
  DeviceImage::Ref ref;
  ref.ipc_handle = absl::HexStringToBytes(argv[5]);
  ref.pci_bus_id = argv[6];
  if (!absl::SimpleAtoi(argv[7], &ref.length_bytes) || !absl::SimpleAtoi(argv[8], &ref.digest) ||
      !absl::SimpleAtoi(argv[9], &ref.layout) || !absl::SimpleAtoi(argv[10], &ref.version)) {
    return 2;
  }
  auto policy = Policy::Create(Config(argv[2], argv[3]), TestDevice(), /*init_seed=*/99);
  if (!policy.ok()) {
    std::printf("error %s\n", policy.status().ToString().c_str());
    return 3;
  }
  DeviceInstallReport report;
  const absl::Status installed = (*policy)->InstallDeviceImage(ref, std::string(argv[4]) == "1", &report);
  if (!installed.ok()) {
    std::printf("error %s\n", installed.ToString().c_str());
    return 3;
  }
  std::printf("installed %llu bytes %llu open_us %lld copy_us %lld verify_us %lld\n",
              static_cast<unsigned long long>(common::Xxh64((*policy)->SafetensorsBytes())),
              static_cast<unsigned long long>(report.bytes), static_cast<long long>(report.open_us),
              static_cast<long long>(report.copy_us), static_cast<long long>(report.verify_us));
  return 0;
}

testing::Exited Install(const DeviceImage::Ref& ref, const std::string& arch, const std::string& dtype,
                        bool verify = true) {
  return testing::RunToExit({"/proc/self/exe", "--install", arch, dtype, verify ? "1" : "0",
                             absl::BytesToHexString(ref.ipc_handle), ref.pci_bus_id, absl::StrCat(ref.length_bytes),
                             absl::StrCat(ref.digest), absl::StrCat(ref.layout), absl::StrCat(ref.version)},
                            absl::Seconds(120));
}

// The XXH64 of the image a policy of `dtype` holding `source`'s weights writes.
uint64_t ExpectedImage(Policy& source, const std::string& arch, const std::string& dtype) {
  auto twin = Policy::Create(Config(arch, dtype), TestDevice(), 5);
  EXPECT_TRUE(twin.ok());
  EXPECT_TRUE((*twin)->LoadSafetensorsBytes(source.SafetensorsBytes(), "source").ok());
  return common::Xxh64((*twin)->SafetensorsBytes());
}

class DeviceImageTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DeviceImageTest, AnotherProcessInstallsExactlyTheExportedWeights) {
  ASSERT_NE(TestDevice().rfind("cuda", 0), std::string::npos) << "set RLFLEET_TEST_DEVICE=cuda:N";
  auto policy = Policy::Create(Config(GetParam(), "fp32"), TestDevice(), 7);
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto image = (*policy)->ExportDeviceImage(3);
  ASSERT_TRUE(image.ok()) << image.status();
  const DeviceImage::Ref& ref = image->ref();
  EXPECT_EQ(ref.length_bytes, static_cast<uint64_t>((*policy)->num_parameters()) * 4);
  EXPECT_EQ(ref.layout, (*policy)->LayoutFingerprint());
  EXPECT_FALSE(ref.pci_bus_id.empty());
  // The GPU's digest is the host's BlockSumDigest of the same bytes: the parameters as
  // F32 in parameter order, back to back.
  const std::string bytes = (*policy)->SafetensorsBytes();
  auto tensors = ParseSafetensorsViews(bytes, "image");
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::string flat;
  for (const std::string& name : (*policy)->ParameterNames()) flat += std::string(tensors->at(name).bytes);
  EXPECT_EQ(flat.size(), ref.length_bytes);
  EXPECT_EQ(ref.digest, common::BlockSumDigest(flat));

  const testing::Exited fp32 = Install(ref, GetParam(), "fp32");
  EXPECT_EQ(fp32.code, 0) << fp32.output;
  EXPECT_NE(fp32.output.find(absl::StrCat("installed ", common::Xxh64(bytes), " bytes ", ref.length_bytes)),
            std::string::npos)
      << fp32.output;
  // A bf16 replica: cast on the way in, the source checked before the copy.
  const testing::Exited bf16 = Install(ref, GetParam(), "bf16");
  EXPECT_EQ(bf16.code, 0) << bf16.output;
  EXPECT_NE(bf16.output.find(absl::StrCat("installed ", ExpectedImage(**policy, GetParam(), "bf16"), " ")),
            std::string::npos)
      << bf16.output;
}

TEST_P(DeviceImageTest, ReexportingIntoTheSameImageKeepsItsHandleAndUpdatesItsDigest) {
  auto policy = Policy::Create(Config(GetParam(), "fp32"), TestDevice(), 7);
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto first = (*policy)->ExportDeviceImage(3);
  ASSERT_TRUE(first.ok()) << first.status();
  const DeviceImage::Ref before = first->ref();
  auto other = Policy::Create(Config(GetParam(), "fp32"), TestDevice(), 8);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*policy)->LoadSafetensorsBytes((*other)->SafetensorsBytes(), "other").ok());
  auto second = (*policy)->ExportDeviceImage(4, std::move(*first));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->ref().ipc_handle, before.ipc_handle);
  EXPECT_NE(second->ref().digest, before.digest);
  EXPECT_EQ(second->ref().version, 4u);
  const testing::Exited installed = Install(second->ref(), GetParam(), "fp32");
  EXPECT_NE(installed.output.find(absl::StrCat("installed ", common::Xxh64((*other)->SafetensorsBytes()), " ")),
            std::string::npos)
      << installed.output;
}

TEST_P(DeviceImageTest, BadImagesAreRefusedNamingTheProblem) {
  auto policy = Policy::Create(Config(GetParam(), "fp32"), TestDevice(), 7);
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto image = (*policy)->ExportDeviceImage(3);
  ASSERT_TRUE(image.ok()) << image.status();
  DeviceImage::Ref ref = image->ref();

  DeviceImage::Ref wrong_digest = ref;
  ++wrong_digest.digest;
  const testing::Exited tampered = Install(wrong_digest, GetParam(), "fp32");
  EXPECT_NE(tampered.code, 0);
  EXPECT_NE(tampered.output.find("DATA_LOSS"), std::string::npos) << tampered.output;
  EXPECT_NE(tampered.output.find("digest does not match"), std::string::npos) << tampered.output;
  // (without verify the same image installs: the digest is the only check skipped)
  EXPECT_EQ(Install(wrong_digest, GetParam(), "fp32", /*verify=*/false).code, 0);
  const testing::Exited tampered16 = Install(wrong_digest, GetParam(), "bf16");
  EXPECT_NE(tampered16.output.find("DATA_LOSS"), std::string::npos) << tampered16.output;

  // Another model shape: refused before anything is mapped.
  const testing::Exited other_shape = Install(ref, GetParam() == "gpt" ? "qwen2" : "gpt", "fp32");
  EXPECT_NE(other_shape.output.find("INVALID_ARGUMENT"), std::string::npos) << other_shape.output;
  EXPECT_NE(other_shape.output.find("layout"), std::string::npos) << other_shape.output;

  // Another version than the image holds (its stamp): UNAVAILABLE before the copy.
  DeviceImage::Ref other_version = ref;
  other_version.version = ref.version + 1;
  const testing::Exited stale = Install(other_version, GetParam(), "fp32");
  EXPECT_NE(stale.output.find("UNAVAILABLE"), std::string::npos) << stale.output;
  EXPECT_NE(stale.output.find(absl::StrCat("holds version ", ref.version)), std::string::npos) << stale.output;

  DeviceImage::Ref short_handle = ref;
  short_handle.ipc_handle.resize(10);
  const testing::Exited bad_handle = Install(short_handle, GetParam(), "fp32");
  EXPECT_NE(bad_handle.output.find("ipc_handle has 10 bytes"), std::string::npos) << bad_handle.output;

  // The exporter freed it: UNAVAILABLE, not a crash.
  *image = DeviceImage();
  const testing::Exited freed = Install(ref, GetParam(), "fp32");
  EXPECT_NE(freed.code, 0);
  EXPECT_NE(freed.output.find("UNAVAILABLE"), std::string::npos) << freed.output;
}

INSTANTIATE_TEST_SUITE_P(Archs, DeviceImageTest, ::testing::Values("gpt", "qwen2"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace rlfleet::model

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--install") return rlfleet::model::InstallChild(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
