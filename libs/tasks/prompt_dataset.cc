#include "libs/tasks/prompt_dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "libs/common/json_depth.h"
#include "libs/common/status_macros.h"

namespace rlfleet::tasks {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxJsonlBytes = uint64_t{4} << 30;

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

namespace {

// One line's record: nullopt for a blank line; INVALID_ARGUMENT naming the line.
absl::StatusOr<std::optional<PromptRecord>> ParseLine(absl::string_view line, int64_t line_no, const std::string& name,
                                                      const PromptFields& fields) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(name, ":", line_no, ": ", what));
  };
  if (line.size() > kMaxPromptRecordBytes) {
    return bad(absl::StrCat("a record of ", line.size(), " bytes, more than the limit of ", kMaxPromptRecordBytes));
  }
  line = absl::StripAsciiWhitespace(line);
  if (line.empty()) return std::nullopt;
  if (absl::Status deep = common::CheckJsonDepth(line, "the record", kMaxPromptRecordDepth); !deep.ok()) {
    return bad(std::string(deep.message()));
  }
  Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("not a JSON value");
  if (!j.is_object()) return bad("not a JSON object");
  PromptRecord r;
  r.line = line_no;
  if (j.contains(fields.prompt)) {
    if (!j[fields.prompt].is_string()) return bad(absl::StrCat("`", fields.prompt, "` is not a string"));
    r.prompt = j[fields.prompt].get<std::string>();
  } else if (j.contains(fields.messages)) {
    const Json& m = j[fields.messages];
    if (!m.is_array() || m.empty()) return bad(absl::StrCat("`", fields.messages, "` is not a non-empty array"));
    for (const Json& message : m) {
      if (!message.is_object() || !message.contains("role") || !message["role"].is_string() ||
          !message.contains("content") || !message["content"].is_string()) {
        return bad(absl::StrCat("`", fields.messages, "` holds ",
                                message.dump(-1, ' ', false, Json::error_handler_t::replace).substr(0, 80),
                                ", not a {\"role\": string, \"content\": string}"));
      }
      r.messages.push_back({message["role"].get<std::string>(), message["content"].get<std::string>()});
    }
  } else {
    return bad(absl::StrCat("has neither `", fields.prompt, "` nor `", fields.messages, "`"));
  }
  if (!fields.answer.empty()) {
    if (!j.contains(fields.answer)) return bad(absl::StrCat("has no `", fields.answer, "`"));
    const Json& a = j[fields.answer];
    if (a.is_string()) {
      r.answer = a.get<std::string>();
    } else if (a.is_number_integer()) {
      r.answer = a.is_number_unsigned() ? std::to_string(a.get<uint64_t>()) : std::to_string(a.get<int64_t>());
    } else if (a.is_number()) {
      r.answer = a.dump();
    } else {
      return bad(absl::StrCat("`", fields.answer, "` is not a string or a number"));
    }
  }
  return r;
}

}  // namespace

absl::StatusOr<std::vector<PromptRecord>> ParsePromptJsonl(absl::string_view text, const std::string& name,
                                                           const PromptFields& fields) {
  std::vector<PromptRecord> records;
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ASSIGN_OR_RETURN(std::optional<PromptRecord> r, ParseLine(line, ++line_no, name, fields));
    if (r.has_value()) records.push_back(*std::move(r));
  }
  if (records.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": no records"));
  return records;
}

absl::StatusOr<std::vector<PromptRecord>> ReadPromptJsonl(const std::string& path, const PromptFields& fields) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::NotFoundError(absl::StrCat("prompt file ", path, " is absent"));
  // (a FIFO or a device is refused before it is opened: reading it could block)
  if (!std::filesystem::is_regular_file(path, ec) || std::filesystem::file_size(path, ec) > kMaxJsonlBytes || ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt file ", path, " is not a regular file of at most ", kMaxJsonlBytes, " bytes"));
  }
  // Streamed a block at a time: the file is never in memory whole, and a line past the
  // record limit is refused as soon as it is, without reading the rest of it.
  std::ifstream in(path, std::ios::binary);
  std::vector<PromptRecord> records;
  std::string line, block(1 << 16, '\0');
  int64_t line_no = 0;
  bool too_long = false;
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const size_t got = static_cast<size_t>(in.gcount());
    for (size_t at = 0; at < got;) {
      const size_t end =
          std::min(got, static_cast<size_t>(std::find(block.begin() + at, block.begin() + got, '\n') - block.begin()));
      line.append(block, at, end - at);
      too_long = line.size() > kMaxPromptRecordBytes;
      if (too_long || end < got) {
        ASSIGN_OR_RETURN(std::optional<PromptRecord> r, ParseLine(line, ++line_no, path, fields));
        if (r.has_value()) records.push_back(*std::move(r));
        line.clear();
      }
      at = end + 1;
    }
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read prompt file ", path));
  ASSIGN_OR_RETURN(std::optional<PromptRecord> last, ParseLine(line, ++line_no, path, fields));
  if (last.has_value()) records.push_back(*std::move(last));
  if (records.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no records"));
  return records;
}

std::vector<size_t> ShuffledOrder(size_t n, uint64_t seed) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  uint64_t state = seed;
  for (size_t i = n; i > 1; --i) {
    const size_t j = SplitMix64(&state) % i;  // (modulo bias is negligible at these sizes)
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

PromptSplit SplitPrompts(std::vector<PromptRecord> records, uint64_t seed, size_t heldout) {
  {
    const std::vector<size_t> order = ShuffledOrder(records.size(), seed);
    std::vector<PromptRecord> shuffled;
    shuffled.reserve(records.size());
    for (size_t i : order) shuffled.push_back(std::move(records[i]));
    records = std::move(shuffled);
  }
  heldout = std::min(heldout, records.empty() ? 0 : records.size() - 1);
  PromptSplit split;
  split.heldout.assign(std::make_move_iterator(records.begin()),
                       std::make_move_iterator(records.begin() + static_cast<std::ptrdiff_t>(heldout)));
  split.train.assign(std::make_move_iterator(records.begin() + static_cast<std::ptrdiff_t>(heldout)),
                     std::make_move_iterator(records.end()));
  return split;
}

}  // namespace rlfleet::tasks
