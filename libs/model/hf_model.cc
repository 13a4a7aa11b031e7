#include "libs/model/hf_model.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/files.h"
#include "libs/common/status_macros.h"
#include "libs/model/safetensors.h"

namespace rlfleet::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr uint64_t kMaxConfigBytes = 16 << 20;

// Typed reads of config.json's keys, each error naming the file and the key.
class ConfigReader {
 public:
  ConfigReader(const Json& json, const std::string& name) : json_(json), name_(name) {}

  absl::Status Error(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": `", key, "` ", what));
  }
  bool Has(const Json& in, const std::string& key) const { return in.contains(key) && !in.at(key).is_null(); }
  bool Has(const std::string& key) const { return Has(json_, key); }

  absl::StatusOr<int> Int(const Json& in, const std::string& key, std::optional<int> fallback) const {
    if (!Has(in, key)) {
      if (fallback) return *fallback;
      return Error(key, "is missing");
    }
    const Json& v = in.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t{1} << 30)) {
      return Error(key, absl::StrCat("must be an integer in [0, 2^30], is ", v.dump()));
    }
    return static_cast<int>(v.get<int64_t>());
  }
  absl::StatusOr<int> Int(const std::string& key, std::optional<int> fallback = std::nullopt) const {
    return Int(json_, key, fallback);
  }
  absl::StatusOr<double> Number(const Json& in, const std::string& key, std::optional<double> fallback) const {
    if (!Has(in, key)) {
      if (fallback) return *fallback;
      return Error(key, "is missing");
    }
    const Json& v = in.at(key);
    if (!v.is_number()) return Error(key, absl::StrCat("must be a number, is ", v.dump()));
    return v.get<double>();
  }
  absl::StatusOr<bool> Bool(const std::string& key, bool fallback) const {
    if (!Has(key)) return fallback;
    const Json& v = json_.at(key);
    if (!v.is_boolean()) return Error(key, absl::StrCat("must be true or false, is ", v.dump()));
    return v.get<bool>();
  }
  absl::StatusOr<std::string> String(const Json& in, const std::string& key,
                                     std::optional<std::string> fallback) const {
    if (!Has(in, key)) {
      if (fallback) return *fallback;
      return Error(key, "is missing");
    }
    const Json& v = in.at(key);
    if (!v.is_string()) return Error(key, absl::StrCat("must be a string, is ", v.dump()));
    return v.get<std::string>();
  }
  absl::StatusOr<std::string> String(const std::string& key, std::optional<std::string> fallback = std::nullopt) const {
    return String(json_, key, fallback);
  }

 private:
  const Json& json_;
  const std::string& name_;
};

// The rotary settings: transformers 5's `rope_parameters` {rope_type, rope_theta,
// factor, ...}, or 4's `rope_theta` at the top and `rope_scaling` {type | rope_type,
// factor, ...} (null for none).
absl::Status ReadRope(const Json& json, const ConfigReader& r, PolicyConfig* c) {
  const Json* scaling = nullptr;
  if (r.Has("rope_parameters")) {
    const Json& p = json.at("rope_parameters");
    if (!p.is_object()) return r.Error("rope_parameters", "must be an object");
    ASSIGN_OR_RETURN(c->rope_theta, r.Number(p, "rope_theta", 10000.0));
    scaling = &p;
  } else {
    ASSIGN_OR_RETURN(c->rope_theta, r.Number(json, "rope_theta", 10000.0));
    if (r.Has("rope_scaling")) {
      scaling = &json.at("rope_scaling");
      if (!scaling->is_object()) return r.Error("rope_scaling", "must be an object or null");
    }
  }
  if (scaling == nullptr) return absl::OkStatus();
  const std::string type_key = scaling->contains("rope_type") ? "rope_type" : "type";
  ASSIGN_OR_RETURN(const std::string type, r.String(*scaling, type_key, "default"));
  if (type == "default") return absl::OkStatus();
  if (type != "llama3") {
    return r.Error(type_key, absl::StrCat("is \"", type,
                                          "\": this model implements default and llama3 rotary "
                                          "embeddings (not linear, dynamic, yarn, longrope)"));
  }
  ASSIGN_OR_RETURN(c->rope_factor, r.Number(*scaling, "factor", std::nullopt));
  ASSIGN_OR_RETURN(c->rope_low_freq_factor, r.Number(*scaling, "low_freq_factor", std::nullopt));
  ASSIGN_OR_RETURN(c->rope_high_freq_factor, r.Number(*scaling, "high_freq_factor", std::nullopt));
  ASSIGN_OR_RETURN(c->rope_original_max_positions, r.Int(*scaling, "original_max_position_embeddings", std::nullopt));
  return absl::OkStatus();
}

// Every file of the directory's weights and the tensors in it, as views into `files`.
absl::StatusOr<std::map<std::string, TensorView>> ReadWeights(const std::string& dir,
                                                              std::vector<std::unique_ptr<std::string>>* files) {
  const fs::path root(dir);
  std::vector<std::string> names;
  const fs::path index_path = root / "model.safetensors.index.json";
  std::map<std::string, std::string> listed;  // tensor -> shard
  if (fs::exists(index_path)) {
    ASSIGN_OR_RETURN(std::string text,
                     common::ReadRegularFile("model.safetensors.index.json", index_path, kMaxConfigBytes));
    Json index;
    try {
      index = Json::parse(text);
    } catch (const Json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": ", e.what()));
    }
    if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": wants an object `weight_map`"));
    }
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : index.at("weight_map").items()) {
      if (!shard.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path.string(), ": weight_map[\"", tensor, "\"] must be a file name"));
      }
      listed[tensor] = shard.get<std::string>();
      shards.insert(shard.get<std::string>());
    }
    for (const std::string& shard : shards) {
      // A shard is a file of the directory, named without a path: a name leading out of
      // it is refused. (Its file may be a link, as in the Hugging Face cache, whose
      // snapshot directories link each file to a blob elsewhere.)
      if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
          shard.find('\0') != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": shard \"", shard,
                                                       "\" is not a file name in the directory (it would be "
                                                       "outside it)"));
      }
      const fs::path path = root / shard;
      if (!fs::exists(path)) {
        return absl::NotFoundError(absl::StrCat(index_path.string(), " lists shard ", shard, ", which is absent"));
      }
      names.push_back(path.string());
    }
  } else if (fs::exists(root / "model.safetensors")) {
    names.push_back((root / "model.safetensors").string());
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir,
                     " holds no model.safetensors or model.safetensors.index.json (a Hugging Face model "
                     "directory saved with safetensors)"));
  }
  files->clear();
  std::map<std::string, TensorView> tensors;
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(std::string bytes, common::ReadRegularFile(name, name, kMaxSafetensorsFileBytes));
    files->push_back(std::make_unique<std::string>(std::move(bytes)));  // (the views point into it)
    ASSIGN_OR_RETURN(auto views, ParseSafetensorsViews(*files->back(), name));
    for (auto& [tensor, view] : views) {
      auto it = listed.find(tensor);
      if (!listed.empty() && (it == listed.end() || (root / it->second).filename() != fs::path(name).filename())) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " holds tensor `", tensor, "`, which the index does not list in it"));
      }
      if (!tensors.emplace(tensor, view).second) {
        return absl::InvalidArgumentError(absl::StrCat("tensor `", tensor, "` is in more than one shard of ", dir));
      }
    }
  }
  for (const auto& [tensor, shard] : listed) {
    if (tensors.count(tensor) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.safetensors.index.json lists tensor `", tensor, "` in ", shard, ", which lacks it"));
    }
  }
  return tensors;
}

// Checks `tensors` against the parameter names of a policy of `config`: a tensor that is
// not one of them is refused by name, except what checkpoints carry beside the
// parameters (the rotary tables, computed here from the config; a tied model's LM head,
// the embedding's copy; a critic's value head, for a policy without one), which is
// dropped.
absl::Status KeepParameters(const std::string& dir, const std::vector<std::string>& parameters,
                            const PolicyConfig& config, std::map<std::string, TensorView>* tensors) {
  const std::set<std::string> wanted(parameters.begin(), parameters.end());
  for (auto it = tensors->begin(); it != tensors->end();) {
    const std::string& tensor = it->first;
    if (wanted.count(tensor) != 0) {
      ++it;
    } else if (absl::EndsWith(tensor, ".rotary_emb.inv_freq") ||
               (tensor == "lm_head.weight" && config.tie_embeddings) ||
               (absl::StartsWith(tensor, "value_head.") && !config.value_head)) {
      it = tensors->erase(it);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("tensor `", tensor, "` in ", dir, " is not a parameter of a ",
                                                     config.arch, " model of this config.json",
                                                     config.value_head ? " (a reward model)" : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PolicyConfig> ParseHfConfig(absl::string_view text, const std::string& name) {
  Json json;
  try {
    json = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not JSON: ", e.what()));
  }
  if (!json.is_object()) return absl::InvalidArgumentError(absl::StrCat(name, ": wants a JSON object"));
  ConfigReader r(json, name);
  PolicyConfig c;
  ASSIGN_OR_RETURN(c.arch, r.String("model_type"));
  if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen3") {
    return r.Error("model_type", absl::StrCat("is \"", c.arch, "\"; supported: llama, qwen2, qwen3"));
  }
  ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size"));
  ASSIGN_OR_RETURN(c.d_model, r.Int("hidden_size"));
  ASSIGN_OR_RETURN(c.n_layers, r.Int("num_hidden_layers"));
  ASSIGN_OR_RETURN(c.n_heads, r.Int("num_attention_heads"));
  ASSIGN_OR_RETURN(c.n_kv_heads, r.Int("num_key_value_heads", c.n_heads));
  ASSIGN_OR_RETURN(c.ffn_dim, r.Int("intermediate_size"));
  if (c.n_heads < 1) return r.Error("num_attention_heads", "must be at least 1");
  // Qwen3's head_dim defaults to 128 (its config class's default), the others' to
  // hidden_size / num_attention_heads.
  ASSIGN_OR_RETURN(c.head_dim, r.Int("head_dim", c.arch == "qwen3" ? 128 : c.d_model / c.n_heads));
  ASSIGN_OR_RETURN(c.norm_eps, r.Number(json, "rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c.tie_embeddings, r.Bool("tie_word_embeddings", false));
  ASSIGN_OR_RETURN(const bool attention_bias, r.Bool("attention_bias", false));
  ASSIGN_OR_RETURN(c.mlp_bias, r.Bool("mlp_bias", false));
  if (c.arch == "qwen2") {
    c.qkv_bias = true;  // (Qwen2's q/k/v projections always have biases, its output projection none)
  } else {
    c.qkv_bias = c.o_bias = attention_bias;
  }
  c.qk_norm = c.arch == "qwen3";
  ASSIGN_OR_RETURN(const std::string act, r.String("hidden_act", "silu"));
  if (act != "silu") return r.Error("hidden_act", absl::StrCat("is \"", act, "\"; this model implements silu"));
  ASSIGN_OR_RETURN(const bool sliding, r.Bool("use_sliding_window", false));
  if (sliding) return r.Error("use_sliding_window", "is true: sliding-window attention is not implemented");
  if (r.Has("layer_types")) {
    if (!json.at("layer_types").is_array()) return r.Error("layer_types", "must be an array");
    for (const Json& t : json.at("layer_types")) {
      if (t != "full_attention") {
        return r.Error("layer_types", absl::StrCat("has ", t.dump(), ": only full_attention layers are implemented"));
      }
    }
  }
  RETURN_IF_ERROR(ReadRope(json, r, &c));
  ASSIGN_OR_RETURN(const int max_positions, r.Int("max_position_embeddings", kDefaultHfMaxSeqLen));
  c.max_seq_len = std::min(max_positions, kDefaultHfMaxSeqLen);
  return c;
}

absl::StatusOr<PolicyConfig> ReadHfConfig(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  ASSIGN_OR_RETURN(std::string text, common::ReadRegularFile("config.json", path, kMaxConfigBytes));
  return ParseHfConfig(text, path.string());
}

absl::StatusOr<HfWeights> ReadHfWeights(const std::string& dir, const std::vector<std::string>& parameters,
                                        const PolicyConfig& config) {
  HfWeights weights;
  ASSIGN_OR_RETURN(weights.tensors, ReadWeights(dir, &weights.files));
  RETURN_IF_ERROR(KeepParameters(dir, parameters, config, &weights.tensors));
  return weights;
}

absl::StatusOr<std::vector<int32_t>> ReadHfEosIds(const std::string& dir) {
  for (const char* name : {"generation_config.json", "config.json"}) {
    const fs::path path = fs::path(dir) / name;
    if (!fs::exists(path)) continue;
    ASSIGN_OR_RETURN(std::string text, common::ReadRegularFile(name, path, kMaxConfigBytes));
    Json json;
    try {
      json = Json::parse(text);
    } catch (const Json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not JSON: ", e.what()));
    }
    if (!json.is_object() || !json.contains("eos_token_id") || json["eos_token_id"].is_null()) continue;
    const Json& eos = json["eos_token_id"];
    std::vector<int32_t> ids;
    for (const Json& id : eos.is_array() ? eos : Json::array({eos})) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 30)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path.string(), ": `eos_token_id` is not an id or a list of ids: ", eos.dump()));
      }
      ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    return ids;
  }
  return std::vector<int32_t>{};
}

absl::Status LoadHfWeights(const std::string& dir, Policy* policy) {
  ASSIGN_OR_RETURN(HfWeights weights, ReadHfWeights(dir, policy->ParameterNames(), policy->config()));
  // A critic on a directory without a value head (a pretrained model): the head starts
  // at zero, every state's value 0 until it trains.
  const std::string zeros(static_cast<size_t>(policy->config().d_model) * sizeof(float), '\0');
  if (policy->config().value_head && weights.tensors.count("value_head.weight") == 0 &&
      weights.tensors.count("value_head.bias") == 0) {
    weights.tensors["value_head.weight"] = TensorView{"F32", {1, policy->config().d_model}, zeros};
    weights.tensors["value_head.bias"] = TensorView{"F32", {1}, absl::string_view(zeros).substr(0, sizeof(float))};
  }
  return policy->LoadTensors(weights.tensors, dir);
}

absl::StatusOr<std::unique_ptr<Policy>> LoadHfModel(const std::string& dir, const HfLoadOptions& options) {
  ASSIGN_OR_RETURN(PolicyConfig config, ReadHfConfig(dir));
  config.dtype = options.dtype;
  if (options.max_seq_len > 0) config.max_seq_len = options.max_seq_len;
  ASSIGN_OR_RETURN(std::unique_ptr<Policy> policy, Policy::Create(config, options.device));
  RETURN_IF_ERROR(LoadHfWeights(dir, policy.get()));
  return policy;
}

absl::StatusOr<std::unique_ptr<Policy>> LoadHfRewardModel(const std::string& dir, const HfLoadOptions& options) {
  const fs::path path = fs::path(dir) / "config.json";
  ASSIGN_OR_RETURN(std::string text, common::ReadRegularFile("config.json", path, kMaxConfigBytes));
  ASSIGN_OR_RETURN(PolicyConfig config, ParseHfConfig(text, path.string()));
  const Json json = Json::parse(text);  // (ParseHfConfig read it)
  bool classifier = false;
  if (json.contains("architectures") && json["architectures"].is_array()) {
    for (const Json& a : json["architectures"]) {
      classifier |= a.is_string() && absl::EndsWith(a.get<std::string>(), "ForSequenceClassification");
    }
  }
  if (!classifier) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(),
                     ": `architectures` names no *ForSequenceClassification model; a reward model directory is a "
                     "sequence classifier with one label (AutoModelForSequenceClassification, num_labels=1)"));
  }
  int64_t labels = 2;  // transformers' default
  if (json.contains("num_labels") && json["num_labels"].is_number_integer()) labels = json["num_labels"].get<int64_t>();
  if (json.contains("id2label") && json["id2label"].is_object()) labels = static_cast<int64_t>(json["id2label"].size());
  if (labels != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": a classifier of ", labels, " labels; a reward model has one (num_labels=1)"));
  }
  config.value_head = true;
  config.dtype = options.dtype;
  if (options.max_seq_len > 0) config.max_seq_len = options.max_seq_len;
  ASSIGN_OR_RETURN(std::unique_ptr<Policy> policy, Policy::Create(config, options.device));

  std::vector<std::unique_ptr<std::string>> files;
  ASSIGN_OR_RETURN(auto tensors, ReadWeights(dir, &files));
  auto score = tensors.find("score.weight");
  if (score == tensors.end()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor `score.weight` (the reward head) is missing in ", dir));
  }
  tensors["value_head.weight"] = score->second;
  tensors.erase(score);
  // The head has no bias: a zero one (LoadTensors takes each tensor in its own dtype).
  const float zero_bias = 0;
  tensors["value_head.bias"] = TensorView{"F32", {1}, absl::string_view(reinterpret_cast<const char*>(&zero_bias), 4)};
  if (!config.tie_embeddings && tensors.count("lm_head.weight") == 0 &&
      tensors.count("model.embed_tokens.weight") != 0) {
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"];
  }
  RETURN_IF_ERROR(KeepParameters(dir, policy->ParameterNames(), config, &tensors));
  RETURN_IF_ERROR(policy->LoadTensors(tensors, dir));
  return policy;
}

std::string HfConfigJson(const PolicyConfig& c, absl::string_view base) {
  static const std::map<std::string, std::string> kArchitecture = {
      {"llama", "LlamaForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"}, {"qwen3", "Qwen3ForCausalLM"}};
  auto it = kArchitecture.find(c.arch);
  // The keys of `base` stay (token ids, max_position_embeddings, what transformers reads
  // and this model does not); the keys that describe these weights are ours.
  Json json = Json::parse(base.begin(), base.end(), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) json = Json::object();
  if (!json.contains("max_position_embeddings")) json["max_position_embeddings"] = c.max_seq_len;
  const Json ours = {
      {"architectures", {it == kArchitecture.end() ? c.arch : it->second}},
      {"model_type", c.arch},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.d_model},
      {"intermediate_size", c.ffn_dim},
      {"num_hidden_layers", c.n_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_kv_heads > 0 ? c.n_kv_heads : c.n_heads},
      {"head_dim", c.head_dim > 0 ? c.head_dim : c.d_model / c.n_heads},
      {"hidden_act", "silu"},
      {"rms_norm_eps", c.norm_eps},
      {"tie_word_embeddings", c.tie_embeddings},
      // Both spellings, transformers 5's and 4's: a checkpoint may be read by either.
      {"dtype", "float32"},
      {"torch_dtype", "float32"},
  };
  json.update(ours);
  if (c.arch != "qwen2") json["attention_bias"] = c.qkv_bias;
  if (c.arch == "llama") json["mlp_bias"] = c.mlp_bias;
  Json rope = {{"rope_theta", c.rope_theta}, {"rope_type", "default"}};
  if (c.rope_factor > 0) {
    rope["rope_type"] = "llama3";
    rope["factor"] = c.rope_factor;
    rope["low_freq_factor"] = c.rope_low_freq_factor;
    rope["high_freq_factor"] = c.rope_high_freq_factor;
    rope["original_max_position_embeddings"] = c.rope_original_max_positions;
  }
  json["rope_parameters"] = rope;
  json["rope_theta"] = c.rope_theta;
  json["rope_scaling"] = c.rope_factor > 0 ? rope : Json(nullptr);
  return json.dump(2) + "\n";
}

absl::Status WriteHfModelFiles(const PolicyConfig& c, const std::string& dir, const std::string& from) {
  if (c.arch == "gpt") {
    return absl::InvalidArgumentError("arch gpt (the built-in character model) has no Hugging Face layout");
  }
  if (c.qkv_bias != c.o_bias && c.arch != "qwen2") {
    return absl::InvalidArgumentError(
        absl::StrCat(c.arch, " has one attention_bias for q/k/v and the output projection; this config differs"));
  }
  std::string base;
  if (!from.empty() && fs::exists(fs::path(from) / "config.json")) {
    ASSIGN_OR_RETURN(base, common::ReadRegularFile("config.json", fs::path(from) / "config.json", kMaxConfigBytes));
  }
  RETURN_IF_ERROR(WriteFileAtomically((fs::path(dir) / "config.json").string(), HfConfigJson(c, base)));
  if (from.empty()) return absl::OkStatus();
  for (const char* name : kHfTokenizerFiles) {
    const fs::path source = fs::path(from) / name;
    if (!fs::exists(source)) continue;
    ASSIGN_OR_RETURN(std::string bytes, common::ReadRegularFile(name, source, kMaxConfigBytes * 8));
    RETURN_IF_ERROR(WriteFileAtomically((fs::path(dir) / name).string(), bytes));
  }
  return absl::OkStatus();
}

absl::Status WriteHfModelDir(const Policy& policy, const std::string& dir, const std::string& from) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  RETURN_IF_ERROR(WriteHfModelFiles(policy.config(), dir, from));
  return policy.SaveSafetensors((fs::path(dir) / "model.safetensors").string());
}

}  // namespace rlfleet::model
