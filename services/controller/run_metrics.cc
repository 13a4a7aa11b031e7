#include "services/controller/run_metrics.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "libs/common/files.h"

namespace rlfleet::controller {

absl::Status RunMetrics::Open(const std::filesystem::path& dir, bool append) {
  dir_ = dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const bool had_rows = append && std::filesystem::file_size(dir / "metrics.csv", ec) > 0 && !ec;
  ec.clear();
  csv_.open(dir / "metrics.csv", had_rows ? std::ios::app : std::ios::trunc);
  if (ec || !csv_) return absl::InternalError(absl::StrCat("cannot write ", (dir / "metrics.csv").string()));
  if (had_rows) return absl::OkStatus();
  csv_ << "step,seconds,policy_version,train_reward,entropy,idle_steps,heldout_exact,generate_s,train_s,sync_s,"
          "tokens_per_s,mean_staleness\n"
       << std::flush;
  return absl::OkStatus();
}

void RunMetrics::Add(const LoopProgress& p) {
  csv_ << absl::StrFormat("%d,%.2f,%d,%.4f,%.4f,%d,%s,%.3f,%.3f,%.3f,%.0f,%.3f\n", p.step, p.seconds, p.policy_version,
                          p.train_reward, p.entropy, p.idle_steps,
                          p.held_out_exact ? absl::StrFormat("%.4f", *p.held_out_exact) : "nan", p.generate_seconds,
                          p.train_seconds, p.sync_seconds, p.tokens_per_s, p.mean_staleness)
       << std::flush;
}

namespace {

// `path` as a gnuplot single-quoted string (a quote inside is doubled); nullopt for a
// path with a control character (it could end the script's line).
std::optional<std::string> GnuplotQuoted(const std::string& path) {
  std::string out = "'";
  for (char c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return std::nullopt;
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

}  // namespace

std::string RunMetrics::Finish() {
  csv_.close();
  const std::string csv = (dir_ / "metrics.csv").string();
  if (!common::ProgramInPath("gnuplot")) {
    return absl::StrCat("metrics: ", csv, " (no gnuplot: apt-get install gnuplot-nox for the curve)");
  }
  const std::filesystem::path script = dir_ / "reward_curve.gp";
  const std::optional<std::string> data = GnuplotQuoted(csv), png = GnuplotQuoted((dir_ / "reward_curve.png").string()),
                                   txt = GnuplotQuoted((dir_ / "reward_curve.txt").string());
  if (!data || !png || !txt)
    return absl::StrCat("metrics: ", csv, " (no curve: the folder's name has a control character)");
  std::ofstream gp(script);
  gp << "set datafile separator ','\n"
     << "set key autotitle columnhead bottom right\n"
     << "set yrange [-0.2:1.05]\n"
     << "set terminal pngcairo size 1100,450 noenhanced\n"
     << "set output " << *png << "\n"
     << "set multiplot layout 1,2\n"
     << "set xlabel 'step'\n"
     << "plot " << *data << " using 1:4 with lines lw 1, '' using 1:7 with linespoints lw 2 pt 7\n"
     << "set xlabel 'seconds'\n"
     << "plot " << *data << " using 2:4 with lines lw 1, '' using 2:7 with linespoints lw 2 pt 7\n"
     << "unset multiplot\n"
     << "set terminal dumb size 100,24\n"
     << "set output " << *txt << "\n"
     << "set xlabel 'step'\n"
     << "plot " << *data << " using 1:4 with lines, '' using 1:7 with points pt '*'\n";
  gp.close();
  // Exec'd with the script as its one argument: no shell reads any of these paths.
  if (absl::Status s = common::RunProgram({"gnuplot", script.string()}, absl::Seconds(60)); !s.ok()) {
    return absl::StrCat("metrics: ", csv, " (gnuplot failed on ", script.string(), ": ", s.message(), ")");
  }
  return absl::StrCat("metrics: ", csv, "\ncurve:   ", (dir_ / "reward_curve.png").string(),
                      " (text: ", (dir_ / "reward_curve.txt").string(), ")");
}

}  // namespace rlfleet::controller
