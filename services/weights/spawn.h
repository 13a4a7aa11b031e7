// Starting a thread without std::terminate when the system has none to give: a
// std::system_error from std::thread becomes RESOURCE_EXHAUSTED. Thread-safe.
#ifndef RLFLEET_SERVICES_WEIGHTS_SPAWN_H_
#define RLFLEET_SERVICES_WEIGHTS_SPAWN_H_

#include <atomic>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace rlfleet::weights {

// Test hook: while true, Spawn fails as if no thread could be created.
inline std::atomic<bool> spawn_fails_for_test{false};

// Runs `fn` on a new thread appended to `threads`; RESOURCE_EXHAUSTED naming `what` if
// no thread could be created (`threads` is then unchanged and `fn` never runs).
template <typename Fn>
absl::Status Spawn(std::vector<std::thread>* threads, absl::string_view what, Fn&& fn) {
  try {
    if (spawn_fails_for_test.load())
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    threads->emplace_back(std::forward<Fn>(fn));
    return absl::OkStatus();
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("no thread for ", what, ": ", e.what()));
  }
}

}  // namespace rlfleet::weights

#endif  // RLFLEET_SERVICES_WEIGHTS_SPAWN_H_
