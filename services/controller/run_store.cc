#include "services/controller/run_store.h"

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/common/status_macros.h"
#include "libs/redis/redis_client.h"

namespace rlfleet::controller {
namespace {

constexpr char kFormat[] = "rlfleet-run-1";

// Reads fields of a record, naming the first that does not read.
class FieldReader {
 public:
  explicit FieldReader(const std::map<std::string, std::string>& fields) : fields_(fields) {}
  const std::string& Str(const std::string& name) {
    static const std::string* const kEmpty = new std::string;
    auto it = fields_.find(name);
    return it == fields_.end() ? *kEmpty : it->second;
  }
  template <typename T>
  T Number(const std::string& name) {
    const std::string& text = Str(name);
    T value{};
    bool ok = false;
    if constexpr (std::is_floating_point_v<T>) {
      double d = 0;
      ok = absl::SimpleAtod(text, &d);
      value = static_cast<T>(d);
    } else {
      ok = absl::SimpleAtoi(text, &value);
    }
    if (!ok && bad_.empty()) bad_ = name;
    return value;
  }
  absl::Status status() const {
    if (bad_.empty()) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat("the stored run record's field `", bad_, "` does not read"));
  }
  void Fail(const std::string& name) {
    if (bad_.empty()) bad_ = name;
  }

 private:
  const std::map<std::string, std::string>& fields_;
  std::string bad_;
};

}  // namespace

std::map<std::string, std::string> RunRecordFields(const RunRecord& r) {
  const LoopProgress& p = r.progress;
  return {
      {"format", kFormat},
      {"run_id", r.run_id},
      {"config", r.config.SerializeAsString()},
      {"state", absl::StrCat(static_cast<int>(r.state))},
      {"started_unix_ms", absl::StrCat(r.started_unix_ms)},
      {"run_dir", r.run_dir},
      {"error", r.error},
      {"stop_requested", r.stop_requested ? "1" : "0"},
      {"last_exact", absl::StrFormat("%.9g", r.last_exact)},
      {"resumes", absl::StrCat(r.resumes)},
      {"step", absl::StrCat(p.step)},
      {"seconds", absl::StrFormat("%.17g", p.seconds)},
      {"policy_version", absl::StrCat(p.policy_version)},
      {"train_reward", absl::StrFormat("%.17g", p.train_reward)},
      {"entropy", absl::StrFormat("%.9g", p.entropy)},
      {"loss", absl::StrFormat("%.9g", p.loss)},
      {"idle_steps", absl::StrCat(p.idle_steps)},
      {"trained_sequences", absl::StrCat(p.trained_sequences)},
      {"last_checkpoint", p.last_checkpoint},
      {"failed_checkpoints", absl::StrCat(p.failed_checkpoints)},
      {"accepted_experiences", absl::StrCat(p.accepted_experiences)},
      {"tag", p.tag},
      {"published_version", absl::StrCat(p.published_version)},
  };
}

absl::StatusOr<RunRecord> RunRecordFromFields(const std::map<std::string, std::string>& fields) {
  FieldReader f(fields);
  if (f.Str("format") != kFormat) {
    return absl::DataLossError(absl::StrCat("the stored run record is not of format ", kFormat));
  }
  RunRecord r;
  r.run_id = f.Str("run_id");
  if (!r.config.ParseFromString(f.Str("config"))) f.Fail("config");
  const int state = f.Number<int>("state");
  if (!v1::RunState_IsValid(state)) f.Fail("state");
  r.state = static_cast<v1::RunState>(state);
  r.started_unix_ms = f.Number<int64_t>("started_unix_ms");
  r.run_dir = f.Str("run_dir");
  r.error = f.Str("error");
  r.stop_requested = f.Str("stop_requested") == "1";
  r.last_exact = f.Number<float>("last_exact");
  r.resumes = f.Number<int>("resumes");
  LoopProgress& p = r.progress;
  p.step = f.Number<int>("step");
  p.seconds = f.Number<double>("seconds");
  p.policy_version = f.Number<uint64_t>("policy_version");
  p.train_reward = f.Number<double>("train_reward");
  p.entropy = f.Number<float>("entropy");
  p.loss = f.Number<float>("loss");
  p.idle_steps = f.Number<int>("idle_steps");
  p.trained_sequences = f.Number<uint64_t>("trained_sequences");
  p.last_checkpoint = f.Str("last_checkpoint");
  // (a record stored before the field was kept has none: 0)
  if (!f.Str("failed_checkpoints").empty()) p.failed_checkpoints = f.Number<int>("failed_checkpoints");
  p.accepted_experiences = f.Number<uint64_t>("accepted_experiences");
  p.tag = f.Str("tag");
  p.published_version = f.Number<uint64_t>("published_version");
  if (p.step < 0 || p.idle_steps < 0 || p.idle_steps > p.step) f.Fail("step");
  if (p.failed_checkpoints < 0) f.Fail("failed_checkpoints");
  RETURN_IF_ERROR(f.status());
  return r;
}

std::map<std::string, std::string> DesiredFields(const std::map<int, uint32_t>& desired) {
  std::map<std::string, std::string> fields;
  for (const auto& [role, count] : desired) {
    fields[v1::ReplicaRole_Name(static_cast<v1::ReplicaRole>(role))] = absl::StrCat(count);
  }
  return fields;
}

absl::StatusOr<std::map<int, uint32_t>> DesiredFromFields(const std::map<std::string, std::string>& fields) {
  std::map<int, uint32_t> desired;
  for (const auto& [name, value] : fields) {
    v1::ReplicaRole role;
    uint32_t count = 0;
    if (!v1::ReplicaRole_Parse(name, &role) || role == v1::REPLICA_ROLE_UNSPECIFIED) {
      return absl::DataLossError(absl::StrCat("desired counts: unknown role `", name, "`"));
    }
    if (!absl::SimpleAtoi(value, &count) || count > 1024) {
      return absl::DataLossError(absl::StrCat("desired counts: ", name, " = `", value, "` is not a count 0..1024"));
    }
    desired[role] = count;
  }
  return desired;
}

absl::Status InMemoryRunStore::SaveDesired(const std::map<int, uint32_t>& desired) {
  absl::MutexLock lock(&mu_);
  desired_ = DesiredFields(desired);
  return absl::OkStatus();
}

absl::StatusOr<std::map<int, uint32_t>> InMemoryRunStore::LoadDesired() {
  absl::MutexLock lock(&mu_);
  return DesiredFromFields(desired_);
}

absl::Status InMemoryRunStore::Save(const RunRecord& record) {
  absl::MutexLock lock(&mu_);
  fields_ = RunRecordFields(record);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<RunRecord>> InMemoryRunStore::Load() {
  absl::MutexLock lock(&mu_);
  if (!fields_.has_value()) return std::optional<RunRecord>();
  ASSIGN_OR_RETURN(RunRecord r, RunRecordFromFields(*fields_));
  return std::optional<RunRecord>(std::move(r));
}

namespace {

class RedisRunStore : public RunStore {
 public:
  RedisRunStore(std::unique_ptr<redis::Client> client, std::string key, std::string desired_key)
      : client_(std::move(client)), key_(std::move(key)), desired_key_(std::move(desired_key)) {}

  // (roles are only ever added to the counts, so one HSET of all of them replaces them)
  absl::Status SaveDesired(const std::map<int, uint32_t>& desired) override {
    if (desired.empty()) return absl::OkStatus();
    std::vector<std::string> argv = {"HSET", desired_key_};
    for (auto& [name, value] : DesiredFields(desired)) {
      argv.push_back(name);
      argv.push_back(std::move(value));
    }
    return client_->Command(argv).status();
  }
  absl::StatusOr<std::map<int, uint32_t>> LoadDesired() override {
    absl::StatusOr<std::map<std::string, std::string>> fields = Hash(desired_key_);
    if (!fields.ok()) return fields.status();
    return DesiredFromFields(*fields);
  }

  absl::Status Save(const RunRecord& record) override {
    std::vector<std::string> argv = {"HSET", key_};
    for (auto& [name, value] : RunRecordFields(record)) {
      argv.push_back(name);
      argv.push_back(std::move(value));
    }
    return client_->Command(argv).status();
  }

  absl::StatusOr<std::optional<RunRecord>> Load() override {
    absl::StatusOr<std::map<std::string, std::string>> fields = Hash(key_);
    if (!fields.ok()) return fields.status();
    if (fields->empty()) return std::optional<RunRecord>();
    ASSIGN_OR_RETURN(RunRecord r, RunRecordFromFields(*fields));
    return std::optional<RunRecord>(std::move(r));
  }

 private:
  // HGETALL `key`: its fields (none when it does not exist).
  absl::StatusOr<std::map<std::string, std::string>> Hash(const std::string& key) {
    ASSIGN_OR_RETURN(redis::Reply reply, client_->Command({"HGETALL", key}));
    if (reply.type != redis::Reply::Type::kArray || reply.elements.size() % 2 != 0) {
      return absl::DataLossError(absl::StrCat("HGETALL ", key, ": not a hash"));
    }
    std::map<std::string, std::string> fields;
    for (size_t i = 0; i + 1 < reply.elements.size(); i += 2) {
      fields[reply.elements[i].str] = std::move(reply.elements[i + 1].str);
    }
    return fields;
  }

  const std::unique_ptr<redis::Client> client_;
  const std::string key_;
  const std::string desired_key_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RunStore>> OpenRunStore(absl::string_view connection) {
  if (connection.empty()) return std::unique_ptr<RunStore>();
  if (connection == "memory://") return std::unique_ptr<RunStore>(new InMemoryRunStore);
  if (absl::StartsWith(connection, "redis://")) {
    ASSIGN_OR_RETURN(redis::Url url, redis::ParseUrl(connection, "rlfleet:"));
    ASSIGN_OR_RETURN(std::unique_ptr<redis::Client> client, redis::Client::Connect(url.host, url.port));
    return std::unique_ptr<RunStore>(
        new RedisRunStore(std::move(client), url.prefix + "controller:run", url.prefix + "controller:desired"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown run store `", connection, "`: want redis://host:port[/prefix] or memory://"));
}

}  // namespace rlfleet::controller
