#include "cli/report.h"

#include <fmt/format.h>

#include <filesystem>

#include "cli/common.h"
#include "lopper/analysis.h"
#include "lopper/budget.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/sensitivity.h"
#include "lopper/train.h"

namespace lopper::cli {

namespace {
std::string g_command_line = "lopper";
}  // namespace

void check_report_path(const std::string& cmd, const std::string& report,
                       const std::vector<std::string>& inputs,
                       const std::vector<std::string>& outputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& out : outputs)
    if (!out.empty() && fs::path(out).lexically_normal() == fs::path(report).lexically_normal())
      throw UsageError("[" + cmd + "] --report and another output both name " + report);
  for (const auto& in : inputs)
    if (!in.empty() && fs::exists(report, ec) && fs::equivalent(in, report, ec))
      throw UsageError("[" + cmd + "] --report names an input (" + in +
                       "); lopper never overwrites its input");
  const fs::path dir = fs::path(report).parent_path();
  if (!dir.empty() && !fs::is_directory(dir, ec))
    throw UsageError("[" + cmd + "] --report " + report + ": no folder " + dir.string());
  if (fs::is_directory(report, ec))
    throw UsageError("[" + cmd + "] --report " + report + " is a folder; give a file name");
}

ReportModel measure_for_report(const std::string& label, const std::string& path,
                               const ir::Model& m, const ModelCost& cost,
                               const ReportMeasure& how) {
  ReportModel r;
  r.label = label;
  r.path = path;
  r.params = cost.params;
  r.nonzero = cost.nonzero;
  r.macs = cost.macs;
  r.effective_macs = effective_cost(cost).macs;
  r.file_bytes = model_file_bytes(path);
  // As many runs as fit in about half a second (10 to 500): a 0.1 ms model needs hundreds for a
  // stable median, a 50 ms one a few.
  int iters = 0;
  r.latency_ms = measure_latency_ms(m, how.device, how.shapes, 10, 500.0, &iters);
  std::string batch;
  for (const auto& [name, dims] : resolve_input_shapes(m, how.shapes, 1))
    if (!dims.empty()) {
      batch = fmt::format("batch {}", dims[0]);
      break;
    }
  r.measured = fmt::format("latency: median of {} runs on {}{}", iters, how.device,
                           batch.empty() ? "" : ", " + batch);
  if (how.data) {
    const EvalResult e = evaluate(m, *how.data, how.device, {}, at::kFloat, how.eval_batches);
    set_accuracy(r, e.top1, e.loss, e.samples, how.data_name);
  }
  return r;
}

void set_accuracy(ReportModel& m, double top1, double loss, int64_t samples,
                  const std::string& data_name) {
  m.top1 = top1;
  m.loss = loss;
  m.measured += fmt::format("; top-1 and loss on {} samples of {}", samples, data_name);
}

void set_command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = i == 0 ? "lopper" : argv[i];
    const bool quote = a.empty() || a.find_first_of(" \t\"'$\\*?;&|<>()") != std::string::npos;
    if (quote) {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      a = q + "'";
    }
    s += (i ? " " : "") + a;
  }
  g_command_line = s;
}

const std::string& command_line() { return g_command_line; }

}  // namespace lopper::cli
