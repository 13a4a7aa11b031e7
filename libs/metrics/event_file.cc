#include "libs/metrics/event_file.h"

#include <unistd.h>

#include <array>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace rlfleet::metrics {
namespace {

std::array<uint32_t, 256> Crc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // (reflected Castagnoli)
    table[i] = c;
  }
  return table;
}

// Protobuf's wire format, the pieces an Event needs.
void Varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void Tag(int field, int wire_type, std::string* out) { Varint(static_cast<uint64_t>(field) << 3 | wire_type, out); }
template <typename T>
void Fixed(T v, std::string* out) {  // (little-endian: x86 and ARM Linux)
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out->append(bytes, sizeof(T));
}
void Bytes(int field, absl::string_view value, std::string* out) {
  Tag(field, 2, out);
  Varint(value.size(), out);
  out->append(value.data(), value.size());
}

// Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5.
std::string EventHead(absl::Time now) {
  std::string event;
  Tag(1, 1, &event);
  Fixed(absl::ToDoubleSeconds(now - absl::UnixEpoch()), &event);
  return event;
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  static const std::array<uint32_t, 256> table = Crc32cTable();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t c = Crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

absl::Status EventFileWriter::Open(const std::string& dir, absl::Time now) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  path_ = absl::StrCat(dir, "/events.out.tfevents.", absl::ToUnixSeconds(now), ".", host);
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (ec || !out_) return absl::InternalError(absl::StrCat("cannot write ", path_));
  std::string event = EventHead(now);
  Bytes(3, "brain.Event:2", &event);
  return WriteRecord(event);
}

absl::Status EventFileWriter::AddScalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                                         absl::Time now) {
  // Summary: value = 1 (repeated); Summary.Value: tag = 1, simple_value = 2 (float).
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    Bytes(1, tag, &v);
    Tag(2, 5, &v);
    Fixed(static_cast<float>(value), &v);
    Bytes(1, v, &summary);
  }
  std::string event = EventHead(now);
  Tag(2, 0, &event);
  Varint(static_cast<uint64_t>(step), &event);
  Bytes(5, summary, &event);
  return WriteRecord(event);
}

absl::Status EventFileWriter::WriteRecord(const std::string& event) {
  std::string header;
  Fixed(static_cast<uint64_t>(event.size()), &header);
  std::string record = header;
  Fixed(MaskedCrc32c(header), &record);
  record += event;
  Fixed(MaskedCrc32c(event), &record);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  out_.flush();
  if (!out_) return absl::InternalError(absl::StrCat("cannot write ", path_));
  return absl::OkStatus();
}

}  // namespace rlfleet::metrics
