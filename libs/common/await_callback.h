// A blocking call made of an asynchronous one: `start(done)` begins the work and calls
// `done(result)` exactly once, on any thread; AwaitCallback returns that result.
//
//   absl::StatusOr<Reply> CommandCombined(argv) {
//     return common::AwaitCallback<absl::StatusOr<Reply>>(
//         [&](auto done) { CommandAsync(argv, std::move(done)); });
//   }
//
// It has no deadline of its own: the asynchronous call must bound its wait (the Redis
// client's and the stores' timeouts do).
#ifndef RLFLEET_LIBS_COMMON_AWAIT_CALLBACK_H_
#define RLFLEET_LIBS_COMMON_AWAIT_CALLBACK_H_

#include <functional>
#include <utility>

#include "absl/synchronization/notification.h"

namespace rlfleet::common {

template <typename Result, typename Start>
Result AwaitCallback(Start&& start) {
  absl::Notification answered;
  Result result{};
  std::forward<Start>(start)(std::function<void(Result)>([&](Result r) {
    result = std::move(r);
    answered.Notify();
  }));
  answered.WaitForNotification();
  return result;
}

}  // namespace rlfleet::common

#endif  // RLFLEET_LIBS_COMMON_AWAIT_CALLBACK_H_
