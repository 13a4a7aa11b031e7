#include "services/controller/run_metrics.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rlfleet::controller {

absl::Status RunMetrics::Open(const std::filesystem::path& dir) {
  dir_ = dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  csv_.open(dir / "metrics.csv");
  if (ec || !csv_) return absl::InternalError(absl::StrCat("cannot write ", (dir / "metrics.csv").string()));
  csv_ << "step,seconds,policy_version,train_reward,entropy,idle_steps,heldout_exact,generate_s,train_s,sync_s,"
          "tokens_per_s,mean_staleness\n"
       << std::flush;
  return absl::OkStatus();
}

void RunMetrics::Add(const LoopProgress& p) {
  csv_ << absl::StrFormat("%d,%.2f,%d,%.4f,%.4f,%d,%s,%.3f,%.3f,%.3f,%.0f,%.3f\n", p.step, p.seconds,
                          p.policy_version, p.train_reward, p.entropy, p.idle_steps,
                          p.held_out_exact ? absl::StrFormat("%.4f", *p.held_out_exact) : "nan", p.generate_seconds,
                          p.train_seconds, p.sync_seconds, p.tokens_per_s, p.mean_staleness)
       << std::flush;
}

std::string RunMetrics::Finish() {
  csv_.close();
  const std::string csv = (dir_ / "metrics.csv").string();
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    return absl::StrCat("metrics: ", csv, " (no gnuplot: apt-get install gnuplot-nox for the curve)");
  }
  const std::filesystem::path script = dir_ / "reward_curve.gp";
  std::ofstream gp(script);
  gp << "set datafile separator ','\n"
     << "set key autotitle columnhead bottom right\n"
     << "set yrange [-0.2:1.05]\n"
     << "set terminal pngcairo size 1100,450 noenhanced\n"
     << "set output '" << (dir_ / "reward_curve.png").string() << "'\n"
     << "set multiplot layout 1,2\n"
     << "set xlabel 'step'\n"
     << "plot '" << csv << "' using 1:4 with lines lw 1, '' using 1:7 with linespoints lw 2 pt 7\n"
     << "set xlabel 'seconds'\n"
     << "plot '" << csv << "' using 2:4 with lines lw 1, '' using 2:7 with linespoints lw 2 pt 7\n"
     << "unset multiplot\n"
     << "set terminal dumb size 100,24\n"
     << "set output '" << (dir_ / "reward_curve.txt").string() << "'\n"
     << "set xlabel 'step'\n"
     << "plot '" << csv << "' using 1:4 with lines, '' using 1:7 with points pt '*'\n";
  gp.close();
  const std::string cmd = absl::StrCat("gnuplot '", script.string(), "' >/dev/null 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    return absl::StrCat("metrics: ", csv, " (gnuplot failed on ", script.string(), ")");
  }
  return absl::StrCat("metrics: ", csv, "\ncurve:   ", (dir_ / "reward_curve.png").string(), " (text: ",
                      (dir_ / "reward_curve.txt").string(), ")");
}

}  // namespace rlfleet::controller
