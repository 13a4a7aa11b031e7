// Answers of math responses, for verifiable math rewards: the answer a response states
// (its last \boxed{...}, else what follows GSM8K's "####", else its last number), a
// normal form for exact comparison, its numeric value, and a match with a tolerance.
//
//   ExtractMathAnswer("so the total is \\boxed{1,234}.")->text == "1,234"
//   MathAnswersMatch("1,234", "1234") && MathAnswersMatch("\\frac{1}{2}", "0.5")
#ifndef RLFLEET_LIBS_TASKS_MATH_ANSWER_H_
#define RLFLEET_LIBS_TASKS_MATH_ANSWER_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace rlfleet::tasks {

struct MathAnswer {
  std::string text;  // as written (inside the box, after ####, or the number)
  std::string how;   // "boxed", "gsm8k" or "last_number"
};

// The answer `response` states, or nullopt when it states none: the content of its last
// \boxed{...} (nested braces kept; \fbox too), else the rest of the line after its last
// "####", else its last number (a sign, digits with thousands commas, a decimal part).
std::optional<MathAnswer> ExtractMathAnswer(absl::string_view response);

// `answer` in a normal form for exact comparison: spaces, `$`, `\!`, `\,`, `\left`,
// `\right`, a trailing period and thousands commas removed, `\dfrac` / `\tfrac` as
// `\frac`, `\text{...}` unwrapped.
std::string NormalizeMathAnswer(absl::string_view answer);

// The value of a numeric answer (an integer or decimal, thousands commas allowed, a
// percent sign ignored, a / b, \frac{a}{b}), or nullopt.
std::optional<double> MathAnswerValue(absl::string_view answer);

// Whether `got` answers `want`: equal normal forms, or both numeric and
// |got - want| <= abs_tol + rel_tol * |want|.
bool MathAnswersMatch(absl::string_view got, absl::string_view want, double rel_tol = 1e-6, double abs_tol = 1e-9);

}  // namespace rlfleet::tasks

#endif  // RLFLEET_LIBS_TASKS_MATH_ANSWER_H_
