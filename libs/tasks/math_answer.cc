#include "libs/tasks/math_answer.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace rlfleet::tasks {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// The content of the brace group opening at text[open] ('{'), or nullopt if unclosed.
std::optional<absl::string_view> BraceGroup(absl::string_view text, size_t open) {
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) return text.substr(open + 1, i - open - 1);
  }
  return std::nullopt;
}

// Whether text[i] is ',' followed by exactly three digits (a thousands separator).
bool ThousandsComma(absl::string_view text, size_t i) {
  return i + 3 < text.size() && text[i] == ',' && IsDigit(text[i + 1]) && IsDigit(text[i + 2]) &&
         IsDigit(text[i + 3]) && (i + 4 >= text.size() || !IsDigit(text[i + 4]));
}

// The last number in `text`: [-]digits[,ddd]*[.digits] or [-].digits.
std::optional<std::string> LastNumber(absl::string_view text) {
  std::optional<std::string> last;
  size_t i = 0;
  while (i < text.size()) {
    const bool starts = IsDigit(text[i]) || (text[i] == '.' && i + 1 < text.size() && IsDigit(text[i + 1]));
    if (!starts) {
      ++i;
      continue;
    }
    const size_t b = i > 0 && text[i - 1] == '-' ? i - 1 : i;
    size_t e = i;
    while (e < text.size() && IsDigit(text[e])) ++e;
    while (e < text.size() && ThousandsComma(text, e)) e += 4;
    if (e + 1 < text.size() && text[e] == '.' && IsDigit(text[e + 1])) {
      ++e;
      while (e < text.size() && IsDigit(text[e])) ++e;
    }
    last = std::string(text.substr(b, e - b));
    i = e;
  }
  return last;
}

std::optional<double> ParseNumber(absl::string_view s) {
  std::string t = absl::StrReplaceAll(s, {{",", ""}});
  if (absl::EndsWith(t, "%")) t.pop_back();
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v)) return std::nullopt;
  // (strtod takes "inf", "nan", hex and exponents: only plain decimals are answers)
  for (char c : t) {
    if (!IsDigit(c) && c != '.' && c != '-' && c != '+') return std::nullopt;
  }
  return v;
}

}  // namespace

std::optional<MathAnswer> ExtractMathAnswer(absl::string_view response) {
  for (absl::string_view box : {"\\boxed", "\\fbox"}) {
    const size_t at = response.rfind(box);
    if (at == absl::string_view::npos) continue;
    size_t open = at + box.size();
    while (open < response.size() && response[open] == ' ') ++open;
    if (open < response.size() && response[open] == '{') {
      if (auto group = BraceGroup(response, open)) {
        return MathAnswer{std::string(absl::StripAsciiWhitespace(*group)), "boxed"};
      }
    }
  }
  if (const size_t at = response.rfind("####"); at != absl::string_view::npos) {
    absl::string_view rest = response.substr(at + 4);
    rest = rest.substr(0, rest.find('\n'));
    rest = absl::StripAsciiWhitespace(rest);
    if (!rest.empty()) return MathAnswer{std::string(rest), "gsm8k"};
  }
  if (auto number = LastNumber(response)) return MathAnswer{*number, "last_number"};
  return std::nullopt;
}

std::string NormalizeMathAnswer(absl::string_view answer) {
  std::string s(answer);
  // \text{...} unwrapped (units and words inside a box).
  for (size_t at; (at = s.find("\\text{")) != std::string::npos;) {
    auto group = BraceGroup(s, at + 5);
    if (!group) break;
    s = s.substr(0, at) + std::string(*group) + s.substr(at + 5 + group->size() + 2);
  }
  s = absl::StrReplaceAll(s, {{"\\dfrac", "\\frac"},
                              {"\\tfrac", "\\frac"},
                              {"\\left", ""},
                              {"\\right", ""},
                              {"\\!", ""},
                              {"\\,", ""},
                              {"\\ ", ""},
                              {"$", ""},
                              {" ", ""}});
  while (!s.empty() && s.back() == '.') s.pop_back();
  // Thousands commas: a comma between a digit and exactly three digits.
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool thousands = i > 0 && IsDigit(s[i - 1]) && ThousandsComma(s, i);
    if (!thousands) out.push_back(s[i]);
  }
  return out;
}

std::optional<double> MathAnswerValue(absl::string_view answer) {
  const std::string s = NormalizeMathAnswer(answer);
  if (absl::StartsWith(s, "\\frac{") || absl::StartsWith(s, "-\\frac{")) {
    const bool negative = s[0] == '-';
    const size_t open = s.find('{');
    auto num = BraceGroup(s, open);
    if (!num) return std::nullopt;
    const size_t open2 = open + num->size() + 2;
    if (open2 >= s.size() || s[open2] != '{') return std::nullopt;
    auto den = BraceGroup(s, open2);
    if (!den || open2 + den->size() + 2 != s.size()) return std::nullopt;
    auto a = ParseNumber(*num), b = ParseNumber(*den);
    if (!a || !b || *b == 0) return std::nullopt;
    return (negative ? -1 : 1) * *a / *b;
  }
  if (const size_t slash = s.find('/'); slash != std::string::npos) {
    auto a = ParseNumber(s.substr(0, slash)), b = ParseNumber(s.substr(slash + 1));
    if (!a || !b || *b == 0) return std::nullopt;
    return *a / *b;
  }
  return ParseNumber(s);
}

bool MathAnswersMatch(absl::string_view got, absl::string_view want, double rel_tol, double abs_tol) {
  if (NormalizeMathAnswer(got) == NormalizeMathAnswer(want)) return true;
  auto a = MathAnswerValue(got), b = MathAnswerValue(want);
  return a && b && std::fabs(*a - *b) <= abs_tol + rel_tol * std::fabs(*b);
}

}  // namespace rlfleet::tasks
