// RolloutPool (run_loop.h): the run's rollout replicas, called concurrently.
#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "services/controller/run_loop.h"

namespace rlfleet::controller {
namespace {

// A replica that is dead, hung past the call deadline, or shutting down (its server
// cancels the calls in flight when it stops: the pool never cancels its own calls).
bool ReplicaFailure(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsCancelled(s);
}

// A replica too busy for a call now (its queue is full: inference traffic through the
// gateway shares it). The chunk waits and is tried again, there or elsewhere.
bool ReplicaBusy(const absl::Status& s) { return absl::IsResourceExhausted(s); }

// A replica that failed to decode a chunk (INTERNAL: a libtorch error such as an out
// of memory; ABORTED). The replica lives: the chunk is tried again, up to
// kDecodeAttempts times in all, before the run fails with the error.
bool DecodeFailure(const absl::Status& s) { return absl::IsInternal(s) || absl::IsAborted(s); }
constexpr int kDecodeAttempts = 3;

// How long a worker keeps finding its replica busy, with nothing else to do, before
// the call fails RESOURCE_EXHAUSTED.
constexpr absl::Duration kBusyPatience = absl::Minutes(10);

// A replica's answer to installing `request`, FAILED_PRECONDITION included: that is
// OK only when the replica reports serving exactly the version (it had it already);
// otherwise it holds another (newer) version or is installing one, and cannot serve
// this version: FAILED_PRECONDITION saying which.
absl::Status Installed(RolloutReplica& replica, const absl::Status& s, const v1::PrepareWeightsRequest& request) {
  if (!absl::IsFailedPrecondition(s)) return s;
  const uint64_t want = request.manifest().version().version();
  absl::StatusOr<uint64_t> has = replica.InstalledVersion();
  if (!has.ok())
    return common::Annotate(has.status(), absl::StrCat("after it refused version ", want, " (", s.message(), ")"));
  if (*has == want) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("refused version ", want, " (", s.message(),
                                                    ") and serves version ", *has,
                                                    ": it cannot serve this run's policy"));
}

}  // namespace

RolloutPool::RolloutPool(std::vector<std::unique_ptr<RolloutReplica>> replicas, Log log) : log_(std::move(log)) {
  absl::MutexLock lock(&mu_);
  for (auto& r : replicas) replicas_.push_back({std::move(r), true});
}

std::vector<std::shared_ptr<RolloutReplica>> RolloutPool::LivePeersLocked() {
  std::vector<std::shared_ptr<RolloutReplica>> out;
  for (const Replica& r : replicas_) {
    if (r.alive) out.push_back(r.peer);
  }
  return out;
}

void RolloutPool::DropPeer(RolloutReplica* peer, const absl::Status& why, const std::string& what) {
  absl::MutexLock lock(&mu_);
  for (Replica& r : replicas_) {
    if (r.alive && r.peer.get() == peer) Drop(r, why, what);
  }
}

int RolloutPool::live() {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const Replica& r : replicas_) n += r.alive;
  return n;
}

void RolloutPool::Drop(Replica& replica, const absl::Status& why, const std::string& what) {
  replica.alive = false;
  if (log_) {
    log_(absl::StrCat("rollout replica ", replica.peer->address(), " failed (", why.message(), "): dropped", what));
  }
}

absl::Status RolloutPool::Generate(const v1::GenerateBatchRequest& request, v1::GenerateBatchResponse* response,
                                   int min_prompts_per_call) {
  // The calls run outside the pool's lock: other Generate calls, a weight update (the
  // replicas swap versions at a decode-step boundary) and scaling go on meanwhile. A
  // replica removed meanwhile stays alive (shared) until its calls return; what it
  // refuses once drained (UNAVAILABLE) goes to the others.
  std::vector<std::shared_ptr<RolloutReplica>> peers;
  {
    absl::MutexLock lock(&mu_);
    peers = LivePeersLocked();
  }
  if (peers.empty()) return absl::UnavailableError("no rollout replica left");
  const size_t live_peers = peers.size();
  // The prompts in chunks that the replicas take as they finish, so that a replica
  // with less load (or more speed) takes more; each replica has two calls in flight,
  // so its continuous batching always has the next chunk to take in. A chunk whose
  // replica failed goes back on the queue for the others; the replica is dropped.
  constexpr int kCallsInFlight = 2;
  const int prompts = request.prompts_size(), samples = request.num_samples();
  const int chunk = std::max<int>(
      {1, min_prompts_per_call,
       static_cast<int>((prompts + 2 * kCallsInFlight * live_peers - 1) / (2 * kCallsInFlight * live_peers))});
  struct Chunk {
    std::vector<int> prompts;
    int decode_failures = 0;
  };
  std::deque<Chunk> queue;
  for (int i = 0; i < prompts; i += chunk) {
    Chunk& c = queue.emplace_back();
    for (int k = i; k < std::min(prompts, i + chunk); ++k) c.prompts.push_back(k);
  }
  std::vector<v1::GenerateBatchResponse> per_prompt(prompts);
  absl::Mutex work_mu;
  int in_flight = 0, calls = 0;
  absl::Status fatal;
  std::vector<absl::Status> failure(live_peers);  // the first failure of each replica
  std::vector<int> requeued(live_peers, 0);
  // Every live replica's first call is set before any is made: each gets work.
  // (starting at a replica that turns with each call: calls of one chunk spread too)
  std::vector<Chunk> first(live_peers);
  const size_t offset = next_first_.fetch_add(1) % live_peers;
  for (size_t j = 0; j < live_peers && !queue.empty(); ++j) {
    first[(offset + j) % live_peers] = std::move(queue.front());
    queue.pop_front();
    ++in_flight;
  }
  int busy_retries = 0, decode_retries = 0;
  auto worker = [&](size_t k, bool starts) {
    RolloutReplica* peer = peers[k].get();
    absl::Duration backoff = absl::Milliseconds(50);
    std::optional<absl::Time> busy_since;
    while (true) {
      Chunk mine;
      v1::GenerateBatchRequest part = request;
      {
        absl::MutexLock work(&work_mu);
        if (starts && !first[k].prompts.empty()) {
          mine = std::move(first[k]);
          starts = false;
        } else {
          // Wait for a chunk while others still hold some (theirs may come back).
          auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(work_mu) {
            return !queue.empty() || in_flight == 0 || !fatal.ok() || !failure[k].ok();
          };
          work_mu.Await(absl::Condition(&ready));
          if (queue.empty() || !fatal.ok() || !failure[k].ok()) return;
          mine = std::move(queue.front());
          queue.pop_front();
          ++in_flight;
        }
        part.set_request_id(absl::StrCat(request.request_id(), "-c", calls++));
      }
      part.clear_prompts();
      for (int i : mine.prompts) *part.add_prompts() = request.prompts(i);
      v1::GenerateBatchResponse reply;
      absl::Status s = peer->GenerateBatch(part, &reply);
      if (s.ok() && reply.completions_size() != static_cast<int>(mine.prompts.size()) * samples) {
        s = absl::FailedPreconditionError(absl::StrCat("rollout replica ", peer->address(), " returned ",
                                                       reply.completions_size(), " completions for ",
                                                       mine.prompts.size(), " prompts x ", samples));
      }
      if (s.ok()) {  // each prompt belongs to one chunk: no two workers write one slot
        for (size_t j = 0; j < mine.prompts.size(); ++j) {
          for (int x = 0; x < samples; ++x) {
            *per_prompt[mine.prompts[j]].add_completions() =
                std::move(*reply.mutable_completions(static_cast<int>(j) * samples + x));
          }
        }
      }
      bool wait = false;
      {
        absl::MutexLock work(&work_mu);
        --in_flight;
        if (s.ok()) {
          busy_since.reset();
          backoff = absl::Milliseconds(50);
          continue;
        }
        if (ReplicaBusy(s) && !(busy_since.has_value() && absl::Now() - *busy_since > kBusyPatience)) {
          // Busy: the chunk goes back for any replica; this one is asked again after a
          // back-off (the queue it waits for drains as its sequences finish).
          if (!busy_since.has_value()) busy_since = absl::Now();
          ++busy_retries;
          queue.push_front(std::move(mine));
          wait = true;
        } else if (DecodeFailure(s) && ++mine.decode_failures < kDecodeAttempts) {
          if (log_) {
            log_(absl::StrCat("rollout replica ", peer->address(), " failed to generate ", mine.prompts.size(),
                              " prompts (", s.message(), "): tried again"));
          }
          ++decode_retries;
          queue.push_back(std::move(mine));
          wait = true;
        } else if (ReplicaFailure(s)) {
          if (failure[k].ok()) failure[k] = s;
          requeued[k] += mine.prompts.size();
          queue.push_back(std::move(mine));
          return;
        } else {
          if (fatal.ok()) {
            fatal = ReplicaBusy(s)
                        ? common::Annotate(s, absl::StrCat("rollout replica ", peer->address(), " was busy for ",
                                                           absl::FormatDuration(kBusyPatience)))
                        : s;
          }
          return;
        }
      }
      if (wait) {
        absl::SleepFor(backoff);
        backoff = std::min(backoff * 2, absl::Seconds(1));
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t k = 0; k < live_peers; ++k) {
    for (int c = 0; c < kCallsInFlight; ++c) threads.emplace_back(worker, k, /*starts=*/c == 0);
  }
  for (auto& t : threads) t.join();
  for (size_t k = 0; k < live_peers; ++k) {
    if (!failure[k].ok()) {
      DropPeer(peers[k].get(), failure[k], absl::StrCat("; re-dispatching its ", requeued[k], " prompts"));
    }
  }
  if ((busy_retries > 0 || decode_retries > 0) && log_) {
    log_(absl::StrCat("rollout: ", busy_retries, " calls found their replica busy and ", decode_retries,
                      " failed to generate; their prompts were generated again"));
  }
  if (!fatal.ok()) return fatal;
  if (!queue.empty()) return absl::UnavailableError("no rollout replica left");
  for (auto& p : per_prompt) {
    for (auto& c : *p.mutable_completions()) *response->add_completions() = std::move(c);
  }
  return absl::OkStatus();
}

std::vector<absl::Status> RolloutReplica::UpdateWeightsTogether(const std::vector<RolloutReplica*>& replicas,
                                                                const v1::PrepareWeightsRequest& request) {
  std::vector<absl::Status> out;
  for (RolloutReplica* r : replicas) out.push_back(r->UpdateWeights(request));
  return out;
}

absl::Status RolloutPool::UpdateWeights(const v1::PrepareWeightsRequest& request) {
  // One update at a time; generation goes on meanwhile (outside mu_).
  absl::MutexLock updating(&update_mu_);
  std::vector<std::shared_ptr<RolloutReplica>> peers;
  {
    absl::MutexLock lock(&mu_);
    weights_ = request;
    // Replicas that waited for the run's first weights join with them.
    for (auto& peer : waiting_) {
      replicas_.push_back({std::move(peer), true});
      if (log_) log_(absl::StrCat("rollout replica ", replicas_.back().peer->address(), " admitted"));
    }
    waiting_.clear();
    peers = LivePeersLocked();
  }
  std::vector<RolloutReplica*> raw;
  for (const auto& p : peers) raw.push_back(p.get());
  const std::vector<absl::Status> installed =
      raw.empty() ? std::vector<absl::Status>() : raw[0]->UpdateWeightsTogether(raw, request);
  absl::Status fatal, dropped;
  for (size_t i = 0; i < raw.size(); ++i) {
    const absl::Status s = Installed(
        *raw[i], i < installed.size() ? installed[i] : absl::InternalError("no status for the replica"), request);
    if (s.ok()) continue;  // installed, or serving it already
    // FAILED_PRECONDITION: another version, it gets no work in this run; or it failed.
    if (!absl::IsFailedPrecondition(s) && !ReplicaFailure(s)) {
      if (fatal.ok()) fatal = s;
      continue;
    }
    DropPeer(raw[i], s, "");
    dropped = common::Annotate(s, absl::StrCat("rollout replica ", raw[i]->address()));
  }
  if (!fatal.ok()) return fatal;
  absl::MutexLock lock(&mu_);
  for (const Replica& r : replicas_) {
    if (r.alive) return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("no rollout replica left", dropped.ok() ? "" : absl::StrCat(" (last: ", dropped.message(), ")")));
}

absl::Status RolloutPool::JoinedLocked(const std::string& address) {
  for (const Replica& r : replicas_) {
    if (r.alive && r.peer->address() == address) {
      return absl::AlreadyExistsError(absl::StrCat("rollout replica ", address, " is in the pool"));
    }
  }
  for (const auto& w : waiting_) {
    if (w->address() == address) {
      return absl::AlreadyExistsError(absl::StrCat("rollout replica ", address, " waits to join the pool"));
    }
  }
  return absl::OkStatus();
}

absl::Status RolloutPool::Admit(std::unique_ptr<RolloutReplica> replica) {
  const std::string address = replica->address();
  // The joining replica installs the run's weights outside the pool's lock (a slow or
  // hung one must not hold up the run's generation); if the run installed a newer
  // version meanwhile, it installs that one too before it is admitted.
  for (int attempt = 0; attempt < 4; ++attempt) {
    v1::PrepareWeightsRequest weights;
    {
      absl::MutexLock lock(&mu_);
      RETURN_IF_ERROR(JoinedLocked(address));
      if (!weights_) {
        if (log_) log_(absl::StrCat("rollout replica ", address, " waits for the run's first weights"));
        waiting_.push_back(std::move(replica));
        return absl::OkStatus();
      }
      weights = *weights_;
    }
    const uint64_t version = weights.manifest().version().version();
    absl::Status s = Installed(*replica, replica->UpdateWeights(weights), weights);
    if (absl::IsNotFound(s)) {  // (retired while it joined: the run has a newer one to install)
      absl::MutexLock lock(&mu_);
      if (weights_->manifest().version().version() != version) continue;
    }
    if (!s.ok()) {
      return common::Annotate(s, absl::StrCat("installing version ", version, " on joining replica ", address));
    }
    absl::MutexLock lock(&mu_);
    if (weights_->manifest().version().version() != version) continue;  // (a newer one: install it too)
    RETURN_IF_ERROR(JoinedLocked(address));                             // (another Admit of it may have won meanwhile)
    replicas_.push_back({std::move(replica), true});
    if (log_) log_(absl::StrCat("rollout replica ", address, " admitted with version ", version));
    return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat("rollout replica ", address,
                                         ": the run installed a newer version each time it caught up; try again"));
}

absl::Status RolloutPool::Remove(const std::string& address) {
  std::shared_ptr<RolloutReplica> leaving;
  bool was_alive = false;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if ((*it)->address() == address) {
        waiting_.erase(it);
        return absl::OkStatus();
      }
    }
    for (auto it = replicas_.begin(); it != replicas_.end(); ++it) {
      if (it->peer->address() != address) continue;
      was_alive = it->alive;
      leaving = std::move(it->peer);
      replicas_.erase(it);
      break;
    }
  }
  {
    if (leaving == nullptr)
      return absl::NotFoundError(absl::StrCat("rollout replica ", address, " is not in the pool"));
    // (outside the lock: a drain waits for the replica's work in flight, which other
    // calls of the pool may have given it)
    absl::Status drained = was_alive ? leaving->Drain() : absl::OkStatus();
    if (log_) {
      log_(absl::StrCat("rollout replica ", address, " removed",
                        drained.ok() ? "" : absl::StrCat(" (drain: ", drained.message(), ")")));
    }
    return absl::OkStatus();
  }
}

std::vector<std::string> RolloutPool::addresses() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const Replica& r : replicas_) {
    if (r.alive) out.push_back(r.peer->address());
  }
  return out;
}

uint64_t RolloutPool::NewestInstalledVersion() {
  std::vector<std::shared_ptr<RolloutReplica>> peers;
  {
    absl::MutexLock lock(&mu_);
    peers = LivePeersLocked();
  }
  uint64_t newest = 0;
  for (const auto& peer : peers) {
    absl::StatusOr<uint64_t> v = peer->InstalledVersion();
    if (v.ok()) newest = std::max(newest, *v);
  }
  return newest;
}

}  // namespace rlfleet::controller
