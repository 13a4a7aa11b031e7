// Real gRPC servers on loopback ports picked by the kernel: binding, health, bearer
// token auth, TLS / mutual TLS, graceful drain, and client retries against a dead port.
#include "libs/rpc/server_runner.h"

#include <grpcpp/create_channel.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "libs/rpc/client.h"
#include "libs/rpc/tests/echo_service.h"

namespace rlfleet::rpc {
namespace {

using rlfleet::rpc::testing::EchoClient;
using rlfleet::rpc::testing::EchoServiceImpl;
using rlfleet::testing::EchoRequest;

EchoClient MakeClient(const std::string& target, AuthOptions auth = {}, absl::Duration timeout = absl::Seconds(10)) {
  ClientOptions options;
  options.target = target;
  options.auth = std::move(auth);
  options.default_timeout = timeout;
  auto channel = MakeChannel(options);
  EXPECT_TRUE(channel.ok()) << channel.status();
  return EchoClient(*channel, options);
}

EchoRequest Payload(const std::string& payload) {
  EchoRequest request;
  request.set_payload(payload);
  return request;
}

grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& target) {
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.status();
}

TEST(ServerRunner, PortZeroBindsAFreePortAndServes) {
  EchoServiceImpl service(CallAuth{});
  ServerOptions options;
  options.port_file = absl::StrCat(getenv("TEST_TMPDIR"), "/port");
  ServerRunner runner(options);
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  ASSERT_GT(runner.port(), 0);
  EXPECT_EQ(runner.address(), absl::StrCat("127.0.0.1:", runner.port()));

  std::ifstream port_file(options.port_file);
  int written = 0;
  port_file >> written;
  EXPECT_EQ(written, runner.port());

  EchoClient client = MakeClient(runner.address());
  auto response = client.Echo(Payload("hello"));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->payload(), "hello");
  EXPECT_EQ(Health(runner.address()), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST(ServerRunner, HandlerErrorsKeepTheirCodeAndMessage) {
  EchoServiceImpl service(CallAuth{});
  ServerRunner runner(ServerOptions{});
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  EchoClient client = MakeClient(runner.address());
  EchoRequest request = Payload("x");
  request.set_fail_with_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
  auto response = client.Echo(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(response.status().message(), "asked to fail"));
  EXPECT_EQ(service.calls(), 1);  // not retried
}

TEST(ServerRunner, PortInUseIsUnavailable) {
  EchoServiceImpl service(CallAuth{});
  ServerRunner first(ServerOptions{});
  first.AddService(&service);
  ASSERT_TRUE(first.Start().ok());
  ServerOptions same;
  same.port = first.port();
  ServerRunner second(same);
  EchoServiceImpl other(CallAuth{});
  second.AddService(&other);
  absl::Status status = second.Start();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

TEST(ServerRunner, BearerTokenIsRequiredWhenConfigured) {
  EchoServiceImpl service(CallAuth{"s3cret"});
  ServerOptions options;
  options.auth.token = "s3cret";
  ServerRunner runner(options);
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());

  auto anonymous = MakeClient(runner.address()).Echo(Payload("x"));
  EXPECT_EQ(anonymous.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(absl::StrContains(anonymous.status().message(), "missing")) << anonymous.status();

  AuthOptions wrong;
  wrong.token = "guess";
  auto guessed = MakeClient(runner.address(), wrong).Echo(Payload("x"));
  EXPECT_EQ(guessed.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(absl::StrContains(guessed.status().message(), "wrong bearer token"));

  AuthOptions right;
  right.token = "s3cret";
  auto ok = MakeClient(runner.address(), right).Echo(Payload("x"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->payload(), "x");
  EXPECT_EQ(service.calls(), 1);  // rejected calls never reached the handler

  // Probes need no token.
  EXPECT_EQ(Health(runner.address()), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST(ServerRunner, ControllerOnlyRpcsRefuseTheFleetToken) {
  CallAuth auth{"fleet-token", "admin-token", {}};
  EchoServiceImpl admin_only(auth, Role::kController);
  ServerOptions options;
  ServerRunner runner(options);
  runner.AddService(&admin_only);
  ASSERT_TRUE(runner.Start().ok());

  AuthOptions fleet;
  fleet.token = "fleet-token";
  auto denied = MakeClient(runner.address(), fleet).Echo(Payload("x"));
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << denied.status();
  EXPECT_TRUE(absl::StrContains(denied.status().message(), "Echo is a controller-only RPC")) << denied.status();
  EXPECT_EQ(MakeClient(runner.address()).Echo(Payload("x")).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(admin_only.calls(), 0);

  AuthOptions admin = fleet;
  admin.admin_token = "admin-token";  // the client sends the admin token instead
  auto ok = MakeClient(runner.address(), admin).Echo(Payload("x"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(admin_only.calls(), 1);
}

TEST(ServerRunner, TheAdminTokenAlsoGrantsFleetRpcs) {
  EchoServiceImpl fleet_rpc(CallAuth{"fleet-token", "admin-token", {}});
  ServerRunner runner(ServerOptions{});
  runner.AddService(&fleet_rpc);
  ASSERT_TRUE(runner.Start().ok());
  AuthOptions admin;
  admin.admin_token = "admin-token";
  EXPECT_TRUE(MakeClient(runner.address(), admin).Echo(Payload("x")).ok());
  AuthOptions wrong;
  wrong.token = "guess";
  EXPECT_EQ(MakeClient(runner.address(), wrong).Echo(Payload("x")).status().code(), absl::StatusCode::kUnauthenticated);
}

// The gateway's credential: inference RPCs (Generate, reading the registry) take it;
// fleet and controller-only RPCs refuse it by name; fleet and admin tokens still work.
TEST(ServerRunner, TheInferenceTokenGrantsInferenceRpcsOnly) {
  const CallAuth auth{"fleet-token", "admin-token", {}, "inference-token"};
  EchoServiceImpl inference_rpc(auth, Role::kInference);
  EchoServiceImpl fleet_rpc(auth, Role::kFleet);
  EchoServiceImpl admin_rpc(auth, Role::kController);
  AuthOptions inference;
  inference.token = "inference-token";  // (the gateway sends it as its --auth_token)
  AuthOptions fleet;
  fleet.token = "fleet-token";
  AuthOptions wrong;
  wrong.token = "guess";
  std::vector<std::unique_ptr<ServerRunner>> runners;  // (one server per service, all alive to the end)
  for (EchoServiceImpl* service : {&inference_rpc, &fleet_rpc, &admin_rpc}) {
    auto runner = std::make_unique<ServerRunner>(ServerOptions{});
    runner->AddService(service);
    ASSERT_TRUE(runner->Start().ok());
    const std::string address = runner->address();
    auto by_gateway = MakeClient(address, inference).Echo(Payload("x"));
    if (service == &inference_rpc) {
      EXPECT_TRUE(by_gateway.ok()) << by_gateway.status();
      EXPECT_TRUE(MakeClient(address, fleet).Echo(Payload("x")).ok());
    } else {
      EXPECT_EQ(by_gateway.status().code(), absl::StatusCode::kPermissionDenied) << by_gateway.status();
      EXPECT_TRUE(absl::StrContains(by_gateway.status().message(), "Echo is not open to the inference token"))
          << by_gateway.status();
    }
    // (a controller-only RPC answers any token but the admin's PERMISSION_DENIED, as before)
    EXPECT_EQ(MakeClient(address, wrong).Echo(Payload("x")).status().code(),
              service == &admin_rpc ? absl::StatusCode::kPermissionDenied : absl::StatusCode::kUnauthenticated);
    runners.push_back(std::move(runner));
  }
  EXPECT_EQ(inference_rpc.calls(), 2);
  EXPECT_EQ(fleet_rpc.calls(), 0);
  EXPECT_EQ(admin_rpc.calls(), 0);
}

TEST(ServerRunner, ShutdownDrainsInFlightCallsAndRefusesNewOnes) {
  EchoServiceImpl service(CallAuth{});
  ServerOptions options;
  options.drain_timeout = absl::Seconds(20);
  ServerRunner runner(options);
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  const std::string address = runner.address();

  absl::StatusOr<rlfleet::testing::EchoResponse> slow;
  std::thread caller([&] {
    EchoRequest request = Payload("slow");
    request.set_delay_ms(300);
    slow = MakeClient(address).Echo(request);
  });
  ASSERT_TRUE(service.delayed_call_started().WaitForNotificationWithTimeout(absl::Seconds(10)));
  runner.Shutdown();  // returns once the in-flight call has finished
  caller.join();
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->payload(), "slow");

  ClientOptions options_once;
  options_once.target = address;
  options_once.retry.max_attempts = 1;
  options_once.default_timeout = absl::Seconds(2);
  EchoClient after(*MakeChannel(options_once), options_once);
  EXPECT_EQ(after.Echo(Payload("late")).status().code(), absl::StatusCode::kUnavailable);
}

TEST(ServerRunner, DrainTimeoutCancelsCallsThatOutlastIt) {
  EchoServiceImpl service(CallAuth{});
  ServerOptions options;
  options.drain_timeout = absl::Milliseconds(100);
  ServerRunner runner(options);
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  const std::string address = runner.address();
  absl::StatusOr<rlfleet::testing::EchoResponse> slow;
  std::thread caller([&] {
    EchoRequest request = Payload("slow");
    request.set_delay_ms(3000);
    ClientOptions once;
    once.target = address;
    once.retry.max_attempts = 1;
    slow = EchoClient(*MakeChannel(once), once).Echo(request);
  });
  ASSERT_TRUE(service.delayed_call_started().WaitForNotificationWithTimeout(absl::Seconds(10)));
  const absl::Time start = absl::Now();
  std::thread stopper([&] { runner.Shutdown(); });
  caller.join();  // the client sees the cancellation before the handler finishes
  EXPECT_FALSE(slow.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2.5));
  stopper.join();
}

TEST(ServerRunner, SigtermTriggersGracefulShutdown) {
  EchoServiceImpl service(CallAuth{});
  ServerRunner runner(ServerOptions{});
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  int signo = -1;
  std::thread waiter([&] { signo = runner.WaitForTermination(); });
  // The handler is installed by WaitForTermination; raise until it has consumed it.
  // kill() to our own pid is delivered to a thread that has not blocked SIGTERM.
  absl::Notification done;
  std::thread watcher([&] {
    waiter.join();
    done.Notify();
  });
  for (int i = 0; i < 200 && !done.HasBeenNotified(); ++i) {
    struct sigaction current;
    sigaction(SIGTERM, nullptr, &current);
    if (current.sa_handler != SIG_DFL) {
      kill(getpid(), SIGTERM);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  watcher.join();
  EXPECT_EQ(signo, SIGTERM);
}

TEST(Client, RetriesAgainstADeadPortEndWithUnavailableWithinTheDeadline) {
  // Bind and release a port so that nothing listens on it.
  int dead_port;
  {
    EchoServiceImpl service(CallAuth{});
    ServerRunner runner(ServerOptions{});
    runner.AddService(&service);
    ASSERT_TRUE(runner.Start().ok());
    dead_port = runner.port();
  }
  ClientOptions options;
  options.target = absl::StrCat("127.0.0.1:", dead_port);
  options.default_timeout = absl::Seconds(3);
  options.retry.max_attempts = 3;
  EchoClient client(*MakeChannel(options), options);
  const absl::Time start = absl::Now();
  auto response = client.Echo(Payload("x"));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
  EXPECT_TRUE(absl::StrContains(response.status().message(), "Echo to 127.0.0.1:"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

TEST(Client, UnavailableIsRetriedOnlyForIdempotentCalls) {
  EchoServiceImpl service(CallAuth{});
  ServerRunner runner(ServerOptions{});
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());
  ClientOptions options;
  options.target = runner.address();
  options.retry.max_attempts = 3;
  options.retry.initial_backoff = absl::Milliseconds(1);
  EchoClient client(*MakeChannel(options), options);
  EchoRequest request = Payload("x");
  request.set_fail_with_code(static_cast<int>(absl::StatusCode::kUnavailable));

  auto retried = client.Echo(request, absl::ZeroDuration(), Retry::kIdempotent);
  EXPECT_EQ(retried.status().code(), absl::StatusCode::kUnavailable) << retried.status();
  EXPECT_EQ(service.calls(), 3);
  // A call that must not run twice (TrainStep, GenerateBatch) gets one attempt.
  auto once = client.Echo(request, absl::ZeroDuration(), Retry::kOnce);
  EXPECT_EQ(once.status().code(), absl::StatusCode::kUnavailable) << once.status();
  EXPECT_TRUE(absl::StrContains(once.status().message(), "Echo to 127.0.0.1:")) << once.status();
  EXPECT_EQ(service.calls(), 4);
}

// ---- TLS: certificates made by openssl in the test's temp dir ----

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(getenv("TEST_TMPDIR"), "/pki"));
    const std::string d = *dir_;
    const std::string script =
        absl::StrCat("set -e; mkdir -p ", d, "; cd ", d, ";",
                     "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=rlfleet-test-ca "
                     "-keyout ca.key -out ca.pem 2>/dev/null;",
                     "for who in server client; do "
                     "openssl req -newkey rsa:2048 -nodes -subj /CN=$who -keyout $who.key -out $who.csr "
                     "2>/dev/null;",
                     "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > $who.ext;",
                     "openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
                     "-extfile $who.ext -out $who.pem 2>/dev/null; done");
    ASSERT_EQ(std::system(script.c_str()), 0) << "openssl failed: run tools/setup.sh";
  }
  static std::string F(const std::string& name) { return *dir_ + "/" + name; }
  static std::string* dir_;
};
std::string* TlsTest::dir_ = nullptr;

TEST_F(TlsTest, TlsServerAcceptsVerifiedClientsOnly) {
  EchoServiceImpl service(CallAuth{});
  ServerOptions options;
  options.auth.tls_cert_file = F("server.pem");
  options.auth.tls_key_file = F("server.key");
  ServerRunner runner(options);
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());

  AuthOptions tls;
  tls.tls_ca_file = F("ca.pem");
  auto ok = MakeClient(runner.address(), tls).Echo(Payload("secret"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->payload(), "secret");

  // A plaintext client cannot talk to a TLS server.
  auto plain = MakeClient(runner.address(), {}, absl::Seconds(2)).Echo(Payload("x"));
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kUnavailable) << plain.status();
}

TEST_F(TlsTest, MutualTlsRequiresAClientCertificate) {
  EchoServiceImpl service(CallAuth{});
  ServerOptions options;
  options.auth.tls_cert_file = F("server.pem");
  options.auth.tls_key_file = F("server.key");
  options.auth.tls_ca_file = F("ca.pem");
  options.auth.require_client_cert = true;
  ServerRunner runner(options);
  runner.AddService(&service);
  ASSERT_TRUE(runner.Start().ok());

  AuthOptions no_cert;
  no_cert.tls_ca_file = F("ca.pem");
  auto refused = MakeClient(runner.address(), no_cert, absl::Seconds(2)).Echo(Payload("x"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();

  AuthOptions with_cert = no_cert;
  with_cert.tls_cert_file = F("client.pem");
  with_cert.tls_key_file = F("client.key");
  auto ok = MakeClient(runner.address(), with_cert).Echo(Payload("mtls"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->payload(), "mtls");
}

TEST_F(TlsTest, ControllerRoleByVerifiedCertificateName) {
  ServerOptions options;
  options.auth.tls_cert_file = F("server.pem");
  options.auth.tls_key_file = F("server.key");
  options.auth.tls_ca_file = F("ca.pem");
  options.auth.require_client_cert = true;
  AuthOptions with_cert;
  with_cert.tls_ca_file = F("ca.pem");
  with_cert.tls_cert_file = F("client.pem");
  with_cert.tls_key_file = F("client.key");

  EchoServiceImpl named(CallAuth{"", "", {"client"}}, Role::kController);
  ServerRunner runner(options);
  runner.AddService(&named);
  ASSERT_TRUE(runner.Start().ok());
  auto ok = MakeClient(runner.address(), with_cert).Echo(Payload("x"));
  ASSERT_TRUE(ok.ok()) << ok.status();

  EchoServiceImpl other(CallAuth{"", "", {"controller"}}, Role::kController);
  ServerRunner runner2(options);
  runner2.AddService(&other);
  ASSERT_TRUE(runner2.Start().ok());
  auto denied = MakeClient(runner2.address(), with_cert).Echo(Payload("x"));
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << denied.status();
}

TEST(Auth, InconsistentOrMissingFilesAreClearErrors) {
  AuthOptions key_only;
  key_only.tls_key_file = "/x.key";
  EXPECT_EQ(MakeServerCredentials(key_only).status().code(), absl::StatusCode::kInvalidArgument);
  AuthOptions mtls_without_ca;
  mtls_without_ca.tls_cert_file = "/x.pem";
  mtls_without_ca.tls_key_file = "/x.key";
  mtls_without_ca.require_client_cert = true;
  EXPECT_EQ(MakeServerCredentials(mtls_without_ca).status().code(), absl::StatusCode::kInvalidArgument);
  AuthOptions missing;
  missing.tls_cert_file = "/nonexistent/server.pem";
  missing.tls_key_file = "/nonexistent/server.key";
  absl::Status s = MakeServerCredentials(missing).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(s.message(), "/nonexistent/server.pem")) << s;
  AuthOptions client_cert_without_ca;
  client_cert_without_ca.tls_cert_file = "/x.pem";
  EXPECT_EQ(MakeChannelCredentials(client_cert_without_ca).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rlfleet::rpc
