// gRPC keepalive for the fleet's channels and servers: a connection whose peer stops
// answering (a link down, a host cut off) is closed within about kKeepaliveTime +
// kKeepaliveTimeout, its calls fail UNAVAILABLE, and the next call connects afresh.
// Without it a call waits out its whole deadline, and a connection a partition left
// behind carries replies again only when tcp's retransmission timer, backed off to as
// much as two minutes while the link was down, next fires (tests/multihost: a
// replica's install answered after 116 s).
#ifndef RLFLEET_LIBS_RPC_KEEPALIVE_H_
#define RLFLEET_LIBS_RPC_KEEPALIVE_H_

#include <grpcpp/grpcpp.h>

namespace rlfleet::rpc {

inline constexpr int kKeepaliveTimeMs = 10000;     // a ping after this long without one
inline constexpr int kKeepaliveTimeoutMs = 10000;  // the connection closes when it is not acked in time

// Clients ping every kKeepaliveTimeMs, with calls in flight or not.
inline void SetClientKeepalive(grpc::ChannelArguments* args) {
  args->SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args->SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args->SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args->SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // (gRPC 1.51, Debian's, otherwise sends a ping without data at most every 5 minutes)
  args->SetInt(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS, kKeepaliveTimeMs);
}

// Servers ping their clients the same way, and accept the clients' pings (by default a
// server answers a client pinging more often than every five minutes with GOAWAY).
inline void SetServerKeepalive(grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, kKeepaliveTimeMs / 2);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS, kKeepaliveTimeMs);
}

}  // namespace rlfleet::rpc

#endif  // RLFLEET_LIBS_RPC_KEEPALIVE_H_
