// TensorBoard event files: the records' framing and CRCs as TFRecord defines them, and
// each event decoded by protobuf itself against TensorBoard's field numbers (a
// descriptor built here from event.proto / summary.proto's declarations).
#include "libs/metrics/event_file.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/text_format.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace rlfleet::metrics {
namespace {

namespace pb = google::protobuf;

// tensorboard/compat/proto/event.proto and summary.proto, the fields written.
constexpr char kEventProto[] = R"pb(
  name: "event.proto"
  package: "tensorboard"
  syntax: "proto3"
  message_type {
    name: "Event"
    field { name: "wall_time" number: 1 label: LABEL_OPTIONAL type: TYPE_DOUBLE }
    field { name: "step" number: 2 label: LABEL_OPTIONAL type: TYPE_INT64 }
    field { name: "file_version" number: 3 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "summary" number: 5 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".tensorboard.Summary" }
  }
  message_type {
    name: "Summary"
    field { name: "value" number: 1 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".tensorboard.Summary.Value" }
    nested_type {
      name: "Value"
      field { name: "node_name" number: 7 label: LABEL_OPTIONAL type: TYPE_STRING }
      field { name: "tag" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
      field { name: "simple_value" number: 2 label: LABEL_OPTIONAL type: TYPE_FLOAT }
    }
  }
)pb";

// The records of a TFRecord file, each checked against its two CRCs.
std::vector<std::string> Records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  std::vector<std::string> records;
  size_t at = 0;
  while (at < data.size()) {
    EXPECT_LE(at + 12, data.size());
    uint64_t length = 0;
    uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length, data.data() + at, 8);
    std::memcpy(&length_crc, data.data() + at + 8, 4);
    EXPECT_EQ(length_crc, MaskedCrc32c(absl::string_view(data.data() + at, 8)));
    EXPECT_LE(at + 12 + length + 4, data.size());
    records.push_back(data.substr(at + 12, length));
    std::memcpy(&data_crc, data.data() + at + 12 + length, 4);
    EXPECT_EQ(data_crc, MaskedCrc32c(records.back()));
    at += 12 + length + 4;
  }
  return records;
}

TEST(EventFile, Crc32cIsCastagnolis) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // the standard check value
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(EventFile, ScalarsDecodeAsTensorBoardsEvents) {
  pb::FileDescriptorProto file;
  ASSERT_TRUE(pb::TextFormat::ParseFromString(kEventProto, &file));
  pb::DescriptorPool pool;
  ASSERT_NE(pool.BuildFile(file), nullptr);
  const pb::Descriptor* event_type = pool.FindMessageTypeByName("tensorboard.Event");
  pb::DynamicMessageFactory factory(&pool);

  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/run";
  EventFileWriter writer;
  const absl::Time t0 = absl::FromUnixSeconds(1764700000);
  ASSERT_TRUE(writer.Open(dir, t0).ok());
  EXPECT_TRUE(absl::StrContains(writer.path(), "/events.out.tfevents.1764700000.")) << writer.path();
  ASSERT_TRUE(writer.AddScalars(1, {{"loss", 0.25}, {"reward/train", -1.5}}, t0 + absl::Seconds(1)).ok());
  ASSERT_TRUE(writer.AddScalars(300, {{"loss", 0.125}}, t0 + absl::Seconds(2)).ok());

  const std::vector<std::string> records = Records(writer.path());
  ASSERT_EQ(records.size(), 3u);
  std::vector<std::unique_ptr<pb::Message>> events;
  for (const std::string& r : records) {
    events.emplace_back(factory.GetPrototype(event_type)->New());
    ASSERT_TRUE(events.back()->ParseFromString(r));
  }
  const pb::Reflection* refl = events[0]->GetReflection();
  auto field = [&](const pb::Message& m, const char* name) { return m.GetDescriptor()->FindFieldByName(name); };
  EXPECT_EQ(refl->GetString(*events[0], field(*events[0], "file_version")), "brain.Event:2");
  EXPECT_DOUBLE_EQ(refl->GetDouble(*events[0], field(*events[0], "wall_time")), 1764700000.0);
  EXPECT_EQ(refl->GetInt64(*events[1], field(*events[1], "step")), 1);
  EXPECT_EQ(refl->GetInt64(*events[2], field(*events[2], "step")), 300);
  EXPECT_DOUBLE_EQ(refl->GetDouble(*events[2], field(*events[2], "wall_time")), 1764700002.0);
  const pb::Message& summary = refl->GetMessage(*events[1], field(*events[1], "summary"));
  const pb::FieldDescriptor* values = field(summary, "value");
  ASSERT_EQ(summary.GetReflection()->FieldSize(summary, values), 2);
  const pb::Message& second = summary.GetReflection()->GetRepeatedMessage(summary, values, 1);
  EXPECT_EQ(second.GetReflection()->GetString(second, field(second, "tag")), "reward/train");
  EXPECT_FLOAT_EQ(second.GetReflection()->GetFloat(second, field(second, "simple_value")), -1.5f);
}

TEST(EventFile, AnUnwritableDirectoryIsAnErrorNamingIt) {
  EventFileWriter writer;
  absl::Status s = writer.Open("/proc/no-such-dir/run");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(s.message(), "/proc/no-such-dir/run")) << s;
}

}  // namespace
}  // namespace rlfleet::metrics
