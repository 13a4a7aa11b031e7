#include "services/gateway/rollout_pool.h"

#include <grpcpp/channel.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "libs/common/status_macros.h"
#include "libs/rpc/status_conversion.h"

namespace rlfleet::gateway {

RolloutPool::RolloutPool(std::vector<std::string> fixed, std::unique_ptr<registry::RegistryClient> registry,
                         rpc::ClientOptions client)
    : fixed_(std::move(fixed)), registry_(std::move(registry)), client_(std::move(client)) {}

absl::StatusOr<std::vector<std::string>> RolloutPool::Replicas() {
  if (registry_ == nullptr) return fixed_;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Now() - listed_at_ < absl::Seconds(1)) return listed_;
  }
  v1::ListReplicasRequest list;
  list.set_role(v1::REPLICA_ROLE_ROLLOUT);
  list.set_only_admitted(true);
  std::vector<std::string> addresses;
  for (;;) {
    absl::StatusOr<v1::ListReplicasResponse> page = registry_->ListReplicas(list);
    if (!page.ok())
      return absl::UnavailableError(absl::StrCat("listing the rollout replicas: ", page.status().message()));
    for (const v1::ReplicaInfo& r : page->replicas()) addresses.push_back(r.grpc_address());
    if (page->next_page_token().empty()) break;
    list.mutable_page()->set_page_token(page->next_page_token());
  }
  absl::MutexLock lock(&mu_);
  listed_ = addresses;
  listed_at_ = absl::Now();
  return addresses;
}

v1::RolloutService::Stub* RolloutPool::StubFor(const std::string& address) {
  auto it = stubs_.find(address);
  if (it != stubs_.end()) return it->second.get();
  rpc::ClientOptions options = client_;
  options.target = address;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = rpc::MakeChannel(options);
  if (!channel.ok()) return nullptr;
  return (stubs_[address] = v1::RolloutService::NewStub(*channel)).get();
}

absl::Status RolloutPool::Generate(const v1::GenerateRequest& request, absl::Time deadline,
                                   const std::function<bool(const v1::GenerateResponse&)>& on_message) {
  ASSIGN_OR_RETURN(std::vector<std::string> replicas, Replicas());
  if (replicas.empty()) return absl::UnavailableError("no rollout replica serves now (none admitted)");
  absl::Status last;
  for (size_t attempt = 0; attempt < replicas.size(); ++attempt) {
    grpc::ClientContext context;
    rpc::PrepareCallContext(client_, deadline, &context);
    v1::RolloutService::Stub* stub = nullptr;
    std::string address;
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return absl::UnavailableError("the gateway is shutting down");
      address = replicas[next_++ % replicas.size()];
      stub = StubFor(address);
      if (stub != nullptr) calls_.insert(&context);
    }
    if (stub == nullptr) {
      last = absl::UnavailableError(absl::StrCat("no channel to ", address));
      continue;
    }
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub->Generate(&context, request);
    v1::GenerateResponse message;
    bool received = false, cancelled = false;
    while (reader->Read(&message)) {
      received = true;
      if (!cancelled && !on_message(message)) {
        cancelled = true;
        context.TryCancel();
      }
    }
    const grpc::Status status = reader->Finish();
    {
      absl::MutexLock lock(&mu_);
      calls_.erase(&context);
    }
    if (cancelled) return absl::OkStatus();
    last = rpc::ToAbslStatus(status);
    if (status.ok() || received || status.error_code() != grpc::StatusCode::UNAVAILABLE) {
      return last.ok() ? last : absl::Status(last.code(), absl::StrCat("rollout ", address, ": ", last.message()));
    }
  }
  return absl::UnavailableError(
      absl::StrCat("no rollout replica answered (", absl::StrJoin(replicas, ", "), "): ", last.message()));
}

void RolloutPool::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  for (grpc::ClientContext* c : calls_) c->TryCancel();
}

}  // namespace rlfleet::gateway
