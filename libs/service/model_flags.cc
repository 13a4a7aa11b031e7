#include "libs/service/model_flags.h"

#include "absl/strings/str_cat.h"
#include "libs/common/config.h"
#include "libs/common/status_macros.h"
#include "libs/model/hf_model.h"

namespace rlfleet::service {

absl::StatusOr<model::PolicyConfig> PolicyConfigFromFlags(const std::string& model_dir, const ShapeFlags& shape) {
  model::PolicyConfig config;
  if (model_dir.empty()) {
    config.d_model = shape.d_model;
    config.n_layers = shape.n_layers;
    config.n_heads = shape.n_heads;
    config.max_seq_len = shape.max_seq_len;
    return config;
  }
  for (const char* flag : {"d_model", "n_layers", "n_heads"}) {
    if (common::FlagWasGiven(flag)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " with --model_dir: the shape is the directory's config.json"));
    }
  }
  absl::StatusOr<model::PolicyConfig> hf = model::ReadHfConfig(model_dir);
  if (!hf.ok()) return common::Annotate(hf.status(), "--model_dir");
  config = *hf;
  if (common::FlagWasGiven("max_seq_len")) config.max_seq_len = shape.max_seq_len;
  return config;
}

}  // namespace rlfleet::service
