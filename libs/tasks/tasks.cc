#include "libs/tasks/tasks.h"

#include <algorithm>
#include <cstdint>

#include "absl/random/distributions.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace rlfleet::tasks {
namespace {

constexpr size_t kMaxInputBytes = 4096;

bool AllDigits(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isdigit(c); });
}

std::string Digits(absl::BitGenRef gen, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>('0' + absl::Uniform(gen, 0, 10)));
  return s;
}

int Length(absl::BitGenRef gen, const TaskOptions& o) {
  return absl::Uniform(absl::IntervalClosed, gen, std::max(1, o.min_len), std::max(o.min_len, o.max_len));
}

// Strips "<task>:" and checks the input's size.
absl::StatusOr<absl::string_view> Input(absl::string_view task, absl::string_view prompt) {
  if (!absl::ConsumePrefix(&prompt, task) || !absl::ConsumePrefix(&prompt, ":")) {
    return absl::InvalidArgumentError(absl::StrCat("prompt does not start with `", task, ":`"));
  }
  if (prompt.size() > kMaxInputBytes) {
    return absl::InvalidArgumentError(absl::StrCat("prompt input is longer than ", kMaxInputBytes, " bytes"));
  }
  return prompt;
}

class DigitStringTask : public Task {
 public:
  bool WellFormed(absl::string_view response) const override { return AllDigits(response); }
  Example Make(absl::BitGenRef gen, const TaskOptions& options) const override {
    std::string input = Digits(gen, Length(gen, options));
    std::string prompt = absl::StrCat(name(), ":", input);
    return {prompt, *Solve(prompt)};
  }
  absl::StatusOr<std::string> Solve(absl::string_view prompt) const override {
    auto input = Input(name(), prompt);
    if (!input.ok()) return input.status();
    if (!AllDigits(*input)) return absl::InvalidArgumentError("prompt input must be digits");
    return Transform(std::string(*input));
  }

 protected:
  virtual std::string Transform(std::string digits) const = 0;
};

class ReverseTask : public DigitStringTask {
 public:
  std::string name() const override { return "reverse"; }
  std::string description() const override { return "reverse a string of digits"; }

 protected:
  std::string Transform(std::string d) const override {
    std::reverse(d.begin(), d.end());
    return d;
  }
};

class SortTask : public DigitStringTask {
 public:
  std::string name() const override { return "sort"; }
  std::string description() const override { return "sort a string of digits ascending"; }

 protected:
  std::string Transform(std::string d) const override {
    std::sort(d.begin(), d.end());
    return d;
  }
};

class AddTask : public Task {
 public:
  std::string name() const override { return "add"; }
  std::string description() const override { return "add two non-negative integers"; }
  bool WellFormed(absl::string_view r) const override {
    absl::ConsumePrefix(&r, "-");
    return AllDigits(r);
  }
  Example Make(absl::BitGenRef gen, const TaskOptions& options) const override {
    const int n = std::min(Length(gen, options), 18);
    std::string a = Digits(gen, n), b = Digits(gen, n);
    std::string prompt = absl::StrCat(name(), ":", Canon(a), "+", Canon(b));
    return {prompt, *Solve(prompt)};
  }
  absl::StatusOr<std::string> Solve(absl::string_view prompt) const override {
    auto input = Input(name(), prompt);
    if (!input.ok()) return input.status();
    std::vector<absl::string_view> parts = absl::StrSplit(*input, '+');
    uint64_t a = 0, b = 0;
    if (parts.size() != 2 || !AllDigits(parts[0]) || !AllDigits(parts[1]) || parts[0].size() > 18 ||
        parts[1].size() > 18 || !absl::SimpleAtoi(parts[0], &a) || !absl::SimpleAtoi(parts[1], &b)) {
      return absl::InvalidArgumentError("add prompt must be `add:<digits>+<digits>` (at most 18 digits each)");
    }
    return absl::StrCat(a + b);
  }

 private:
  static std::string Canon(const std::string& digits) {
    uint64_t v = 0;
    (void)absl::SimpleAtoi(digits, &v);
    return absl::StrCat(v);
  }
};

// "mul:<a>*<b>": a of min_len..max_len digits, b one digit 2..9. The policy may call
// the calculator: "[<a>*<b>]" is answered "(<product>)" by the environment.
class MulTask : public Task {
 public:
  std::string name() const override { return "mul"; }
  std::string description() const override {
    return "multiply a number by a digit, with a calculator tool: [a*b] is answered (product)";
  }
  bool UsesCalculator() const override { return true; }
  bool WellFormed(absl::string_view r) const override {
    // Tool calls and results, then the answer's digits.
    for (;;) {
      if (!absl::ConsumePrefix(&r, "[")) break;
      const size_t close = r.find("](");
      const size_t end = close == absl::string_view::npos ? close : r.find(')', close);
      if (end == absl::string_view::npos) return false;
      r.remove_prefix(end + 1);
    }
    return AllDigits(r);
  }
  std::string FinalAnswer(absl::string_view response) const override {
    const size_t last = response.rfind(')');
    return std::string(last == absl::string_view::npos ? response : response.substr(last + 1));
  }
  Example Make(absl::BitGenRef gen, const TaskOptions& options) const override {
    const int n = std::min(Length(gen, options), 17);
    std::string a = Digits(gen, n);
    a[0] = static_cast<char>('1' + absl::Uniform(gen, 0, 9));
    const int b = absl::Uniform(absl::IntervalClosed, gen, 2, 9);
    std::string prompt = absl::StrCat(name(), ":", a, "*", b);
    return {prompt, *Solve(prompt)};
  }
  absl::StatusOr<std::string> Solve(absl::string_view prompt) const override {
    auto input = Input(name(), prompt);
    if (!input.ok()) return input.status();
    std::optional<std::string> value = absl::StrContains(*input, '*') ? Calculate(*input) : std::nullopt;
    if (!value.has_value()) {
      return absl::InvalidArgumentError("mul prompt must be `mul:<digits>*<digits>` (a product of at most 18 digits)");
    }
    return *value;
  }
  absl::StatusOr<std::string> Demonstration(absl::string_view prompt) const override {
    absl::StatusOr<std::string> product = Solve(prompt);
    if (!product.ok()) return product.status();
    return absl::StrCat("[", prompt.substr(prompt.find(':') + 1), "](", *product, ")", *product);
  }
};

}  // namespace

std::optional<std::string> Calculate(absl::string_view expression) {
  const size_t op = expression.find_first_of("+-*");
  if (op == absl::string_view::npos) return std::nullopt;
  const absl::string_view a = expression.substr(0, op), b = expression.substr(op + 1);
  uint64_t x = 0, y = 0;
  if (!AllDigits(a) || !AllDigits(b) || a.size() > 18 || b.size() > 18 || !absl::SimpleAtoi(a, &x) ||
      !absl::SimpleAtoi(b, &y)) {
    return std::nullopt;
  }
  constexpr uint64_t kMax = 999'999'999'999'999'999ull;
  switch (expression[op]) {
    case '+':
      return x + y <= kMax ? std::optional(absl::StrCat(x + y)) : std::nullopt;
    case '-':
      return x >= y ? absl::StrCat(x - y) : absl::StrCat("-", y - x);
    default:
      if (x != 0 && y > kMax / x) return std::nullopt;
      return absl::StrCat(x * y);
  }
}

const Task* FindTask(absl::string_view name) {
  static const ReverseTask* reverse = new ReverseTask();
  static const SortTask* sort = new SortTask();
  static const AddTask* add = new AddTask();
  if (name == "reverse") return reverse;
  if (name == "sort") return sort;
  static const MulTask* mul = new MulTask();
  if (name == "add") return add;
  if (name == "mul") return mul;
  return nullptr;
}

std::vector<std::string> TaskNames() { return {"add", "mul", "reverse", "sort"}; }

}  // namespace rlfleet::tasks
