// The resharding executor's same-host path (executor.h: "Same host"): pairs whose
// destination shard the sender can map move by plain stores, digest in the same pass.
#include <algorithm>
#include <atomic>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "libs/reshard/executor_internal.h"

namespace rlfleet::reshard::internal {
namespace {

constexpr uint64_t kHelloBytes = 16 << 10;         // [accept byte][serialized descriptor]
constexpr uint64_t kLinkBytes = kHelloBytes + 64;  // a hello, then the answer

// Makes stores through a mapping (non-temporal ones too) visible before the notice
// that follows them.
void StoreFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

// A walk over the pieces of messages [message, end) of one pair.
struct Cursor {
  const Pair* pair;
  size_t message;
  size_t index;  // piece within the message
  size_t end;
  bool done() const { return message >= end; }
  const Range& piece() const { return pair->messages[message].pieces[index]; }
  void Advance() {
    if (++index == pair->messages[message].pieces.size()) {
      index = 0;
      ++message;
    }
  }
};

}  // namespace

MappedRun::MappedRun(Transport& transport, const Plan& plan, const SourceRole* source,
                     const DestinationRole* destination, MemoryOps& ops, const ExecutorOptions& options,
                     ExecutionStats& stats, std::vector<Pair>& pairs)
    : t_(transport),
      plan_(plan),
      source_(source),
      destination_(destination),
      ops_(ops),
      options_(options),
      stats_(stats),
      pairs_(pairs) {
  for (size_t i = 0; i < pairs_.size(); ++i) (pairs_[i].send ? sends_ : recvs_).push_back(i);
  forward_ = destination_ != nullptr && destination_->forward_to != 0;
  for (const Pair& p : pairs_) rounds_ = std::max(rounds_, p.rounds());
}

uint64_t MappedRun::ControlBytes() const {
  uint64_t notices = 0;
  for (size_t j : recvs_) notices += pairs_[j].rounds();
  return (sends_.size() + 2 * recvs_.size()) * kLinkBytes + (notices + rounds_ + 1) * 8;
}

uint64_t MappedRun::SendLink(size_t k) const { return k * kLinkBytes; }
uint64_t MappedRun::RecvLink(size_t j) const { return (sends_.size() + j) * kLinkBytes; }
uint64_t MappedRun::ForwardLink(size_t j) const { return (sends_.size() + recvs_.size() + j) * kLinkBytes; }

// Decides per pair whether it is mapped. Hellos go up (a relay sends its own once it
// knows whether it can map the next replica), answers come down.
absl::Status MappedRun::Negotiate(const transport::MemoryHandle& control) {
  control_ = control;
  base_ = static_cast<uint8_t*>(control.base);
  const bool host = ops_.kind() == transport::MemoryKind::kHost;
  std::vector<std::unique_ptr<Completion>> hellos_in, forward_hellos_in, answers_in;
  // Receives still posted when this returns (it failed) are withdrawn: a later Execute
  // with the same peers must not have its messages taken by them.
  absl::Cleanup withdraw = [&] {
    for (auto* list : {&hellos_in, &forward_hellos_in, &answers_in}) {
      for (auto& c : *list) c->Cancel();
    }
  };
  for (size_t k = 0; k < sends_.size(); ++k) {
    const Pair& p = pairs_[sends_[k]];
    hellos_in.push_back(
        t_.Recv(p.peer, TagOf(options_.tag_epoch, p.src_rank, kHelloIndex), control_, SendLink(k), kHelloBytes));
  }
  if (forward_) {
    for (size_t j = 0; j < recvs_.size(); ++j) {
      forward_hellos_in.push_back(t_.Recv(destination_->forward_to,
                                          TagOf(options_.tag_epoch, pairs_[recvs_[j]].src_rank, kHelloIndex), control_,
                                          ForwardLink(j), kHelloBytes));
    }
    // A relay first learns whether it can map the next replica's shard.
    bool can = host;
    for (size_t j = 0; j < recvs_.size(); ++j) {
      RETURN_IF_ERROR(Await(*forward_hellos_in[j], options_,
                            absl::StrCat("waiting for the next replica's resharding hello (source rank ",
                                         pairs_[recvs_[j]].src_rank, ")")));
      v1::RemoteMemoryDescriptor d;
      ASSIGN_OR_RETURN(bool accept, ParseHello(*forward_hellos_in[j], ForwardLink(j), &d));
      if (!accept) can = false;
      if (can && forward_mapping_ == nullptr) {
        auto m = Map(destination_->forward_to, d);
        if (m.ok() && (*m)->length() >= plan_.dst_shard_bytes[destination_->rank]) {
          forward_mapping_ = *m;
        } else {
          can = false;
        }
      }
    }
    if (!can) forward_mapping_ = nullptr;
  }
  // Our hellos to whoever sends to us, then their answers.
  std::string descriptor;
  bool accept = false;
  if (!recvs_.empty()) {
    auto d = t_.Describe(destination_->shard);
    accept = d.ok() && destination_->shard.kind == transport::MemoryKind::kHost &&
             (!forward_ || forward_mapping_ != nullptr);
    if (accept) descriptor = d->SerializeAsString();
    accept &= descriptor.size() + 1 <= kHelloBytes;
  }
  std::vector<std::unique_ptr<Completion>> hellos_out;
  for (size_t j = 0; j < recvs_.size(); ++j) {
    const Pair& p = pairs_[recvs_[j]];
    uint8_t* hello = base_ + RecvLink(j);
    hello[0] = accept ? 1 : 0;
    if (accept) std::memcpy(hello + 1, descriptor.data(), descriptor.size());
    hellos_out.push_back(t_.Send(p.peer, TagOf(options_.tag_epoch, p.src_rank, kHelloIndex), control_, RecvLink(j),
                                 1 + (accept ? descriptor.size() : 0)));
    answers_in.push_back(
        t_.Recv(p.peer, TagOf(options_.tag_epoch, p.src_rank, kAnswerIndex), control_, RecvLink(j) + kHelloBytes, 8));
  }
  for (size_t j = 0; j < recvs_.size(); ++j) {
    Pair& p = pairs_[recvs_[j]];
    const std::string from = absl::StrCat(destination_->relay_from != 0 ? "the previous replica" : "source rank ",
                                          destination_->relay_from != 0 ? "" : absl::StrCat(p.src_rank));
    RETURN_IF_ERROR(Await(
        *answers_in[j], options_,
        absl::StrCat("waiting for the resharding answer of ", from, " (do all ranks set the same map_peer_memory?)")));
    RETURN_IF_ERROR(Await(*hellos_out[j], options_, absl::StrCat("sending the resharding hello to ", from)));
    p.mapped = base_[RecvLink(j) + kHelloBytes] == 1;
  }
  // Our answers to the destinations we send to, and to the next replica.
  std::vector<std::unique_ptr<Completion>> answers_out;
  for (size_t k = 0; k < sends_.size(); ++k) {
    Pair& p = pairs_[sends_[k]];
    RETURN_IF_ERROR(Await(*hellos_in[k], options_,
                          absl::StrCat("waiting for destination rank ", p.peer_rank,
                                       "'s resharding hello (do all ranks set the same map_peer_memory?)")));
    v1::RemoteMemoryDescriptor d;
    ASSIGN_OR_RETURN(bool ok, ParseHello(*hellos_in[k], SendLink(k), &d));
    if (ok && host && source_->shard.kind == transport::MemoryKind::kHost) {
      auto m = Map(p.peer, d);
      if (m.ok() && (*m)->length() >= plan_.dst_shard_bytes[p.peer_rank]) {
        p.mapping = *m;
        p.mapped = true;
      }
    }
    base_[SendLink(k) + kHelloBytes] = p.mapped ? 1 : 0;
    answers_out.push_back(
        t_.Send(p.peer, TagOf(options_.tag_epoch, p.src_rank, kAnswerIndex), control_, SendLink(k) + kHelloBytes, 1));
  }
  if (forward_) {
    for (size_t j = 0; j < recvs_.size(); ++j) {
      const Pair& p = pairs_[recvs_[j]];
      base_[ForwardLink(j) + kHelloBytes] = p.mapped ? 1 : 0;  // forwards as it receives
      answers_out.push_back(t_.Send(destination_->forward_to, TagOf(options_.tag_epoch, p.src_rank, kAnswerIndex),
                                    control_, ForwardLink(j) + kHelloBytes, 1));
    }
  }
  for (auto& c : answers_out) RETURN_IF_ERROR(Await(*c, options_, "sending a resharding answer"));
  for (const Pair& p : pairs_) stats_.mapped_pairs += p.mapped ? (!p.send && forward_ ? 2 : 1) : 0;
  return absl::OkStatus();
}

// Moves every mapped pair's bytes, round by round: a sender stores round k into the
// destination's shard (digest in the same pass) and sends its notice; a receiver waits
// for round k's notice and, as a relay, stores the round into the next replica's
// shard and passes the notice on.
absl::Status MappedRun::Run() {
  const uint64_t table = (sends_.size() + 2 * recvs_.size()) * kLinkBytes;
  auto* round_index = reinterpret_cast<uint64_t*>(base_ + table);
  for (uint64_t k = 0; k < rounds_; ++k) round_index[k] = k;
  uint64_t notice_at = table + (rounds_ + 1) * 8;
  std::vector<std::vector<std::unique_ptr<Completion>>> notices(recvs_.size());
  absl::Cleanup withdraw = [&] {  // (see Negotiate)
    for (auto& list : notices) {
      for (auto& c : list) c->Cancel();
    }
  };
  for (size_t j = 0; j < recvs_.size(); ++j) {
    const Pair& p = pairs_[recvs_[j]];
    if (!p.mapped) continue;
    for (uint64_t k = 0; k < p.rounds(); ++k, notice_at += 8) {
      notices[j].push_back(
          t_.Recv(p.peer, TagOf(options_.tag_epoch, p.src_rank, NoticeIndex(k)), control_, notice_at, 8));
    }
  }
  const bool digests = options_.digests && source_ != nullptr;
  const auto* src_base = source_ != nullptr ? static_cast<const uint8_t*>(source_->shard.base) : nullptr;
  const auto* dst_base = destination_ != nullptr ? static_cast<const uint8_t*>(destination_->shard.base) : nullptr;
  std::vector<std::unique_ptr<Completion>> sent;
  // As a source: every mapped pair's pieces in source order, so that each byte of the
  // shard is read once, front to back, whichever destination it goes to (a column
  // split sends each row's halves to two ranks: two passes over it run at half
  // speed). A pair's round is announced as soon as its last piece is stored.
  std::vector<Cursor> cursors;
  for (size_t i : sends_) {
    const Pair& p = pairs_[i];
    if (!p.mapped) continue;
    cursors.push_back({&p, 0, 0, p.messages.size()});
    for (const Message& m : p.messages) stats_.bytes_sent += m.wire_bytes;
    stats_.messages += p.messages.size();
  }
  std::vector<uint64_t> round_of(cursors.size(), 0);  // each cursor's current round
  while (true) {
    Cursor* next = nullptr;
    for (Cursor& c : cursors) {
      if (!c.done() && (next == nullptr || c.piece().src_offset < next->piece().src_offset)) next = &c;
    }
    if (next == nullptr) break;
    const Range& piece = next->piece();
    const int slot = next->pair->peer_rank;
    uint8_t* to = next->pair->mapping->data() + piece.dst_offset;
    const uint8_t* from = src_base + piece.src_offset;
    if (piece.cast()) {
      ops_.CastF32ToBf16(to, from, piece.elements);
      if (digests) ops_.AddDigest(slot, to, piece.dst_bytes(), piece.dst_offset);
    } else if (digests) {
      ops_.CopyAndDigest(slot, to, from, piece.dst_bytes(), piece.dst_offset);
    } else {
      ops_.Copy(to, from, piece.dst_bytes());
    }
    next->Advance();
    const size_t c = next - cursors.data();
    const Pair& p = *next->pair;
    if (next->index == 0 && next->message == p.round_start[round_of[c] + 1]) {
      RETURN_IF_ERROR(ops_.Sync());
      StoreFence();
      sent.push_back(t_.Send(p.peer, TagOf(options_.tag_epoch, p.src_rank, NoticeIndex(round_of[c])), control_,
                             table + 8 * round_of[c], 8));
      ++round_of[c];
    }
  }
  // As a destination: each round's notice, in order; a relay stores the round into
  // the next replica's shard and passes the notice on.
  for (uint64_t k = 0; k < rounds_; ++k) {
    std::vector<const Pair*> told;
    for (size_t j = 0; j < recvs_.size(); ++j) {
      const Pair& p = pairs_[recvs_[j]];
      if (!p.mapped || k >= p.rounds()) continue;
      RETURN_IF_ERROR(Await(
          *notices[j][k], options_,
          absl::StrCat("resharding round ", k, " of ", p.rounds(), " from source rank ", p.src_rank, " (mapped)")));
      for (size_t m = p.round_start[k]; m < p.round_start[k + 1]; ++m) {
        stats_.bytes_received += p.messages[m].wire_bytes;
        ++stats_.messages;
        if (options_.verify_received) AddReceivedDigest(ops_, plan_.dst.ranks, dst_base, p.messages[m].pieces);
        if (!forward_) continue;
        ForEachDestinationRun(p.messages[m].pieces, [&](uint64_t offset, uint64_t bytes) {
          ops_.Copy(forward_mapping_->data() + offset, dst_base + offset, bytes);
        });
        stats_.bytes_forwarded += p.messages[m].wire_bytes;
      }
      if (forward_) told.push_back(&p);
    }
    if (!told.empty()) {
      RETURN_IF_ERROR(ops_.Sync());
      StoreFence();
      for (const Pair* p : told) {
        sent.push_back(t_.Send(destination_->forward_to, TagOf(options_.tag_epoch, p->src_rank, NoticeIndex(k)),
                               control_, table + 8 * k, 8));
      }
    }
  }
  for (auto& c : sent) RETURN_IF_ERROR(Await(*c, options_, "sending a resharding round notice"));
  return absl::OkStatus();
}

// A hello: whether its sender accepts the mapped path, and its shard's descriptor.
absl::StatusOr<bool> MappedRun::ParseHello(Completion& c, uint64_t offset, v1::RemoteMemoryDescriptor* d) {
  const uint64_t n = c.bytes();
  if (n < 1) return absl::DataLossError("an empty resharding hello");
  const uint8_t* hello = base_ + offset;
  if (hello[0] == 0) return false;
  if (!d->ParseFromArray(hello + 1, static_cast<int>(n - 1))) {
    return absl::DataLossError("a resharding hello with a malformed memory descriptor");
  }
  return true;
}

// The pool's cached mapping, or one of this run's own.
absl::StatusOr<transport::RemoteMapping*> MappedRun::Map(PeerId peer, const v1::RemoteMemoryDescriptor& d) {
  if (options_.staging_pool != nullptr) return options_.staging_pool->Map(peer, d);
  ASSIGN_OR_RETURN(std::unique_ptr<transport::RemoteMapping> m, t_.MapRemote(peer, d));
  owned_.push_back(std::move(m));
  return owned_.back().get();
}

}  // namespace rlfleet::reshard::internal
