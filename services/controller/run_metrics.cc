#include "services/controller/run_metrics.h"

#include <iostream>
#include <optional>
#include <utility>
#include <vector>

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
  if (absl::Status s = events_.Open(dir.string()); !s.ok()) return s;
  if (had_rows) return absl::OkStatus();
  csv_ << "step,seconds,policy_version,train_reward,entropy,idle_steps,heldout_exact,generate_s,train_s,sync_s,"
          "tokens_per_s,mean_staleness,loss,kl,grad_norm,trained_sequences\n"
       << std::flush;
  return absl::OkStatus();
}

void RunMetrics::Add(const LoopProgress& p) {
  csv_ << absl::StrFormat("%d,%.2f,%d,%.4f,%.4f,%d,%s,%.3f,%.3f,%.3f,%.0f,%.3f", p.step, p.seconds, p.policy_version,
                          p.train_reward, p.entropy, p.idle_steps,
                          p.held_out_exact ? absl::StrFormat("%.4f", *p.held_out_exact) : "nan", p.generate_seconds,
                          p.train_seconds, p.sync_seconds, p.tokens_per_s, p.mean_staleness)
       << absl::StrFormat(",%.5f,%.6f,%.4f,%d\n", p.loss, p.approx_kl, p.grad_norm, p.trained_sequences) << std::flush;
  if (events_.path().empty()) return;
  std::vector<std::pair<std::string, double>> scalars = {{"train/reward", p.train_reward},
                                                         {"train/loss", p.loss},
                                                         {"train/kl", p.approx_kl},
                                                         {"train/entropy", p.entropy},
                                                         {"train/grad_norm", p.grad_norm},
                                                         {"train/mean_staleness", p.mean_staleness},
                                                         {"train/idle_steps", p.idle_steps},
                                                         {"perf/tokens_per_s", p.tokens_per_s},
                                                         {"perf/generate_s", p.generate_seconds},
                                                         {"perf/train_s", p.train_seconds},
                                                         {"perf/sync_s", p.sync_seconds},
                                                         {"run/policy_version", static_cast<double>(p.policy_version)}};
  if (p.held_out_exact) scalars.push_back({"heldout/exact_match", *p.held_out_exact});
  if (absl::Status s = events_.AddScalars(p.step, scalars); !s.ok() && !events_failed_) {
    events_failed_ = true;  // (said once; the CSV goes on)
    std::cerr << "metrics: " << s.message() << "\n";
  }
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
