#include "libs/rpc/status_conversion.h"

#include "gtest/gtest.h"

namespace rlfleet::rpc {
namespace {

TEST(StatusConversion, EveryCanonicalCodeRoundTrips) {
  for (int code = 1; code <= 16; ++code) {
    absl::Status in(static_cast<absl::StatusCode>(code), "message " + std::to_string(code));
    grpc::Status g = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(g.error_message(), "message " + std::to_string(code));
    EXPECT_EQ(ToAbslStatus(g), in);
  }
}

TEST(StatusConversion, OkStaysOkAndNamedCodesMatch) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(ToAbslStatus(grpc::Status::OK).ok());
  EXPECT_EQ(ToGrpcStatus(absl::UnauthenticatedError("x")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("x")).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToAbslStatus(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "x")).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(StatusConversion, NonCanonicalCodeBecomesUnknown) {
  // 20: not a canonical code, yet a value grpc::StatusCode can hold (its values
  // 0..16 make 0..31 the enum's range; 99 would be undefined behaviour, as UBSan says).
  absl::Status s = ToAbslStatus(grpc::Status(static_cast<grpc::StatusCode>(20), "odd"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(s.message(), "odd");
}

}  // namespace
}  // namespace rlfleet::rpc
