#include "libs/model/tokenizer.h"

#include <array>

#include "absl/strings/str_cat.h"

namespace rlfleet::model {
namespace {

// 4..6: task tokens; 7: '+'; 8: '-'; 9..18: '0'..'9'; 19..31 unused.
constexpr std::array<const char*, 3> kTasks = {"reverse", "sort", "add"};
constexpr int32_t kFirstTask = 4;
constexpr int32_t kPlus = 7;
constexpr int32_t kMinus = 8;
constexpr int32_t kZero = 9;

int32_t CharId(char c) {
  if (c >= '0' && c <= '9') return kZero + (c - '0');
  if (c == '+') return kPlus;
  if (c == '-') return kMinus;
  return -1;
}

char IdChar(int32_t id) {
  if (id >= kZero && id < kZero + 10) return static_cast<char>('0' + id - kZero);
  if (id == kPlus) return '+';
  if (id == kMinus) return '-';
  return '?';
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodePrompt(absl::string_view prompt) {
  const size_t colon = prompt.find(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError("prompt must be `<task>:<input>`");
  }
  const absl::string_view task = prompt.substr(0, colon);
  int32_t task_id = -1;
  for (size_t i = 0; i < kTasks.size(); ++i) {
    if (task == kTasks[i]) task_id = kFirstTask + static_cast<int32_t>(i);
  }
  if (task_id < 0) return absl::InvalidArgumentError(absl::StrCat("unknown task `", task, "`"));
  std::vector<int32_t> ids = {kBos, task_id};
  for (size_t i = colon + 1; i < prompt.size(); ++i) {
    const int32_t id = CharId(prompt[i]);
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt character `", std::string(1, prompt[i]), "` at byte ", i, " has no token"));
    }
    ids.push_back(id);
  }
  ids.push_back(kSep);
  return ids;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeResponse(absl::string_view text) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < text.size(); ++i) {
    const int32_t id = CharId(text[i]);
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("response character `", std::string(1, text[i]), "` at byte ", i, " has no token"));
    }
    ids.push_back(id);
  }
  ids.push_back(kEos);
  return ids;
}

std::string Tokenizer::DecodeResponse(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) {
    if (id == kEos) break;
    if (id == kPad) continue;
    out.push_back(IdChar(id));
  }
  return out;
}

std::string Tokenizer::DecodePrompt(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) {
    if (id >= kFirstTask && id < kFirstTask + static_cast<int32_t>(kTasks.size())) {
      out += absl::StrCat(kTasks[id - kFirstTask], ":");
    } else if (id != kBos && id != kSep && id != kPad && id != kEos) {
      out.push_back(IdChar(id));
    }
  }
  return out;
}

}  // namespace rlfleet::model
