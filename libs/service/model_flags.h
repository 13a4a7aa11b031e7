// The model a service runs, from its flags: a Hugging Face model directory's
// config.json (--model_dir: the shape flags are refused when given, --max_seq_len
// applies only when given), or the built-in model's shape flags.
#ifndef RLFLEET_LIBS_SERVICE_MODEL_FLAGS_H_
#define RLFLEET_LIBS_SERVICE_MODEL_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "libs/model/policy.h"

namespace rlfleet::service {

// The values of a service's --d_model, --n_layers, --n_heads and --max_seq_len.
struct ShapeFlags {
  int d_model = 0;
  int n_layers = 0;
  int n_heads = 0;
  int max_seq_len = 0;
};

// INVALID_ARGUMENT naming the flag given beside --model_dir ("--d_model with
// --model_dir: ..."); the directory's config.json errors (NOT_FOUND, INVALID_ARGUMENT
// naming the key) annotated with "--model_dir".
absl::StatusOr<model::PolicyConfig> PolicyConfigFromFlags(const std::string& model_dir, const ShapeFlags& shape);

}  // namespace rlfleet::service

#endif  // RLFLEET_LIBS_SERVICE_MODEL_FLAGS_H_
