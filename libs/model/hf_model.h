// A Hugging Face model directory (what `save_pretrained` writes) as a Policy, and back:
// config.json to a PolicyConfig (Llama, Qwen2 / Qwen2.5, Qwen3; transformers 4's
// spelling and 5's), the weights from model.safetensors or the shards a
// model.safetensors.index.json lists (F32, BF16 or F16), and a directory that
// `transformers.AutoModelForCausalLM.from_pretrained` loads.
//
// No libtorch here: this builds on policy.h's interface (the model backend).
#ifndef RLFLEET_LIBS_MODEL_HF_MODEL_H_
#define RLFLEET_LIBS_MODEL_HF_MODEL_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libs/model/policy.h"
#include "libs/model/safetensors.h"

namespace rlfleet::model {

// The KV cache width a model directory's policy gets unless told: its
// max_position_embeddings, capped here (a cache that wide would be large).
inline constexpr int kDefaultHfMaxSeqLen = 2048;

// The PolicyConfig config.json's text describes (`name` names it in errors), with
// max_seq_len = min(max_position_embeddings, kDefaultHfMaxSeqLen) and dtype fp32.
// INVALID_ARGUMENT naming the problem: text that does not parse (line and column), a
// model_type other than llama / qwen2 / qwen3, a key missing or of the wrong type (its
// name), or a feature this model does not implement (sliding-window attention, a
// rope_type other than default / llama3, an activation other than silu).
absl::StatusOr<PolicyConfig> ParseHfConfig(absl::string_view json, const std::string& name);
// The same from DIR/config.json (NOT_FOUND when it is absent).
absl::StatusOr<PolicyConfig> ReadHfConfig(const std::string& dir);

// A model directory's weights: views into the files read (kept in `files`), checked
// against the parameter names of a policy of its config (`parameters`, `config`): a
// tensor that is not one of them is refused by name, except what older checkpoints carry
// beside the parameters (rotary tables; a tied model's lm_head copy), which is dropped.
// What LoadHfWeights loads, for a caller that installs them itself (a rollout
// replica's scheduler). Errors as LoadHfWeights's.
struct HfWeights {
  std::vector<std::unique_ptr<std::string>> files;
  std::map<std::string, TensorView> tensors;
};
absl::StatusOr<HfWeights> ReadHfWeights(const std::string& dir, const std::vector<std::string>& parameters,
                                        const PolicyConfig& config);

// The model's end-of-sequence token ids: generation_config.json's `eos_token_id` (an id
// or a list), else config.json's; empty when neither names one. INVALID_ARGUMENT for a
// value that is not an id or a list of ids.
absl::StatusOr<std::vector<int32_t>> ReadHfEosIds(const std::string& dir);

// Loads a model directory's weights into `policy` (made from its config): every
// parameter must be there with its shape, except a value head (PPO's critic), which
// starts at zero when the directory has none; a value head in the directory is
// dropped for a policy without one. Nothing changes on error. NOT_FOUND when the
// directory has neither model.safetensors nor model.safetensors.index.json, or a shard
// the index lists is absent (naming it); INVALID_ARGUMENT naming a tensor that is
// missing, of the wrong shape or dtype, or not a parameter of this model.
absl::Status LoadHfWeights(const std::string& dir, Policy* policy);

struct HfLoadOptions {
  std::string device = "cpu";
  std::string dtype = "fp32";  // PolicyConfig::dtype
  int max_seq_len = 0;         // the KV cache width; 0 = min(max_position_embeddings, kDefaultHfMaxSeqLen)
};

// ReadHfConfig + Policy::Create + LoadHfWeights.
absl::StatusOr<std::unique_ptr<Policy>> LoadHfModel(const std::string& dir, const HfLoadOptions& options);

// A reward model directory: transformers' <Arch>ForSequenceClassification with one label
// (what TRL / OpenRLHF reward models are, e.g. Skywork-Reward), as a policy with a value
// head: its trunk, and its `score` head (no bias) as the value head, whose output at
// the last token is the reward, as the classifier's logit at the last token is. The
// policy's LM head, which a reward model lacks, is the embedding's copy and unused.
// INVALID_ARGUMENT when config.json's `architectures` is not a sequence classifier or
// `num_labels` / `id2label` is not one label; otherwise errors as LoadHfModel's.
absl::StatusOr<std::unique_ptr<Policy>> LoadHfRewardModel(const std::string& dir, const HfLoadOptions& options);

// config.json for a Llama-family config (dtype float32: what WriteHfModelDir writes),
// in transformers 5's spelling and 4's alike (rope_parameters and rope_theta /
// rope_scaling, dtype and torch_dtype), so either version reads it. `base`, when given,
// is the config.json of the directory the model was read from: its other keys stay
// (max_position_embeddings, bos / eos / pad ids, ...); without one,
// max_position_embeddings is config.max_seq_len. A base that does not parse is ignored.
std::string HfConfigJson(const PolicyConfig& config, absl::string_view base = "");

// The tokenizer files a model directory may hold beside its config and weights.
inline constexpr const char* kHfTokenizerFiles[] = {"tokenizer.json",
                                                    "tokenizer_config.json",
                                                    "chat_template.jinja",
                                                    "special_tokens_map.json",
                                                    "generation_config.json",
                                                    "vocab.json",
                                                    "merges.txt"};

// A model directory's files but the weights, in DIR (which exists), each written
// atomically: config.json for `config` (on `from`'s config.json, HfConfigJson) and the
// kHfTokenizerFiles `from` holds, when `from` is not empty. INVALID_ARGUMENT for arch
// gpt (no such transformers model) or a config transformers cannot spell.
absl::Status WriteHfModelFiles(const PolicyConfig& config, const std::string& dir, const std::string& from = "");

// Writes `policy` as a model directory: WriteHfModelFiles, and DIR/model.safetensors
// (F32, named as transformers names them).
absl::Status WriteHfModelDir(const Policy& policy, const std::string& dir, const std::string& from = "");

}  // namespace rlfleet::model

#endif  // RLFLEET_LIBS_MODEL_HF_MODEL_H_
