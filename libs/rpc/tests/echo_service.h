// A test EchoService (proto/rlfleet/testing/echo.proto) built on rpc::HandleUnary, so
// that tests of the server runner exercise the same auth and status path as services.
#ifndef RLFLEET_LIBS_RPC_TESTS_ECHO_SERVICE_H_
#define RLFLEET_LIBS_RPC_TESTS_ECHO_SERVICE_H_

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "libs/rpc/client.h"
#include "libs/rpc/server_call.h"
#include "rlfleet/testing/echo.grpc.pb.h"

namespace rlfleet::rpc::testing {

class EchoServiceImpl final : public rlfleet::testing::EchoService::CallbackService {
 public:
  // Echo is a fleet RPC, or controller-only when `role` says so.
  explicit EchoServiceImpl(CallAuth auth, Role role = Role::kFleet) : auth_(std::move(auth)), role_(role) {}

  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context, const rlfleet::testing::EchoRequest* request,
                                 rlfleet::testing::EchoResponse* response) override {
    return HandleUnary(context, auth_, role_, "Echo", [&]() -> absl::Status {
      const int64_t seen = ++calls_;
      if (request->delay_ms() > 0) {
        if (!delayed_call_started_.HasBeenNotified()) delayed_call_started_.Notify();
        absl::SleepFor(absl::Milliseconds(request->delay_ms()));
      }
      if (request->fail_with_code() != 0) {
        return absl::Status(static_cast<absl::StatusCode>(request->fail_with_code()), "asked to fail");
      }
      response->set_payload(request->payload());
      response->set_calls_seen(seen);
      return absl::OkStatus();
    });
  }

  int64_t calls() const { return calls_.load(); }
  absl::Notification& delayed_call_started() { return delayed_call_started_; }

 private:
  const CallAuth auth_;
  const Role role_;
  std::atomic<int64_t> calls_{0};
  absl::Notification delayed_call_started_;
};

// A typed client the way services write theirs.
class EchoClient : public ServiceClient<rlfleet::testing::EchoService> {
 public:
  using ServiceClient::ServiceClient;

  absl::StatusOr<rlfleet::testing::EchoResponse> Echo(const rlfleet::testing::EchoRequest& request,
                                                      absl::Duration timeout = absl::ZeroDuration(),
                                                      Retry retry = Retry::kIdempotent) {
    rlfleet::testing::EchoResponse response;
    absl::Status status = Unary("Echo", &Stub::Echo, request, &response, retry, timeout);
    if (!status.ok()) return status;
    return response;
  }
};

}  // namespace rlfleet::rpc::testing

#endif  // RLFLEET_LIBS_RPC_TESTS_ECHO_SERVICE_H_
