#include "libs/reshard/plan.h"

#include <algorithm>
#include <iterator>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/reshard/cast.h"
#include "libs/reshard/digest.h"
#include "libs/reshard/tests/shards.h"

namespace rlfleet::reshard {
namespace {

using testing::ExpectedShard;

TEST(PlanTest, FsdpToColumnsByHand) {
  // A 4x6 f32 tensor: FSDP over 2 gives rank 0 rows 0-1 (elements 0..11); TP columns
  // over 2 gives destination 0 columns 0-2 of every row.
  std::vector<TensorSpec> tensors = {{"w", {4, 6}, DType::kF32}};
  auto plan = MakePlan(tensors, Layout::Fsdp(2, 1), Layout::Tp(2, {Split::kColumns}));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto& r = plan->Between(0, 0);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].src_offset, 0u);
  EXPECT_EQ(r[0].dst_offset, 0u);
  EXPECT_EQ(r[0].elements, 3u);
  EXPECT_EQ(r[1].src_offset, 24u);  // element 6 of rank 0's part
  EXPECT_EQ(r[1].dst_offset, 12u);  // row 1 of the destination part
  EXPECT_EQ(r[1].elements, 3u);
  EXPECT_EQ(plan->BytesNeeded(), 96u);
  EXPECT_EQ(plan->BytesMoved(), 96u);
}

TEST(PlanTest, MatchingFsdpAndRowsCoalesceToOneRangePerPair) {
  // 1-D and 2-D tensors whose flat halves are their row halves: each source sends one
  // coalesced range per tensor to its own destination and nothing to the other.
  std::vector<TensorSpec> tensors = {{"a", {8, 4}, DType::kF32}, {"b", {8, 4}, DType::kF32}};
  auto plan = MakePlan(tensors, Layout::Fsdp(2, 2), Layout::Tp(2, {Split::kRows, Split::kRows}));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->Between(0, 0).size(), 1u);  // both tensors' parts are adjacent: one range
  EXPECT_EQ(plan->Between(0, 1).size(), 0u);
  EXPECT_EQ(plan->Between(1, 0).size(), 0u);
  EXPECT_EQ(plan->Between(1, 1).size(), 1u);
  EXPECT_EQ(plan->Between(0, 0)[0].elements, 32u);
}

TEST(PlanTest, ReplicatedDestinationGetsEverythingOnce) {
  std::vector<TensorSpec> tensors = {{"ln", {10}, DType::kF32}};
  auto plan = MakePlan(tensors, Layout::Fsdp(3, 1), Layout::Tp(4, {Split::kReplicated}));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->BytesNeeded(), 4u * 40u);
  EXPECT_EQ(plan->BytesMoved(), plan->BytesNeeded());
}

TEST(PlanTest, RejectsBadInputNamingTheProblem) {
  std::vector<TensorSpec> tensors = {{"bias", {16}, DType::kF32}};
  auto columns = MakePlan(tensors, Layout::Fsdp(2, 1), Layout::Tp(2, {Split::kColumns}));
  EXPECT_EQ(columns.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(columns.status().message().find("'bias'"), std::string::npos);

  auto count = MakePlan(tensors, Layout::Fsdp(2, 2), Layout::Tp(2, {Split::kRows}));
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(count.status().message().find("2 splits for 1 tensors"), std::string::npos);

  auto ranks = MakePlan(tensors, Layout::Fsdp(0, 1), Layout::Tp(2, {Split::kRows}));
  EXPECT_EQ(ranks.status().code(), absl::StatusCode::kInvalidArgument);

  std::vector<TensorSpec> zero = {{"empty", {4, 0}, DType::kF32}};
  auto dims = MakePlan(zero, Layout::Fsdp(1, 1), Layout::Tp(1, {Split::kRows}));
  EXPECT_EQ(dims.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dims.status().message().find("'empty'"), std::string::npos);
}

// Random shapes, dtypes, splits and (D, T): applying the plan with plain copies
// reproduces every destination shard exactly; every destination byte is written once
// and padding never; bytes moved == bytes needed; each source only reads inside its
// own parts of the tensor it sends.
class PlanPropertyTest : public ::testing::TestWithParam<bool> {};

TEST_P(PlanPropertyTest, RandomLayoutsMoveExactlyTheNeededBytes) {
  const bool cast = GetParam();
  std::mt19937_64 rng(cast ? 7 : 11);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64};
  for (int iter = 0; iter < 300; ++iter) {
    SCOPED_TRACE(absl::StrCat("iteration ", iter));
    std::vector<TensorSpec> tensors;
    std::vector<Split> src_splits, dst_splits;
    const int n = pick(1, 6);
    for (int t = 0; t < n; ++t) {
      TensorSpec spec{absl::StrCat("t", t), {}, dtypes[pick(0, 4)]};
      const int ndim = pick(1, 3);
      for (int k = 0; k < ndim; ++k) spec.shape.push_back(pick(1, 17));
      const std::vector<Split> choices =
          ndim >= 2 ? std::vector<Split>{Split::kFlat, Split::kRows, Split::kColumns, Split::kReplicated}
                    : std::vector<Split>{Split::kFlat, Split::kRows, Split::kReplicated};
      src_splits.push_back(choices[pick(0, static_cast<int>(choices.size()) - 1)]);
      dst_splits.push_back(choices[pick(0, static_cast<int>(choices.size()) - 1)]);
      tensors.push_back(spec);
    }
    const Layout src{pick(1, 8), src_splits};
    const Layout dst{pick(1, 8), dst_splits};
    PlanOptions options;
    options.cast_f32_to_bf16 = cast;
    auto plan = MakePlan(tensors, src, dst, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->BytesMoved(), plan->BytesNeeded());

    std::vector<std::vector<uint8_t>> src_bufs;
    std::vector<std::vector<bool>> src_owned;
    for (int s = 0; s < src.ranks; ++s) {
      src_bufs.push_back(ExpectedShard(*plan, true, s));
      src_owned.emplace_back(src_bufs.back().size(), false);
      for (const ShardPart& part : plan->src_parts[s]) {
        for (uint64_t b = 0; b < part.elements * DTypeSize(part.dtype); ++b) {
          src_owned[s][part.offset + b] = true;
        }
      }
    }
    for (int d = 0; d < dst.ranks; ++d) {
      std::vector<uint8_t> got(plan->dst_shard_bytes[d], 0);
      std::vector<int> writes(got.size(), 0);
      for (int s = 0; s < src.ranks; ++s) {
        for (const Range& r : plan->Between(s, d)) {
          // The source reads only bytes of its own parts (a coalesced range may span
          // adjacent parts, never padding).
          for (uint64_t b = 0; b < r.src_bytes(); ++b) {
            ASSERT_TRUE(src_owned[s][r.src_offset + b])
                << "source " << s << " reads byte " << r.src_offset + b << " outside its parts";
          }
          ASSERT_LE(r.dst_offset + r.dst_bytes(), got.size());
          if (r.cast()) {
            CastF32ToBf16(got.data() + r.dst_offset, src_bufs[s].data() + r.src_offset, r.elements);
          } else {
            std::memcpy(got.data() + r.dst_offset, src_bufs[s].data() + r.src_offset, r.src_bytes());
          }
          for (uint64_t b = 0; b < r.dst_bytes(); ++b) ++writes[r.dst_offset + b];
        }
      }
      // Exactly once inside parts, never in padding.
      std::vector<int> want(got.size(), 0);
      for (const ShardPart& part : plan->dst_parts[d]) {
        for (uint64_t b = 0; b < part.elements * DTypeSize(part.dtype); ++b) want[part.offset + b] = 1;
      }
      ASSERT_EQ(writes, want) << "destination " << d;
      ASSERT_EQ(got, ExpectedShard(*plan, false, d)) << "destination " << d;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CastOrNot, PlanPropertyTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "CastF32ToBf16" : "SameDtype"; });

TEST(DigestTest, VectorAndPortableAgreeAndAreAdditive) {
  std::mt19937_64 rng(9);
  std::vector<uint8_t> data(4096 + 6);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (uint64_t bytes : {0u, 2u, 14u, 16u, 18u, 30u, 32u, 34u, 62u, 64u, 66u, 1000u, 4096u}) {
    // (the last offset puts unit indices past 2^32)
    for (uint64_t offset : {uint64_t{0}, uint64_t{2}, uint64_t{1000002}, uint64_t{10000000006}}) {
      const uint64_t want = DigestBytesPortable(data.data() + 2, bytes, offset);
      EXPECT_EQ(DigestBytes(data.data() + 2, bytes, offset), want) << bytes << " bytes at " << offset;
      EXPECT_EQ(DigestBytesUsing(DigestImpl::kAvx2, data.data() + 2, bytes, offset), want) << "AVX2";
      EXPECT_EQ(DigestBytesUsing(DigestImpl::kAvx512, data.data() + 2, bytes, offset), want) << "AVX-512";
    }
  }
  // Additive: the digest of a buffer is the sum of its parts' shares.
  const uint64_t whole = DigestBytes(data.data(), 4096, 0);
  EXPECT_EQ(whole, DigestBytes(data.data(), 1000, 0) + DigestBytes(data.data() + 1000, 3096, 1000));
  // Any single changed unit changes it.
  data[100] ^= 1;
  EXPECT_NE(whole, DigestBytes(data.data(), 4096, 0));
}

TEST(DigestTest, CopyAndDigestCopiesExactlyAndDigestsTheSame) {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> data(4096 + 6);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (uint64_t bytes : {0u, 2u, 14u, 30u, 32u, 34u, 66u, 1000u, 4096u}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{2}, uint64_t{10000000006}}) {
      const uint64_t want = DigestBytesPortable(data.data() + 2, bytes, offset);
      for (DigestImpl impl : {DigestImpl::kPortable, DigestImpl::kAvx2, DigestImpl::kAvx512}) {
        std::vector<uint8_t> out(bytes + 4, 0xee);
        EXPECT_EQ(CopyAndDigestUsing(impl, out.data() + 1, data.data() + 2, bytes, offset), want)
            << bytes << " bytes at " << offset << ", impl " << static_cast<int>(impl);
        EXPECT_TRUE(std::equal(data.begin() + 2, data.begin() + 2 + bytes, out.begin() + 1));
        EXPECT_EQ(out[0], 0xee);  // nothing written outside
        EXPECT_EQ(out[bytes + 1], 0xee);
      }
      std::vector<uint8_t> out(bytes + 1);
      EXPECT_EQ(CopyAndDigest(out.data(), data.data() + 2, bytes, offset), want);
    }
  }
}

TEST(PlanTest, LargeModelPlanIsSmall) {
  // A 32-layer model's worth of matrices, FSDP over 8 -> TP over 4: the plan has a few
  // ranges per tensor and pair, not per element or row, for row splits.
  std::vector<TensorSpec> tensors;
  std::vector<Split> splits;
  for (int l = 0; l < 32; ++l) {
    tensors.push_back({absl::StrCat("layer", l, ".w"), {4096, 4096}, DType::kBF16});
    splits.push_back(Split::kRows);
  }
  auto plan = MakePlan(tensors, Layout::Fsdp(8, tensors.size()), Layout::Tp(4, splits));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->BytesMoved(), plan->BytesNeeded());
  EXPECT_EQ(plan->BytesNeeded(), 32ull * 4096 * 4096 * 2);
  EXPECT_LE(plan->RangeCount(), 32u * 8u);
}

// The one dtype table: every enum value has its row, and each name and protobuf value
// leads back to it.
TEST(DTypeTable, EveryDTypeHasOneRowAndEveryNameLeadsBack) {
  const DType all[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64};
  EXPECT_EQ(std::size(kDTypes), std::size(all));
  for (DType d : all) {
    const DTypeRow& row = RowOf(d);
    EXPECT_EQ(row.dtype, d) << DTypeName(d);
    EXPECT_EQ(DTypeOfSafetensors(row.safetensors), d) << row.safetensors;
    EXPECT_EQ(DTypeOfProto(row.proto), d) << row.name;
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_STREQ(SafetensorsName(DType::kF16), "F16");
  EXPECT_FALSE(DTypeOfSafetensors("U8").has_value());
  EXPECT_FALSE(DTypeOfProto(v1::DTYPE_UNSPECIFIED).has_value());
}

}  // namespace
}  // namespace rlfleet::reshard
