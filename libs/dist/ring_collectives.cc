#include "libs/dist/ring_collectives.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"

namespace rlfleet::dist {

const char* WirePrecisionName(WirePrecision p) {
  switch (p) {
    case WirePrecision::kFp32:
      return "fp32";
    case WirePrecision::kBf16:
      return "bf16";
    case WirePrecision::kFp16:
      return "fp16";
  }
  return "?";
}

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float FromBf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t ToFp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow (>= 65520) -> inf
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // under half the smallest subnormal
    const uint32_t exponent = abs >> 23, mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14 + (127 - exponent) - 1 + ... (to 10 mantissa bits)
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1), midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((abs >> 13) - (112u << 10));  // rebias exponent 127 -> 15
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float FromFp16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, u;
  if (exponent == 0) {
    if (mantissa == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exponent = 113;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      u = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else if (exponent == 31) {
    u = sign | 0x7f800000u | (mantissa << 13);
  } else {
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace {

using transport::Completion;
using transport::MemoryHandle;
using transport::Transport;

// A host buffer registered with every transport this rank uses; deregistered at the end.
class Registered {
 public:
  Registered(const Links& links, void* base, uint64_t bytes) {
    for (size_t r = 0; r < links.transport.size(); ++r) {
      Transport* t = links.transport[r];
      if (t == nullptr || static_cast<int>(r) == links.rank || handles_.count(t)) continue;
      auto h = t->RegisterMemory(base, std::max<uint64_t>(bytes, 1));
      if (!h.ok()) {
        status_ = h.status();
        return;
      }
      handles_[t] = *h;
    }
  }
  ~Registered() {
    for (auto& [t, h] : handles_) (void)t->DeregisterMemory(h);
  }
  const absl::Status& status() const { return status_; }
  const MemoryHandle& on(Transport* t) const { return handles_.at(t); }

 private:
  std::map<Transport*, MemoryHandle> handles_;
  absl::Status status_;
};

}  // namespace

// This rank's buffers for collectives of up to `capacity` elements: a working copy of
// the data, a receive buffer, and the 16-bit staging buffers, each registered with the
// transports used.
struct CollectiveBuffers::Set {
  Set(const Links& links, size_t capacity)
      : transports(links.transport),
        work(capacity),
        scratch(capacity),
        send16(capacity),
        recv16(capacity),
        data_reg(links, work.data(), work.size() * 4),
        scratch_reg(links, scratch.data(), scratch.size() * 4),
        send16_reg(links, send16.data(), send16.size() * 2),
        recv16_reg(links, recv16.data(), recv16.size() * 2) {}
  absl::Status status() const {
    for (const Registered* r : {&data_reg, &scratch_reg, &send16_reg, &recv16_reg}) {
      if (!r->status().ok()) return r->status();
    }
    return absl::OkStatus();
  }
  const std::vector<Transport*> transports;  // what the buffers are registered with
  std::vector<float> work;                   // (never resized: registered)
  std::vector<float> scratch;
  std::vector<uint16_t> send16, recv16;
  Registered data_reg, scratch_reg, send16_reg, recv16_reg;
};

CollectiveBuffers::CollectiveBuffers() = default;
CollectiveBuffers::~CollectiveBuffers() = default;

std::unique_ptr<CollectiveBuffers::Set> CollectiveBuffers::Take(size_t elements,
                                                                const std::vector<Transport*>& transports) {
  absl::MutexLock lock(&mu_);
  if (kept_ == nullptr || kept_->work.size() < elements || kept_->transports != transports) return nullptr;
  return std::move(kept_);
}

size_t CollectiveBuffers::kept_elements() {
  absl::MutexLock lock(&mu_);
  return kept_ == nullptr ? 0 : kept_->work.size();
}

void CollectiveBuffers::Give(std::unique_ptr<Set> set) {
  absl::MutexLock lock(&mu_);
  if (kept_ == nullptr || kept_->work.size() < set->work.size()) kept_ = std::move(set);
}

namespace {

using Buffers = CollectiveBuffers::Set;

// Runs `body` over a working copy of `data` (in the buffers `links` keeps, when they
// fit) and copies the result back. When it fails, transfers it posted may still be in
// flight (a peer that is late, not dead, writes into them afterwards): the buffers are
// then left allocated and registered on purpose, never freed or reused under a transfer.
absl::Status WithBuffers(absl::Span<float> data, const Links& links,
                         const std::function<absl::Status(Buffers&)>& body) {
  std::unique_ptr<Buffers> b;
  if (links.buffers != nullptr) b = links.buffers->Take(data.size(), links.transport);
  if (b == nullptr) {
    b = std::make_unique<Buffers>(links, data.size());
    RETURN_IF_ERROR(b->status());
  }
  std::copy(data.begin(), data.end(), b->work.begin());
  absl::Status s = body(*b);
  if (!s.ok()) {
    b.release();  // NOLINT: deliberately leaked (see above)
    return s;
  }
  std::copy(b->work.begin(), b->work.begin() + data.size(), data.begin());
  if (links.buffers != nullptr) links.buffers->Give(std::move(b));
  return absl::OkStatus();
}

uint16_t Encode(WirePrecision p, float f) { return p == WirePrecision::kBf16 ? ToBf16(f) : ToFp16(f); }
float Decode(WirePrecision p, uint16_t h) { return p == WirePrecision::kBf16 ? FromBf16(h) : FromFp16(h); }

absl::Status WaitFor(Completion& c, const CollectiveOptions& options, const std::string& what) {
  absl::Status s = c.Wait(options.timeout);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// Sends data[offset, +count) to `to` and receives `count` elements from `from` into
// `out` (which is either added into data[recv_offset...] or copied there), in the wire
// precision.
absl::Status Exchange(std::vector<float>& data, Buffers& b, const Links& links, const CollectiveOptions& options,
                      WirePrecision precision, uint64_t tag, int to, size_t send_offset, size_t send_count, int from,
                      size_t recv_offset, size_t recv_count, bool add) {
  Transport* tx = links.transport[to];
  Transport* rx = links.transport[from];
  // An empty chunk (fewer elements than ranks) is neither sent nor received: the sender
  // and the receiver of a chunk compute the same size for it.
  std::unique_ptr<Completion> recv, send;
  if (precision == WirePrecision::kFp32) {
    if (recv_count > 0) recv = rx->Recv(links.peer[from], tag, b.scratch_reg.on(rx), recv_offset * 4, recv_count * 4);
    if (send_count > 0) send = tx->Send(links.peer[to], tag, b.data_reg.on(tx), send_offset * 4, send_count * 4);
  } else {
    for (size_t i = 0; i < send_count; ++i) b.send16[send_offset + i] = Encode(precision, data[send_offset + i]);
    if (recv_count > 0) recv = rx->Recv(links.peer[from], tag, b.recv16_reg.on(rx), recv_offset * 2, recv_count * 2);
    if (send_count > 0) send = tx->Send(links.peer[to], tag, b.send16_reg.on(tx), send_offset * 2, send_count * 2);
  }
  if (send != nullptr) {
    RETURN_IF_ERROR(WaitFor(*send, options, absl::StrCat("rank ", links.rank, ": sending to rank ", to)));
  }
  if (recv != nullptr) {
    RETURN_IF_ERROR(WaitFor(*recv, options, absl::StrCat("rank ", links.rank, ": receiving from rank ", from)));
  }
  for (size_t i = 0; i < recv_count; ++i) {
    const float v =
        precision == WirePrecision::kFp32 ? b.scratch[recv_offset + i] : Decode(precision, b.recv16[recv_offset + i]);
    data[recv_offset + i] = add ? data[recv_offset + i] + v : v;
  }
  return absl::OkStatus();
}

// A ring's view of one rank: its position, neighbours, and the chunking of the element
// range [base, base + count) into one chunk per ring position.
struct RingPlan {
  int k = 1, pos = 0, next = 0, prev = 0;
  size_t base = 0, count = 0;
  size_t begin(int c) const { return base + static_cast<size_t>(c) * count / k; }
  size_t size(int c) const { return begin(c + 1) - begin(c); }
  int mod(int x) const { return ((x % k) + k) % k; }
  // After the reduce-scatter this rank holds the complete sum of this chunk.
  int owned() const { return mod(pos + 1); }
};

absl::StatusOr<RingPlan> PlanRing(const std::vector<int>& ring, int rank, size_t base, size_t count) {
  const auto it = std::find(ring.begin(), ring.end(), rank);
  if (it == ring.end()) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in the ring"));
  RingPlan p;
  p.k = static_cast<int>(ring.size());
  p.pos = static_cast<int>(it - ring.begin());
  p.next = ring[(p.pos + 1) % p.k];
  p.prev = ring[(p.pos + p.k - 1) % p.k];
  p.base = base;
  p.count = count;
  return p;
}

absl::Status ReduceScatter(std::vector<float>& data, Buffers& b, const RingPlan& p, const Links& links,
                           const CollectiveOptions& options, WirePrecision precision, uint64_t tag) {
  for (int s = 0; s < p.k - 1; ++s) {
    const int send_c = p.mod(p.pos - s), recv_c = p.mod(p.pos - s - 1);
    RETURN_IF_ERROR(Exchange(data, b, links, options, precision, tag, p.next, p.begin(send_c), p.size(send_c), p.prev,
                             p.begin(recv_c), p.size(recv_c), /*add=*/true));
  }
  if (precision != WirePrecision::kFp32 && p.k > 1) {
    // The chunk this rank owns goes out rounded: round it here too, so every rank
    // ends with the same bits.
    const int own = p.owned();
    for (size_t i = p.begin(own); i < p.begin(own) + p.size(own); ++i)
      data[i] = Decode(precision, Encode(precision, data[i]));
  }
  return absl::OkStatus();
}

absl::Status AllGather(std::vector<float>& data, Buffers& b, const RingPlan& p, const Links& links,
                       const CollectiveOptions& options, WirePrecision precision, uint64_t tag) {
  for (int s = 0; s < p.k - 1; ++s) {
    const int send_c = p.mod(p.pos + 1 - s), recv_c = p.mod(p.pos - s);
    RETURN_IF_ERROR(Exchange(data, b, links, options, precision, tag, p.next, p.begin(send_c), p.size(send_c), p.prev,
                             p.begin(recv_c), p.size(recv_c), /*add=*/false));
  }
  return absl::OkStatus();
}

absl::Status Ring(std::vector<float>& data, Buffers& b, const std::vector<int>& ring, const Links& links,
                  const CollectiveOptions& options, WirePrecision precision, uint64_t tag, size_t base, size_t count) {
  ASSIGN_OR_RETURN(RingPlan p, PlanRing(ring, links.rank, base, count));
  RETURN_IF_ERROR(ReduceScatter(data, b, p, links, options, precision, tag));
  return AllGather(data, b, p, links, options, precision, tag);
}

}  // namespace

absl::Status RingAllReduce(absl::Span<float> data, const std::vector<int>& ring, const Links& links,
                           const CollectiveOptions& options) {
  return WithBuffers(data, links, [&](Buffers& b) {
    return Ring(b.work, b, ring, links, options, options.precision, options.tag << 2, 0, data.size());
  });
}

absl::Status HierarchicalAllReduce(absl::Span<float> data, const Topology& topology, const Links& links,
                                   const CollectiveOptions& options) {
  if (links.rank < 0 || links.rank >= static_cast<int>(topology.node_of.size())) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", links.rank, " is not in the topology"));
  }
  const std::vector<int>& members = topology.node_ranks[topology.node_of[links.rank]];
  for (const std::vector<int>& node : topology.node_ranks) {
    if (node.size() != members.size()) {
      return absl::InvalidArgumentError("hierarchical all-reduce needs the same number of ranks on every node");
    }
  }
  const uint64_t tag = options.tag << 2;
  ASSIGN_OR_RETURN(RingPlan node, PlanRing(members, links.rank, 0, data.size()));
  return WithBuffers(data, links, [&](Buffers& b) -> absl::Status {
    // 1. Inside the node (fast links, fp32): a reduce-scatter leaves each rank with its
    //    node's sum of one slice.
    RETURN_IF_ERROR(ReduceScatter(b.work, b, node, links, options, WirePrecision::kFp32, tag + 1));
    // 2. Across nodes: the ranks that hold the same slice (one per node: a rail)
    //    all-reduce it; every node's NIC carries 1 / (ranks per node) of the data.
    const int own = node.owned();
    RETURN_IF_ERROR(Ring(b.work, b, topology.rails[node.pos], links, options, options.precision, tag + 2,
                         node.begin(own), node.size(own)));
    // 3. Inside the node again: an all-gather of the finished slices.
    return AllGather(b.work, b, node, links, options, WirePrecision::kFp32, tag + 3);
  });
}

}  // namespace rlfleet::dist
