#include "libs/model/tokenizer.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"

namespace rlfleet::model {
namespace {

// 4..6 and 20: task tokens; 7: '+'; 8: '-'; 9..18: '0'..'9'; 19: '*'; 21..24: the
// calculator's brackets '[' ']' '(' ')'; 25..31 unused.
struct TaskToken {
  const char* name;
  int32_t id;
};
constexpr std::array<TaskToken, 4> kTasks = {{{"reverse", 4}, {"sort", 5}, {"add", 6}, {"mul", 20}}};
constexpr int32_t kPlus = 7;
constexpr int32_t kMinus = 8;
constexpr int32_t kZero = 9;
constexpr int32_t kTimes = 19;
// Characters of the other single-character tokens, by id.
constexpr std::array<std::pair<int32_t, char>, 7> kSymbols = {{{kPlus, '+'},
                                                               {kMinus, '-'},
                                                               {kTimes, '*'},
                                                               {Tokenizer::kCall, '['},
                                                               {Tokenizer::kEndCall, ']'},
                                                               {Tokenizer::kResult, '('},
                                                               {Tokenizer::kEndResult, ')'}}};

int32_t CharId(char c) {
  if (c >= '0' && c <= '9') return kZero + (c - '0');
  for (const auto& [id, ch] : kSymbols) {
    if (ch == c) return id;
  }
  return -1;
}

char IdChar(int32_t id) {
  if (id >= kZero && id < kZero + 10) return static_cast<char>('0' + id - kZero);
  for (const auto& [symbol, ch] : kSymbols) {
    if (symbol == id) return ch;
  }
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
  for (const TaskToken& t : kTasks) {
    if (task == t.name) task_id = t.id;
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
    const auto task = std::find_if(kTasks.begin(), kTasks.end(), [id](const TaskToken& t) { return t.id == id; });
    if (task != kTasks.end()) {
      out += absl::StrCat(task->name, ":");
    } else if (id != kBos && id != kSep && id != kPad && id != kEos) {
      out.push_back(IdChar(id));
    }
  }
  return out;
}

}  // namespace rlfleet::model
