// The built-in tasks with verifiable answers, shared by the controller (prompts),
// rollout (tokenisation) and reward (checking): reverse a digit string, sort a digit
// string, add two numbers, multiply two numbers (with a calculator tool: "mul:37*4",
// ideally answered "[37*4](148)148", the part in parentheses written by the tool). Each prompt is "<task>:<input>" and
// its answer a string.
//
//   auto task = FindTask("reverse");       // or nullptr
//   Example e = task->Make(gen);           // {"reverse:3141", "1413"}
//   task->Solve(e.prompt) == e.answer      // the checker needs no stored answer
#ifndef RLFLEET_LIBS_TASKS_TASKS_H_
#define RLFLEET_LIBS_TASKS_TASKS_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/random/bit_gen_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlfleet::tasks {

struct Example {
  std::string prompt;  // "<task>:<input>"
  std::string answer;
};

struct TaskOptions {
  int min_len = 3;  // digits in the input (each operand for "add")
  int max_len = 5;
};

// A task. Implementations are stateless and thread-safe.
class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  // A random example; lengths uniform in [min_len, max_len].
  virtual Example Make(absl::BitGenRef gen, const TaskOptions& options) const = 0;
  // The answer to `prompt`. INVALID_ARGUMENT naming what is wrong if it is not a
  // prompt of this task.
  virtual absl::StatusOr<std::string> Solve(absl::string_view prompt) const = 0;
  // Whether `response` has the answer's form (digits only; for "add" a leading '-').
  virtual bool WellFormed(absl::string_view response) const = 0;
  // The answer a response states: all of it, or for a task with a tool what follows
  // the last tool result ("[37*4](148)148" -> "148").
  virtual std::string FinalAnswer(absl::string_view response) const { return std::string(response); }
  // What a perfect policy writes for `prompt`, tool calls and results included (partial
  // credit compares a response with it). Errors as Solve.
  virtual absl::StatusOr<std::string> Demonstration(absl::string_view prompt) const { return Solve(prompt); }
  // Whether the policy may call the calculator (Calculate) in its response.
  virtual bool UsesCalculator() const { return false; }
};

// The calculator tool: the value of "<digits><op><digits>" (op one of + - *) as
// decimal digits, or nullopt for anything else (or a result past 18 digits).
std::optional<std::string> Calculate(absl::string_view expression);

// The built-in task called `name`, or nullptr. The returned pointer lives forever.
const Task* FindTask(absl::string_view name);
std::vector<std::string> TaskNames();

}  // namespace rlfleet::tasks

#endif  // RLFLEET_LIBS_TASKS_TASKS_H_
