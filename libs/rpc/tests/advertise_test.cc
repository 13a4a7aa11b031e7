// What a service advertises: its bound address, --advertise_address, or (bound to every
// interface) the address that routes towards its registry, never loopback while this
// host has another address; and a server bound to 0.0.0.0 registers that address.
#include "libs/rpc/advertise.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libs/common/hosts.h"
#include "libs/rpc/server_runner.h"
#include "libs/rpc/tests/echo_service.h"

namespace rlfleet::rpc {
namespace {

TEST(Advertise, WildcardsAndLoopback) {
  for (const char* h : {"", "0.0.0.0", "::", "[::]"}) EXPECT_TRUE(IsWildcardHost(h)) << h;
  for (const char* h : {"127.0.0.1", "10.0.0.1", "::1", "host"}) EXPECT_FALSE(IsWildcardHost(h)) << h;
  for (const char* h : {"127.0.0.1", "127.1.2.3", "::1"}) EXPECT_TRUE(common::IsLoopbackHost(h)) << h;
  for (const char* h : {"10.0.0.1", "::2", "0.0.0.0"}) EXPECT_FALSE(common::IsLoopbackHost(h)) << h;
}

TEST(Advertise, TheRouteTowardsATargetIsReadBackFromTheKernel) {
  for (const char* target : {"127.0.0.1:7000", "127.0.0.1", "dns:///127.0.0.1:7000", "ipv4:127.0.0.1:1"}) {
    absl::StatusOr<std::string> source = SourceAddressTowards(target);
    ASSERT_TRUE(source.ok()) << target << ": " << source.status();
    EXPECT_EQ(*source, "127.0.0.1") << target;
  }
  absl::StatusOr<std::string> v6 = SourceAddressTowards("[::1]:7000");
  if (v6.ok()) {  // (a host without IPv6 has no route: fine)
    EXPECT_EQ(*v6, "::1");
  }
  EXPECT_EQ(SourceAddressTowards("0.0.0.0:7000").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SourceAddressTowards("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Advertise, TheFlagWinsThenTheBoundAddressThenTheRoute) {
  std::string why;
  EXPECT_EQ(*AdvertisedHost("0.0.0.0", "10.1.2.3", "127.0.0.1:7000", &why), "10.1.2.3");
  EXPECT_EQ(*AdvertisedHost("0.0.0.0", "[fd00::5]", "", &why), "fd00::5");
  EXPECT_EQ(*AdvertisedHost("127.0.0.1", "", "", &why), "127.0.0.1");
  EXPECT_EQ(*AdvertisedHost("[::1]", "", "", &why), "::1");
  EXPECT_TRUE(why.empty()) << why;
  auto wildcard = AdvertisedHost("0.0.0.0", "0.0.0.0", "", &why);
  EXPECT_EQ(wildcard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(wildcard.status().message(), "--advertise_address=0.0.0.0")) << wildcard.status();
}

// Bound to every interface with the registry on loopback: this host's own address, not
// 127.0.0.1 (peers on other hosts learn the address from the registry); only a host
// with no other interface falls back to loopback, saying so.
TEST(Advertise, BoundToEveryInterfaceIsNeverLoopbackWhileThereIsAnotherAddress) {
  absl::StatusOr<std::string> first = FirstNonLoopbackAddress();
  for (const char* route_to : {"127.0.0.1:7000", ""}) {
    std::string why;
    absl::StatusOr<std::string> host = AdvertisedHost("0.0.0.0", "", route_to, &why);
    ASSERT_TRUE(host.ok()) << host.status();
    if (first.ok()) {
      EXPECT_EQ(*host, *first) << route_to;
      EXPECT_FALSE(common::IsLoopbackHost(*host)) << route_to;
      EXPECT_TRUE(why.empty()) << why;
    } else {
      EXPECT_EQ(*host, "127.0.0.1");
      EXPECT_TRUE(absl::StrContains(why, "only this host can reach it")) << why;
    }
  }
}

TEST(Advertise, AServerBoundToEveryInterfaceRegistersTheAdvertisedAddress) {
  ServerOptions options;
  options.host = "0.0.0.0";
  options.advertise_host = "10.9.8.7";
  testing::EchoServiceImpl service{CallAuth{}};
  ServerRunner runner(options);
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  EXPECT_EQ(runner.address(), absl::StrCat("10.9.8.7:", runner.port()));
  runner.Shutdown();

  ServerOptions bad;
  bad.host = "0.0.0.0";
  bad.advertise_host = "::";
  testing::EchoServiceImpl other{CallAuth{}};
  ServerRunner refused(bad);
  refused.AddService(&other);
  absl::Status s = refused.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

}  // namespace
}  // namespace rlfleet::rpc
