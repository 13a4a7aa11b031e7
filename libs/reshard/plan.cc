#include "libs/reshard/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace rlfleet::reshard {
namespace {

constexpr uint64_t kPartAlign = 16;

uint64_t AlignUp(uint64_t n) { return (n + kPartAlign - 1) / kPartAlign * kPartAlign; }

uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// [first, last) of `extent` items for rank `rank` of `ranks` (torch.chunk's split).
std::pair<uint64_t, uint64_t> ChunkBounds(uint64_t extent, int ranks, int rank) {
  const uint64_t c = CeilDiv(extent, static_cast<uint64_t>(ranks));
  const uint64_t first = std::min(extent, c * rank);
  const uint64_t last = std::min(extent, c * (rank + 1));
  return {first, last};
}

absl::Status CheckLayout(const char* side, const Layout& layout, const std::vector<TensorSpec>& tensors) {
  if (layout.ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(side, " layout: ranks must be >= 1, got ", layout.ranks));
  }
  if (layout.splits.size() != tensors.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(side, " layout: ", layout.splits.size(), " splits for ", tensors.size(), " tensors"));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (layout.splits[i] == Split::kColumns && tensors[i].shape.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(side, " layout: tensor '", tensors[i].name, "' has ",
                                                     tensors[i].shape.size(),
                                                     " dimension(s); kColumns needs 2 or more"));
    }
  }
  return absl::OkStatus();
}

// Computes where every tensor's part sits in each rank's shard buffer.
void PlaceParts(const std::vector<TensorSpec>& tensors, const Layout& layout, const std::vector<DType>& dtypes,
                std::vector<std::vector<ShardPart>>* parts, std::vector<uint64_t>* shard_bytes) {
  parts->assign(layout.ranks, std::vector<ShardPart>(tensors.size()));
  shard_bytes->assign(layout.ranks, 0);
  for (int r = 0; r < layout.ranks; ++r) {
    uint64_t offset = 0;
    for (size_t t = 0; t < tensors.size(); ++t) {
      uint64_t elements = 0;
      for (const Interval& iv : PartIntervals(tensors[t], layout.splits[t], layout.ranks, r)) {
        elements += iv.count;
      }
      offset = AlignUp(offset);
      (*parts)[r][t] = ShardPart{offset, elements, dtypes[t]};
      offset += elements * DTypeSize(dtypes[t]);
    }
    (*shard_bytes)[r] = offset;
  }
}

void Append(std::vector<Range>* out, const Range& r) {
  if (!out->empty()) {
    Range& last = out->back();
    if (last.src_elem == r.src_elem && last.dst_elem == r.dst_elem &&
        last.src_offset + last.src_bytes() == r.src_offset && last.dst_offset + last.dst_bytes() == r.dst_offset) {
      last.elements += r.elements;
      return;
    }
  }
  out->push_back(r);
}

}  // namespace

const char* SplitName(Split split) {
  switch (split) {
    case Split::kFlat:
      return "flat";
    case Split::kRows:
      return "rows";
    case Split::kColumns:
      return "columns";
    case Split::kReplicated:
      return "replicated";
  }
  return "?";
}

uint64_t TensorSpec::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Layout Layout::Fsdp(int ranks, size_t num_tensors) {
  return Layout{ranks, std::vector<Split>(num_tensors, Split::kFlat)};
}

Layout Layout::Tp(int ranks, std::vector<Split> per_tensor) { return Layout{ranks, std::move(per_tensor)}; }

std::vector<Interval> PartIntervals(const TensorSpec& spec, Split split, int ranks, int rank) {
  const uint64_t numel = spec.numel();
  std::vector<Interval> out;
  switch (split) {
    case Split::kReplicated:
      out.push_back({0, numel, 0});
      break;
    case Split::kFlat: {
      auto [first, last] = ChunkBounds(numel, ranks, rank);
      if (last > first) out.push_back({first, last - first, 0});
      break;
    }
    case Split::kRows: {
      const uint64_t rows = static_cast<uint64_t>(spec.shape[0]);
      const uint64_t row = numel / rows;
      auto [first, last] = ChunkBounds(rows, ranks, rank);
      if (last > first) out.push_back({first * row, (last - first) * row, 0});
      break;
    }
    case Split::kColumns: {
      const uint64_t outer = static_cast<uint64_t>(spec.shape[0]);
      const uint64_t cols = static_cast<uint64_t>(spec.shape[1]);
      const uint64_t inner = numel / outer / cols;
      auto [first, last] = ChunkBounds(cols, ranks, rank);
      if (last == first) break;
      const uint64_t width = (last - first) * inner;
      out.reserve(outer);
      for (uint64_t o = 0; o < outer; ++o) {
        out.push_back({o * cols * inner + first * inner, width, o * width});
      }
      break;
    }
  }
  return out;
}

uint64_t Plan::BytesNeeded() const {
  uint64_t n = 0;
  for (const auto& rank : dst_parts) {
    for (const ShardPart& part : rank) n += part.elements * DTypeSize(part.dtype);
  }
  return n;
}

uint64_t Plan::BytesMoved() const {
  uint64_t n = 0;
  for (const auto& pair : ranges) {
    for (const Range& r : pair) n += r.dst_bytes();
  }
  return n;
}

uint64_t Plan::RangeCount() const {
  uint64_t n = 0;
  for (const auto& pair : ranges) n += pair.size();
  return n;
}

absl::StatusOr<uint64_t> CheckedElements(absl::string_view what, absl::Span<const int64_t> shape) {
  if (shape.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " has no dimensions"));
  uint64_t elements = 1;
  for (int64_t d : shape) {
    if (d <= 0) return absl::InvalidArgumentError(absl::StrCat(what, " has a non-positive dimension ", d));
    // (overflow-checked: numel() and every byte offset multiply these)
    if (static_cast<uint64_t>(d) > kMaxPlanElements / elements) {
      return absl::InvalidArgumentError(absl::StrCat(what, " has more than 2^40 elements"));
    }
    elements *= static_cast<uint64_t>(d);
  }
  return elements;
}

double PlanCost(const std::vector<TensorSpec>& tensors, const Layout& src, const Layout& dst) {
  // Intervals one rank's part of a tensor has: a row per outer index for columns.
  auto pieces = [](const TensorSpec& t, Split split) -> double {
    return split == Split::kColumns ? static_cast<double>(t.shape[0]) : 1.0;
  };
  const double s = src.ranks, d = dst.ranks;
  double cost = s * d + (s + d) * tensors.size();
  for (size_t t = 0; t < tensors.size(); ++t) {
    const double ps = pieces(tensors[t], src.splits[t]);
    const double supply = pieces(tensors[t], src.splits[t] == Split::kReplicated ? Split::kFlat : src.splits[t]);
    const double pd = pieces(tensors[t], dst.splits[t]);
    // placing both sides' parts, listing the owners, and every destination rank's walk
    cost += s * ps + d * pd + s * supply + d * (s * supply + pd);
  }
  return cost;
}

absl::StatusOr<Plan> MakePlan(const std::vector<TensorSpec>& tensors, const Layout& src, const Layout& dst,
                              const PlanOptions& options) {
  if (tensors.size() > kMaxPlanTensors) {
    return absl::InvalidArgumentError(absl::StrCat(tensors.size(), " tensors; a plan has at most ", kMaxPlanTensors));
  }
  for (const char* side : {"source", "destination"}) {
    const Layout& l = side[0] == 's' ? src : dst;
    if (l.ranks > kMaxPlanRanks) {
      return absl::InvalidArgumentError(
          absl::StrCat(side, " layout: ", l.ranks, " ranks; a plan has at most ", kMaxPlanRanks));
    }
  }
  for (const TensorSpec& t : tensors) {
    absl::StatusOr<uint64_t> elements = CheckedElements(absl::StrCat("tensor '", t.name, "'"), t.shape);
    if (!elements.ok()) return elements.status();
  }
  if (absl::Status s = CheckLayout("source", src, tensors); !s.ok()) return s;
  if (absl::Status s = CheckLayout("destination", dst, tensors); !s.ok()) return s;
  // The planning work is bounded before any of it is done or allocated.
  if (const double cost = PlanCost(tensors, src, dst); cost > static_cast<double>(kMaxPlanCost)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan from ", src.ranks, " to ", dst.ranks, " ranks over ", tensors.size(), " tensors costs ~",
                     cost, " interval steps; at most ", kMaxPlanCost, " (fewer ranks, or fewer column-split rows)"));
  }

  Plan plan;
  plan.tensors = tensors;
  plan.src = src;
  plan.dst = dst;
  plan.options = options;
  std::vector<DType> src_types, dst_types;
  for (const TensorSpec& t : tensors) {
    src_types.push_back(t.dtype);
    dst_types.push_back(options.cast_f32_to_bf16 && t.dtype == DType::kF32 ? DType::kBF16 : t.dtype);
  }
  PlaceParts(tensors, src, src_types, &plan.src_parts, &plan.src_shard_bytes);
  PlaceParts(tensors, dst, dst_types, &plan.dst_parts, &plan.dst_shard_bytes);
  plan.ranges.assign(static_cast<size_t>(src.ranks) * dst.ranks, {});

  struct Owned {
    Interval iv;
    int rank;
  };
  for (size_t t = 0; t < tensors.size(); ++t) {
    const uint32_t se = DTypeSize(src_types[t]);
    const uint32_t de = DTypeSize(dst_types[t]);
    // Who supplies each source element: the source parts partition the tensor (a
    // replicated source supplies its flat part).
    const Split supply = src.splits[t] == Split::kReplicated ? Split::kFlat : src.splits[t];
    std::vector<Owned> owners;
    for (int s = 0; s < src.ranks; ++s) {
      // A replicated source holds the whole tensor: its local index equals the global.
      for (Interval iv : PartIntervals(tensors[t], supply, src.ranks, s)) {
        if (src.splits[t] == Split::kReplicated) iv.local = iv.global;
        owners.push_back({iv, s});
      }
    }
    std::sort(owners.begin(), owners.end(), [](const Owned& a, const Owned& b) { return a.iv.global < b.iv.global; });

    for (int d = 0; d < dst.ranks; ++d) {
      const uint64_t dst_base = plan.dst_parts[d][t].offset;
      // Both lists are sorted by global element; walk them together.
      size_t o = 0;
      for (const Interval& want : PartIntervals(tensors[t], dst.splits[t], dst.ranks, d)) {
        uint64_t g = want.global;
        const uint64_t end = want.global + want.count;
        while (o < owners.size() && owners[o].iv.global + owners[o].iv.count <= g) ++o;
        while (g < end) {
          const Owned& own = owners[o];
          const uint64_t own_end = own.iv.global + own.iv.count;
          const uint64_t n = std::min(end, own_end) - g;
          Range r;
          r.src_offset = plan.src_parts[own.rank][t].offset + (own.iv.local + g - own.iv.global) * se;
          r.dst_offset = dst_base + (want.local + g - want.global) * de;
          r.elements = n;
          r.src_elem = se;
          r.dst_elem = de;
          Append(&plan.ranges[static_cast<size_t>(own.rank) * dst.ranks + d], r);
          g += n;
          if (g == own_end) ++o;
        }
      }
    }
  }
  return plan;
}

}  // namespace rlfleet::reshard
