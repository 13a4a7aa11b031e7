// deploy/prometheus against Debian's Prometheus: promtool accepts the alert rules and
// their unit tests, and a real Prometheus on loopback scrapes a small fleet of real
// rlfleet services (reward, buffer, rollout) and answers queries through its HTTP API.
#include <signal.h>
#include <sys/wait.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "libs/metrics/http_server.h"
#include "tests/util/subprocess.h"

namespace rlfleet {
namespace {

using testing::RunfilePath;
using testing::Subprocess;

// The body of GET 127.0.0.1:port/path; empty if it fails.
std::string Get(int port, const std::string& path) {
  auto r = metrics::HttpGet("127.0.0.1", port, path, absl::Seconds(10));
  return r.ok() ? r->body : "";
}

int RunTool(const std::vector<std::string>& argv, std::string* output) {
  Subprocess p;
  if (!p.Start(argv).ok()) return -1;
  auto status = p.Wait(absl::Seconds(60));
  *output = p.output();
  return status.ok() ? WEXITSTATUS(*status) : -1;
}

TEST(Prometheus, PromtoolAcceptsTheRulesAndTheirTests) {
  std::string out;
  EXPECT_EQ(RunTool({"/usr/bin/promtool", "check", "rules", RunfilePath("deploy/prometheus/alerts.yml")}, &out), 0)
      << out;
  EXPECT_TRUE(absl::StrContains(out, "SUCCESS: 6 rules found")) << out;
  EXPECT_EQ(RunTool({"/usr/bin/promtool", "test", "rules", RunfilePath("deploy/prometheus/alerts_test.yml")}, &out), 0)
      << out;
}

// Starts `argv` (a service) and returns its metrics target host:port ("" on failure).
std::string StartScraped(Subprocess& p, const std::vector<std::string>& argv) {
  if (!p.Start(argv).ok()) return "";
  auto line =
      p.WaitForLine([](const std::string& l) { return absl::StrContains(l, "metrics on http://"); }, absl::Seconds(60));
  std::smatch m;
  if (!line.ok() || !std::regex_search(*line, m, std::regex("http://(127\\.0\\.0\\.1:[0-9]+)/metrics"))) return "";
  return m[1];
}

TEST(Prometheus, ScrapesASmallFleetAndAnswersQueries) {
  // A small fleet: reward, buffer, and a rollout replica serving its initial weights.
  Subprocess reward, buffer, rollout;
  const std::vector<std::string> targets = {
      StartScraped(reward, {RunfilePath("services/reward/rlfleet-reward"), "--host=127.0.0.1", "--port=0"}),
      StartScraped(
          buffer, {RunfilePath("services/buffer/rlfleet-buffer"), "--host=127.0.0.1", "--port=0", "--store=memory://"}),
      StartScraped(rollout, {RunfilePath("services/rollout/rlfleet-rollout"), "--host=127.0.0.1", "--port=0",
                             "--serve_initial_weights", "--threads=1"}),
  };
  for (const std::string& t : targets)
    ASSERT_FALSE(t.empty()) << reward.output() << buffer.output() << rollout.output();
  int metrics_port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(targets[0].substr(targets[0].find(':') + 1), &metrics_port));
  EXPECT_TRUE(absl::StrContains(Get(metrics_port, "/metrics"), "rlfleet_up{service=\"rlfleet-reward\"} 1"));
  const std::string target = absl::StrJoin(targets, "', '");

  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/prometheus";
  std::filesystem::create_directories(dir);
  {
    std::ofstream config(dir + "/prometheus.yml");
    config << "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
           << "rule_files: ['" << RunfilePath("deploy/prometheus/alerts.yml") << "']\n"
           << "scrape_configs:\n  - job_name: rlfleet\n    static_configs: [{targets: ['" << target << "']}]\n";
  }
  std::string out;
  ASSERT_EQ(RunTool({"/usr/bin/promtool", "check", "config", dir + "/prometheus.yml"}, &out), 0) << out;
  const int port = rlfleet::testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  Subprocess prometheus;
  ASSERT_TRUE(prometheus
                  .Start({"/usr/bin/prometheus", "--config.file=" + dir + "/prometheus.yml",
                          "--storage.tsdb.path=" + dir + "/data", absl::StrCat("--web.listen-address=127.0.0.1:", port),
                          "--log.level=warn"})
                  .ok());
  // Poll its HTTP API (deadline 90 s) until every service's series is there.
  const std::string query = "/api/v1/query?query=rlfleet_up%7Bjob%3D%22rlfleet%22%7D";
  const std::vector<std::string> services = {"rlfleet-reward", "rlfleet-buffer", "rlfleet-rollout"};
  auto all_up = [&](const std::string& answer) {
    for (const std::string& service : services) {
      if (!absl::StrContains(answer, absl::StrCat("\"service\":\"", service, "\""))) return false;
    }
    return true;
  };
  std::string answer;
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  while (absl::Now() < deadline) {
    answer = Get(port, query);
    if (all_up(answer)) break;
    absl::SleepFor(absl::Milliseconds(200));  // (Prometheus scrapes on its own clock)
  }
  EXPECT_TRUE(absl::StrContains(answer, "\"status\":\"success\"")) << answer;
  EXPECT_TRUE(all_up(answer)) << answer;
  EXPECT_TRUE(absl::StrContains(answer, ",\"1\"]")) << answer;
  // Each service's own series through Prometheus.
  for (const char* series : {"rlfleet_buffer_depth_experiences", "rlfleet_rollout_active_sequences",
                             "rlfleet_buffer_sampled_total", "rlfleet_nic_receive_bytes_total"}) {
    const std::string reply = Get(port, absl::StrCat("/api/v1/query?query=", series));
    EXPECT_TRUE(absl::StrContains(reply, "\"result\":[{")) << series << ": " << reply;
  }
  const std::string rules = Get(port, "/api/v1/rules");
  EXPECT_TRUE(absl::StrContains(rules, "RlfleetAllReduceSlow")) << rules;
  // Every query of the Grafana dashboard is one Prometheus accepts.
  std::ifstream dashboard_file(RunfilePath("deploy/grafana/rlfleet.json"));
  const std::string dashboard((std::istreambuf_iterator<char>(dashboard_file)), std::istreambuf_iterator<char>());
  std::regex expr_re("\"expr\": \"([^\"]+)\"");
  int queries = 0;
  for (auto it = std::sregex_iterator(dashboard.begin(), dashboard.end(), expr_re); it != std::sregex_iterator();
       ++it, ++queries) {
    std::string encoded;
    for (unsigned char c : (*it)[1].str()) {
      if (std::isalnum(c) || c == '_' || c == '.' || c == '-') {
        encoded += static_cast<char>(c);
      } else {
        encoded += absl::StrFormat("%%%02X", c);
      }
    }
    const std::string reply = Get(port, "/api/v1/query?query=" + encoded);
    EXPECT_TRUE(absl::StrContains(reply, "\"status\":\"success\"")) << (*it)[1].str() << "\n" << reply;
  }
  EXPECT_EQ(queries, 27);
  ASSERT_TRUE(prometheus.Signal(SIGTERM).ok());
  EXPECT_TRUE(prometheus.Wait(absl::Seconds(30)).ok());
  for (Subprocess* p : {&reward, &buffer, &rollout}) {
    ASSERT_TRUE(p->Signal(SIGTERM).ok());
    EXPECT_TRUE(p->Wait(absl::Seconds(30)).ok());
  }
}

}  // namespace
}  // namespace rlfleet
