#!/usr/bin/env bash
# examples/math/run_cpu.sh on a GPU host with a Qwen2.5-0.5B-shaped model (24 layers,
# d 896, 14 / 2 heads, vocabulary 151936, tied; random weights made here by transformers,
# saved in bf16, with the Qwen2-style test tokenizer): rollout and trainer on cuda:0.
# On the GPU machine, over what deploy/gpu/pack_fleet.sh packed:
#   bash examples/math/run_gpu.sh            (STEPS=10, DIR=/tmp/rlfleet-math-gpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
export DIR="${DIR:-/tmp/rlfleet-math-gpu}" STEPS="${STEPS:-10}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bash deploy/gpu/unpack_carry.sh
backends="$(deploy/gpu/build_backends.sh)"
export LD_LIBRARY_PATH="$backends:$PWD/.carry/lib:$PWD/.carry/absl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PWD/.carry/bin/system:$PATH"
export RLFLEET_BIN="$PWD/.carry/bin/services"
mkdir -p "$DIR"
python3 - "$DIR/model" <<'PY'
import shutil, sys, torch, transformers
out = sys.argv[1]
config = transformers.Qwen2Config(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, eos_token_id=0)
torch.manual_seed(0)
transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
shutil.copy("libs/model/testdata/hf/tokenizer_qwen2/tokenizer.json", out)
print("model:", out)
PY
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
RLFLEET_MODEL_DIR="$DIR/model" RLFLEET_MODEL_FLAGS="--device=cuda:0" RLFLEET_LOOP_FLAGS="--lr=1e-5" \
  bash examples/math/run_cpu.sh
