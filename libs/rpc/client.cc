#include "libs/rpc/client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <cmath>

#include "absl/random/distributions.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/keepalive.h"
#include "libs/rpc/status_conversion.h"

namespace rlfleet::rpc {

bool IsRetryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded;
}

absl::Duration BackoffFor(const RetryPolicy& policy, int retry, absl::BitGenRef gen) {
  double scale = std::pow(std::max(policy.multiplier, 1.0), std::max(retry, 0));
  absl::Duration base = policy.initial_backoff * scale;
  if (!(base < policy.max_backoff)) base = policy.max_backoff;  // also catches overflow
  const double jitter = std::clamp(policy.jitter, 0.0, 1.0);
  const double factor = jitter > 0 ? absl::Uniform(gen, 1.0 - jitter, 1.0 + jitter) : 1.0;
  return base * factor;
}

absl::Status CallWithRetry(const RetryPolicy& policy, absl::Duration timeout, common::Clock* clock, absl::BitGenRef gen,
                           const std::function<absl::Status(absl::Time)>& attempt) {
  const absl::Time deadline = clock->Now() + timeout;
  const int max_attempts = std::max(policy.max_attempts, 1);
  absl::Status status;
  int attempts = 0;
  for (int i = 0; i < max_attempts; ++i) {
    const absl::Time now = clock->Now();
    if (now >= deadline && i > 0) break;
    absl::Time attempt_deadline = deadline;
    if (policy.attempt_timeout > absl::ZeroDuration()) {
      attempt_deadline = std::min(deadline, now + policy.attempt_timeout);
    }
    status = attempt(attempt_deadline);
    ++attempts;
    if (status.ok() || !IsRetryable(status.code())) return status;
    if (i + 1 == max_attempts) break;
    const absl::Duration backoff = BackoffFor(policy, i, gen);
    if (clock->Now() + backoff >= deadline) break;
    clock->SleepFor(backoff);
  }
  if (attempts > 1) {
    return common::Annotate(status, absl::StrCat("after ", attempts, " attempts"));
  }
  return status;
}

absl::StatusOr<ClientOptions> ClientOptionsFromFlags(const std::string& target) {
  ClientOptions options;
  options.target = target;
  ASSIGN_OR_RETURN(options.auth, AuthOptionsFromFlags());
  return options;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("empty gRPC target");
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> creds, MakeChannelCredentials(options.auth));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  if (!options.auth.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.auth.tls_server_name);
  }
  // Our own retry loop (CallWithRetry) decides; gRPC's built-in retries would multiply it.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  // A peer that was unreachable (a link down, a partition) is tried again within a
  // few seconds of coming back: gRPC's reconnect backoff otherwise grows to 120 s, and
  // a replica cut off for a minute stayed out of its fleet for two more
  // (tests/multihost: AReplicaCutOffMidRun...).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 3000);
  SetClientKeepalive(&args);
  return grpc::CreateCustomChannel(options.target, creds, args);
}

ClientBase::ClientBase(std::shared_ptr<grpc::Channel> channel, ClientOptions options, common::Clock* clock)
    : channel_(std::move(channel)), options_(std::move(options)), clock_(clock) {}

void PrepareCallContext(const ClientOptions& options, absl::Time deadline, grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(deadline));
  // The admin token, when this client holds one, grants fleet RPCs too.
  const std::string& token = options.auth.admin_token.empty() ? options.auth.token : options.auth.admin_token;
  if (!token.empty()) context->AddMetadata(kAuthorizationKey, absl::StrCat("Bearer ", token));
}

std::unique_ptr<grpc::ClientContext> NewCallContext(const ClientOptions& options, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) timeout = options.default_timeout;
  auto context = std::make_unique<grpc::ClientContext>();
  PrepareCallContext(options, absl::Now() + timeout, context.get());
  return context;
}

absl::Status ClientBase::Call(absl::string_view method, const std::function<grpc::Status(grpc::ClientContext*)>& rpc,
                              Retry retry, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) timeout = options_.default_timeout;
  thread_local absl::BitGen gen;
  RetryPolicy policy = options_.retry;
  if (retry == Retry::kOnce) policy.max_attempts = 1;
  absl::Status status = CallWithRetry(policy, timeout, clock_, gen, [&](absl::Time attempt_deadline) {
    grpc::ClientContext context;
    PrepareCallContext(options_, attempt_deadline, &context);
    return ToAbslStatus(rpc(&context));
  });
  return common::Annotate(status, absl::StrCat(method, " to ", options_.target));
}

}  // namespace rlfleet::rpc
