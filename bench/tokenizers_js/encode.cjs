// bench/hf_tokenize's reference sides: Hugging Face's Tokenizers.js (npm
// @huggingface/tokenizers, JavaScript) or the Rust `tokenizers` library itself through
// its Node binding (npm tokenizers, prebuilt native code; the version Python's
// `tokenizers` wraps). Loads a tokenizer.json and encodes a text file, best of REPEATS,
// without special tokens. Writes the ids one per line to IDS_OUT and prints one JSON
// object: load_s (read + parse + construct), encode_s, first_encode_s, tokens, and
// letters_100k_s (a 100,000-letter word, one run).
//   node encode.cjs js|rust MODULES_DIR TOKENIZER_JSON TEXT_FILE IDS_OUT REPEATS
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const { createRequire } = require("node:module");

async function main() {
  const [side, modulesDir, tokenizerPath, textPath, idsOut, repeats] = process.argv.slice(2);
  const load = createRequire(path.join(path.resolve(modulesDir), "package.json"));
  let encode;
  let t0 = performance.now();
  if (side === "js") {
    const { Tokenizer } = load("@huggingface/tokenizers");
    const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerPath, "utf8")), {});
    encode = async (text) => tokenizer.encode(text, { add_special_tokens: false }).ids;
  } else if (side === "rust") {
    const { Tokenizer } = load("tokenizers");
    const tokenizer = Tokenizer.fromFile(tokenizerPath);
    encode = async (text) => (await tokenizer.encode(text, null, { addSpecialTokens: false })).getIds();
  } else {
    throw new Error(`side ${side}: js or rust`);
  }
  const loadS = (performance.now() - t0) / 1000;

  const text = fs.readFileSync(textPath, "utf8");
  let best = Infinity;
  let first = 0;
  let ids = [];
  for (let i = 0; i < Number(repeats); i++) {
    t0 = performance.now();
    ids = await encode(text);
    best = Math.min(best, (performance.now() - t0) / 1000);
    if (i === 0) first = best;
  }
  fs.writeFileSync(idsOut, ids.join("\n") + "\n");

  t0 = performance.now();
  await encode("a".repeat(100000));
  const lettersS = (performance.now() - t0) / 1000;
  // (spaced as bench/json_command.h reads it)
  console.log(`{"load_s": ${loadS}, "encode_s": ${best}, "tokens": ${ids.length}, "letters_100k_s": ${lettersS}, "first_encode_s": ${first}}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
