// Client side of rlfleet's gRPC services: channels with the auth options applied, a
// deadline on every call, and retries of UNAVAILABLE / DEADLINE_EXCEEDED only, with
// capped exponential backoff and jitter. Other codes (INVALID_ARGUMENT,
// FAILED_PRECONDITION, ...) are returned at once: retrying cannot fix them.
#ifndef RLFLEET_LIBS_RPC_CLIENT_H_
#define RLFLEET_LIBS_RPC_CLIENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/random/bit_gen_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libs/common/clock.h"
#include "libs/rpc/auth.h"

namespace rlfleet::rpc {

struct RetryPolicy {
  // Total attempts including the first; 1 disables retries.
  int max_attempts = 4;
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  double multiplier = 2.0;
  // Each backoff is scaled by a uniform factor in [1 - jitter, 1 + jitter].
  double jitter = 0.2;
  // Deadline of one attempt; the call's overall deadline still bounds it. Zero: each
  // attempt may use all the time left (so DEADLINE_EXCEEDED then ends the call).
  absl::Duration attempt_timeout = absl::ZeroDuration();
};

// True for the codes a client retries: UNAVAILABLE and DEADLINE_EXCEEDED.
bool IsRetryable(absl::StatusCode code);

// Backoff before retry number `retry` (0 = before the second attempt):
// min(max_backoff, initial_backoff * multiplier^retry) scaled by the jitter factor.
absl::Duration BackoffFor(const RetryPolicy& policy, int retry, absl::BitGenRef gen);

// Runs `attempt(attempt_deadline)` until it returns OK or a non-retryable error, the
// policy's attempts run out, or `timeout` has passed (measured on `clock`). Backoffs
// sleep on `clock` and never run past the overall deadline. The returned error is the
// last attempt's, annotated with the attempt count when there were retries.
absl::Status CallWithRetry(const RetryPolicy& policy, absl::Duration timeout, common::Clock* clock, absl::BitGenRef gen,
                           const std::function<absl::Status(absl::Time)>& attempt);

struct ClientOptions {
  // gRPC target, e.g. "127.0.0.1:7000" or "dns:///controller:7000".
  std::string target;
  AuthOptions auth;
  // Deadline of a call that names none.
  absl::Duration default_timeout = absl::Seconds(10);
  RetryPolicy retry;
  int max_message_bytes = 16 << 20;
};

// Client options from the shared auth flags (auth.h) for `target`.
absl::StatusOr<ClientOptions> ClientOptionsFromFlags(const std::string& target);

// A channel to options.target with TLS / client certificates as configured.
// INVALID_ARGUMENT for an empty target or bad TLS options, NOT_FOUND for a missing file.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ClientOptions& options);

// Sets `context`'s deadline and adds the bearer token of `options`: what every call of
// ours carries.
void PrepareCallContext(const ClientOptions& options, absl::Time deadline, grpc::ClientContext* context);
// A context for one call, its deadline `timeout` from now (zero: options.default_timeout).
std::unique_ptr<grpc::ClientContext> NewCallContext(const ClientOptions& options, absl::Duration timeout);

// Whether an attempt that ended in UNAVAILABLE or DEADLINE_EXCEEDED may be sent again.
// A call that changes the peer's state and is not idempotent (TrainStep, GenerateBatch,
// PublishWeights) is kOnce: the first attempt may have run there, and a second one
// would run it twice. Every call site says which it is.
enum class Retry { kIdempotent, kOnce };

// Base of every typed client: subclasses hold a stub and implement each RPC as
//   return Call("Register", [&](grpc::ClientContext* ctx) {
//     return stub_->Register(ctx, request, &response); }, Retry::kIdempotent);
// or hold a ServiceClient (below). Thread-safe.
class ClientBase {
 public:
  ClientBase(std::shared_ptr<grpc::Channel> channel, ClientOptions options,
             common::Clock* clock = common::Clock::Real());
  virtual ~ClientBase() = default;

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  const ClientOptions& options() const { return options_; }

 protected:
  // Makes the call, with retries (see CallWithRetry) when `retry` is kIdempotent. Each
  // attempt gets a fresh ClientContext with its deadline and the bearer token.
  // `timeout` zero means options().default_timeout. Errors are annotated with `method`
  // and the target.
  absl::Status Call(absl::string_view method, const std::function<grpc::Status(grpc::ClientContext*)>& rpc, Retry retry,
                    absl::Duration timeout = absl::ZeroDuration());
  // Call() returning the response: `fn(context, &response)` makes the call.
  template <typename Response, typename Fn>
  absl::StatusOr<Response> CallFor(absl::string_view method, Retry retry, Fn&& fn,
                                   absl::Duration timeout = absl::ZeroDuration()) {
    Response response;
    absl::Status status = Call(
        method, [&](grpc::ClientContext* context) { return fn(context, &response); }, retry, timeout);
    if (!status.ok()) return status;
    return response;
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  const ClientOptions options_;
  common::Clock* clock_;
};

// A client of one gRPC service (`Service` is the generated class, e.g.
// v1::TrainerService) for code that calls its methods directly:
//   RETURN_IF_ERROR(client.Unary("TrainStep", &Stub::TrainStep, request, &response, Retry::kOnce));
// Thread-safe.
template <typename Service>
class ServiceClient : public ClientBase {
 public:
  using Stub = typename Service::Stub;

  ServiceClient(std::shared_ptr<grpc::Channel> channel, ClientOptions options,
                common::Clock* clock = common::Clock::Real())
      : ClientBase(channel, std::move(options), clock), stub_(Service::NewStub(channel)) {}

  // A client of options.target. Errors as MakeChannel.
  static absl::StatusOr<std::unique_ptr<ServiceClient>> Connect(ClientOptions options) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(options);
    if (!channel.ok()) return channel.status();
    return std::make_unique<ServiceClient>(*std::move(channel), std::move(options));
  }

  // One unary call of `rpc` (a method of the stub) with the client's deadline, token and
  // retries (when `retry` allows them).
  template <typename Request, typename Response>
  absl::Status Unary(absl::string_view method,
                     grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Response*), const Request& request,
                     Response* response, Retry retry, absl::Duration timeout = absl::ZeroDuration()) {
    return Call(
        method, [&](grpc::ClientContext* context) { return (stub_.get()->*rpc)(context, request, response); }, retry,
        timeout);
  }

 private:
  const std::unique_ptr<Stub> stub_;
};

}  // namespace rlfleet::rpc

#endif  // RLFLEET_LIBS_RPC_CLIENT_H_
