#include "cli/report.h"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "cli/common.h"
#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/latency.h"
#include "lopper/sensitivity.h"
#include "lopper/target.h"
#include "lopper/train.h"

namespace lopper::cli {

namespace {
std::string g_command_line = "lopper";
}  // namespace

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
  r.file_bytes = model_file_bytes(path, m);
  // As many runs as fit in about half a second (10 to 500): a 0.1 ms model needs hundreds for a
  // stable median, a 50 ms one a few.
  LatencyOptions lo;
  lo.min_runs = 10;
  lo.budget_ms = 500.0;
  lo.max_runs = 500;
  const LatencyStats lat = measure_model_latency(m, how.device, how.shapes, lo);
  set_latency(r, lat);
  if (lat.wide) std::cerr << "lopper: warning: " << label << " model: " << lat.warning() << "\n";
  std::string batch;
  for (const auto& [name, dims] : resolve_input_shapes(m, how.shapes, 1))
    if (!dims.empty()) {
      batch = fmt::format("batch {}", dims[0]);
      break;
    }
  r.measured = fmt::format("latency: median of {} runs on {}{}", lat.runs, how.device,
                           batch.empty() ? "" : ", " + batch);
  if (how.data) {
    EvalOptions eo;
    eo.device = how.device;
    eo.max_batches = how.eval_batches;
    eo.loss = how.loss;
    const EvalResult e = evaluate(m, *how.data, eo);
    set_accuracy(r, e.top1, e.loss, e.samples, how.data_name);
  }
  return r;
}

void set_latency(ReportModel& m, const LatencyStats& s) {
  m.latency_ms = s.median_ms;
  m.latency_p10_ms = s.p10_ms;
  m.latency_p90_ms = s.p90_ms;
  m.latency_runs = s.runs;
  m.latency_warning = s.warning();
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
