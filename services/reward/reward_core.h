// RewardCore: scores responses without gRPC. Reward functions are registered by name
// (users add their own with Register); the built-in ones check the built-in tasks
// (libs/tasks):
//   <task>_exact            1 if the response equals the answer, else 0
//   <task>_partial_credit   the task's default: 1 for an exact answer, else 0.8 x the
//                           fraction of positions right (over the longer of answer and
//                           response), minus 0.1 (format penalty, parsed = false) for a
//                           response not in the answer's form
// Thread-safe: Register may race with Score.
#ifndef RLFLEET_SERVICES_REWARD_REWARD_CORE_H_
#define RLFLEET_SERVICES_REWARD_REWARD_CORE_H_

#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "rlfleet/v1/reward.pb.h"

namespace rlfleet::reward {

inline constexpr int kMaxItemsPerRequest = 1024;
inline constexpr size_t kMaxTextBytes = 64 << 10;
inline constexpr int kMaxMetadataEntries = 32;  // ScoreItem.metadata

// Scores one item into `result` (reward, components, parsed). Returns INVALID_ARGUMENT
// for an item it cannot score (e.g. a prompt of another task).
using RewardFn = std::function<absl::Status(const v1::ScoreItem& item, v1::ScoreResult* result)>;

class RewardCore {
 public:
  RewardCore();  // registers the built-in functions

  // Adds a function. ALREADY_EXISTS if the name is taken; INVALID_ARGUMENT for an
  // empty name.
  absl::Status Register(v1::RewardFunctionInfo info, RewardFn fn, bool default_for_tasks = false);

  // Scores every item; results in request order. INVALID_ARGUMENT naming the item
  // (items[i]) and the reason for an empty or oversized batch, an unknown task or
  // function, a missing or oversized text, or a prompt of the wrong form.
  absl::Status Score(const v1::ScoreRequest& request, v1::ScoreResponse* response);

  absl::Status List(const v1::ListRewardFunctionsRequest& request, v1::ListRewardFunctionsResponse* response);

 private:
  struct Entry {
    v1::RewardFunctionInfo info;
    RewardFn fn;
  };
  // Checks items[index] and finds the function that scores it (its name, its function),
  // or INVALID_ARGUMENT / UNIMPLEMENTED naming the item.
  absl::Status ResolveLocked(const v1::ScoreItem& item, int index, std::string* name, RewardFn* fn)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<std::string, Entry> functions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> default_for_task_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlfleet::reward

#endif  // RLFLEET_SERVICES_REWARD_REWARD_CORE_H_
