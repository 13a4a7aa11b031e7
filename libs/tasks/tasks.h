// The built-in tasks with verifiable answers, shared by the controller (prompts),
// rollout (tokenisation) and reward (checking): reverse a digit string, sort a digit
// string, add two numbers. Each prompt is "<task>:<input>" and its answer a string.
//
//   auto task = FindTask("reverse");       // or nullptr
//   Example e = task->Make(gen);           // {"reverse:3141", "1413"}
//   task->Solve(e.prompt) == e.answer      // the checker needs no stored answer
#ifndef RLFLEET_LIBS_TASKS_TASKS_H_
#define RLFLEET_LIBS_TASKS_TASKS_H_

#include <memory>
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
};

// The built-in task called `name`, or nullptr. The returned pointer lives forever.
const Task* FindTask(absl::string_view name);
std::vector<std::string> TaskNames();

}  // namespace rlfleet::tasks

#endif  // RLFLEET_LIBS_TASKS_TASKS_H_
