// hf_tokenize: libs/model's HfTokenizer against Hugging Face's two references on the
// same tokenizer.json files and text, in the same run: Tokenizers.js (npm
// @huggingface/tokenizers, JavaScript) and the Rust `tokenizers` library (npm
// tokenizers: its Node binding, native code), both run by node
// (bench/tokenizers_js/encode.cjs). Measured: load time (read + parse + build), encode
// time of the text (best of --repeats, no special tokens), the ids (must be identical
// to both), and a 100,000-letter word. bench/hf_tokenize.sh installs the npm side,
// builds the text (the licence texts under /usr/share/common-licenses, ~400 KB) and
// runs this:
//   bash bench/hf_tokenize.sh      # writes bench/results/hf_tokenize.md
// Prints `name=value` lines per tokenizer NAME: tokenize_ratio_vs_tokenizers_js_NAME
// and tokenize_ratio_vs_rust_NAME (their encode time / ours), load_s_NAME,
// ids_identical_NAME (1 / 0: to both); exits 1 when ids differ.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/cpu_model.h"
#include "bench/json_command.h"
#include "libs/model/hf_tokenizer.h"

ABSL_FLAG(std::vector<std::string>, tokenizers, {}, "NAME=PATH of tokenizer.json files, e.g. qwen3=/x/tokenizer.json.");
ABSL_FLAG(std::string, text, "", "The text file to encode (UTF-8).");
ABSL_FLAG(std::string, text_note, "", "What the text is, for the table (default: its path).");
ABSL_FLAG(std::string, modules_dir, "", "Where npm installed bench/tokenizers_js/package.json; empty: ours only.");
ABSL_FLAG(std::string, js_script, "bench/tokenizers_js/encode.cjs", "The reference sides.");
ABSL_FLAG(int, repeats, 5, "Encodes of the text per side; the best is kept.");
ABSL_FLAG(std::string, out, "hf_tokenize.md", "Where the results table is written.");

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

double Seconds(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// One side's figures: ours, or a reference's.
struct Side {
  bool measured = false;
  double load_s = 0, encode_s = 0, letters_s = 0;
  double first_s = 0;  // the first encode of the text (a cold word cache, a JIT not warm)
  std::vector<int32_t> ids;
};

struct Row {
  std::string name;
  Side ours, js, rust;
  std::string mismatch;  // empty: identical to every reference measured
};

// A reference side ("js" or "rust") of encode.cjs on one tokenizer; exits on failure.
Side RunReference(const std::string& side, const std::string& tokenizer_path, const std::string& scratch, int repeats) {
  const std::string ids_file = absl::StrCat(scratch, ".", side, "_ids");
  int code = 0;
  const std::string json = rlfleet::bench::CommandOutput(
      absl::StrCat("node '", absl::GetFlag(FLAGS_js_script), "' ", side, " '", absl::GetFlag(FLAGS_modules_dir), "' '",
                   tokenizer_path, "' '", absl::GetFlag(FLAGS_text), "' '", ids_file, "' ", repeats),
      &code);
  const auto load = rlfleet::bench::JsonNumber(json, "load_s");
  const auto encode = rlfleet::bench::JsonNumber(json, "encode_s");
  const auto letters = rlfleet::bench::JsonNumber(json, "letters_100k_s");
  const auto first = rlfleet::bench::JsonNumber(json, "first_encode_s");
  if (code != 0 || !load || !encode || !letters || !first) {
    std::cerr << "hf_tokenize: the " << side << " side failed (exit " << code << "): " << json << "\n";
    std::exit(2);
  }
  Side out{true, *load, *encode, *letters, *first, {}};
  std::ifstream in(ids_file);
  for (int32_t id; in >> id;) out.ids.push_back(id);
  std::remove(ids_file.c_str());
  return out;
}

// Empty when `theirs` equals `ours`, else where they part.
std::string Difference(const std::vector<int32_t>& ours, const std::vector<int32_t>& theirs, const std::string& who) {
  if (ours == theirs) return "";
  size_t at = 0;
  while (at < ours.size() && at < theirs.size() && ours[at] == theirs[at]) ++at;
  return absl::StrCat("differs from ", who, " at token ", at, " (", ours.size(), " / ", theirs.size(), " tokens)");
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string text = ReadFile(absl::GetFlag(FLAGS_text));
  if (text.empty()) {
    std::cerr << "hf_tokenize: --text is empty or unreadable\n";
    return 2;
  }
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  if (absl::GetFlag(FLAGS_text_note).empty()) absl::SetFlag(&FLAGS_text_note, absl::GetFlag(FLAGS_text));
  std::vector<Row> rows;
  bool all_identical = true;
  for (const std::string& spec : absl::GetFlag(FLAGS_tokenizers)) {
    std::pair<std::string, std::string> name_path = absl::StrSplit(spec, absl::MaxSplits('=', 1));
    Row row;
    row.name = name_path.first;
    absl::Time start = absl::Now();
    auto tokenizer = rlfleet::model::HfTokenizer::FromFile(name_path.second);
    row.ours.load_s = Seconds(start);
    if (!tokenizer.ok()) {
      std::cerr << "hf_tokenize: " << tokenizer.status() << "\n";
      return 2;
    }
    row.ours.measured = true;
    row.ours.encode_s = 1e30;
    for (int i = 0; i < repeats; ++i) {
      start = absl::Now();
      auto encoded = (*tokenizer)->Encode(text);
      row.ours.encode_s = std::min(row.ours.encode_s, Seconds(start));
      if (i == 0) row.ours.first_s = row.ours.encode_s;
      if (!encoded.ok()) {
        std::cerr << "hf_tokenize: " << encoded.status() << "\n";
        return 2;
      }
      row.ours.ids = std::move(*encoded);
    }
    start = absl::Now();
    auto letters = (*tokenizer)->Encode(std::string(100000, 'a'));
    row.ours.letters_s = Seconds(start);
    if (!letters.ok()) std::cerr << "hf_tokenize: 100k letters: " << letters.status() << "\n";

    if (!absl::GetFlag(FLAGS_modules_dir).empty()) {
      const std::string scratch = absl::StrCat(absl::GetFlag(FLAGS_out), ".", row.name);
      row.js = RunReference("js", name_path.second, scratch, repeats);
      row.rust = RunReference("rust", name_path.second, scratch, repeats);
      row.mismatch = Difference(row.ours.ids, row.js.ids, "Tokenizers.js");
      if (row.mismatch.empty()) row.mismatch = Difference(row.ours.ids, row.rust.ids, "Rust tokenizers");
      all_identical = all_identical && row.mismatch.empty();
    }
    for (const auto& [who, side] : {std::make_pair("ours", &row.ours), std::make_pair("Tokenizers.js", &row.js),
                                    std::make_pair("Rust tokenizers", &row.rust)}) {
      if (!side->measured) continue;
      std::cerr << absl::StrFormat(
          "%s %s: load %.3f s, encode %.4f s (first %.4f s; %zu tokens), 100k letters %.4f s\n", row.name, who,
          side->load_s, side->encode_s, side->first_s, side->ids.size(), side->letters_s);
    }
    if (row.js.measured)
      std::cerr << row.name << ": ids " << (row.mismatch.empty() ? "identical" : row.mismatch) << "\n";
    rows.push_back(std::move(row));
  }

  std::ofstream out(absl::GetFlag(FLAGS_out));
  out << "# hf_tokenize: HfTokenizer (C++) vs Tokenizers.js and the Rust tokenizers library, same files and text\n\n"
      << "CPU: " << rlfleet::bench::CpuModel() << "\n\n"
      << "text: " << absl::GetFlag(FLAGS_text_note) << " (" << text.size() << " bytes); encode: best of " << repeats
      << " per side (first: the first of them), no special tokens; load = read + parse + build. js = Tokenizers.js "
         "(npm @huggingface/tokenizers), rust = the Rust library through its Node binding (npm tokenizers)\n\n"
      << "| tokenizer | side | load (s) | encode (s) | first encode (s) | MB/s | ours faster (encode) | 100k letters "
         "(s) "
         "| ids |\n"
      << "|---|---|---:|---:|---:|---:|---:|---:|---|\n";
  for (const Row& r : rows) {
    for (const auto& [who, side] :
         {std::make_pair("ours", &r.ours), std::make_pair("js", &r.js), std::make_pair("rust", &r.rust)}) {
      if (!side->measured) continue;
      const bool ours = side == &r.ours;
      out << absl::StrFormat("| %s | %s | %.3f | %.4f | %.4f | %.2f | %s | %.4f | %s |\n", r.name, who, side->load_s,
                             side->encode_s, side->first_s, text.size() / side->encode_s / 1e6,
                             ours ? "-" : absl::StrFormat("%.2fx", side->encode_s / r.ours.encode_s), side->letters_s,
                             ours ? absl::StrCat(side->ids.size(), " tokens")
                             : Difference(r.ours.ids, side->ids, "ours").empty() ? "identical to ours"
                                                                                 : "DIFFERENT");
    }
  }
  out << "\n";
  std::cout << "cpu=" << rlfleet::bench::CpuModel() << "\n";
  for (const Row& r : rows) {
    std::string lines;
    if (r.js.measured) {
      lines += absl::StrFormat("tokenize_ratio_vs_tokenizers_js_%s=%.3f\n", r.name, r.js.encode_s / r.ours.encode_s);
      lines += absl::StrFormat("tokenize_ratio_vs_rust_%s=%.3f\n", r.name, r.rust.encode_s / r.ours.encode_s);
      lines += absl::StrFormat("load_ratio_vs_tokenizers_js_%s=%.3f\n", r.name, r.js.load_s / r.ours.load_s);
      lines += absl::StrFormat("load_ratio_vs_rust_%s=%.3f\n", r.name, r.rust.load_s / r.ours.load_s);
      lines += absl::StrFormat("ids_identical_%s=%d\n", r.name, r.mismatch.empty() ? 1 : 0);
    }
    lines += absl::StrFormat("load_s_%s=%.3f\n", r.name, r.ours.load_s);
    lines += absl::StrFormat("letters_100k_s_%s=%.4f\n", r.name, r.ours.letters_s);
    out << lines;
    std::cout << lines;
  }
  std::cout << "table written to " << absl::GetFlag(FLAGS_out) << std::endl;
  return all_identical ? 0 : 1;
}
