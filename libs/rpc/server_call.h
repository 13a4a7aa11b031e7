// Helpers for gRPC callback-API handlers in <svc>_service adapters: every unary call
// goes through HandleUnary, which checks the bearer token, runs the handler body (which
// returns absl::Status and never sees gRPC status types), converts exceptions from
// libraries that throw (libtorch) into INTERNAL, and finishes the call.
//
//   grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
//                                      const RegisterRequest* req,
//                                      RegisterResponse* resp) override {
//     return rpc::HandleUnary(ctx, auth_, [&] { return core_->Register(*req, resp); });
//   }
#ifndef RLFLEET_LIBS_RPC_SERVER_CALL_H_
#define RLFLEET_LIBS_RPC_SERVER_CALL_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libs/rpc/auth.h"
#include "libs/rpc/status_conversion.h"

namespace rlfleet::rpc {

// Runs `body` (callable returning absl::Status) if the call is authorised for `role`
// (Authorize; `method` names the RPC in a refusal) and finishes the call with the
// result. Never throws.
template <typename Body>
grpc::ServerUnaryReactor* HandleUnary(grpc::CallbackServerContext* context, const CallAuth& auth, Role role,
                                      absl::string_view method, Body&& body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = Authorize(*context, auth, role, method);
  if (status.ok()) {
    try {
      status = std::forward<Body>(body)();
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat("handler threw: ", e.what()));
    } catch (...) {
      status = absl::InternalError("handler threw a non-standard exception");
    }
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A fleet RPC: any fleet member may call it.
template <typename Body>
grpc::ServerUnaryReactor* HandleUnary(grpc::CallbackServerContext* context, const CallAuth& auth, Body&& body) {
  return HandleUnary(context, auth, Role::kFleet, "this RPC", std::forward<Body>(body));
}

// HandleUnary for a handler that answers later, without holding a gRPC thread while it
// waits (a Redis round trip): if the call is authorised, `body(finish)` starts the work
// and calls `finish(status)` exactly once, from any thread; the call finishes then.
// `body` must not throw (it serves no libtorch code).
template <typename Body>
grpc::ServerUnaryReactor* HandleUnaryAsync(grpc::CallbackServerContext* context, const CallAuth& auth, Role role,
                                           absl::string_view method, Body&& body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status status = Authorize(*context, auth, role, method); !status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  std::forward<Body>(body)([reactor](const absl::Status& status) { reactor->Finish(ToGrpcStatus(status)); });
  return reactor;
}

// A streaming call finished at once with `status` (a stream that cannot start):
//   return new FinishedStream<grpc::ServerWriteReactor<Event>>(ToGrpcStatus(s));
template <typename Reactor>
class FinishedStream : public Reactor {
 public:
  explicit FinishedStream(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace rlfleet::rpc

#endif  // RLFLEET_LIBS_RPC_SERVER_CALL_H_
