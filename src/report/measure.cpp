// A report's summary column: one model's costs, latency and accuracy, measured the same way for
// every report (the CLI's --report pages and the Python package's save_html).
#include <fmt/format.h>

#include "lopper/analysis.h"
#include "lopper/data.h"
#include "lopper/latency.h"
#include "lopper/report.h"
#include "lopper/sensitivity.h"
#include "lopper/train.h"

namespace lopper {

ReportModel measure_report_model(const std::string& label, const ir::Model& m,
                                 const ModelCost& cost, const ReportMeasure& how) {
  ReportModel r;
  r.label = label;
  r.params = cost.params;
  r.nonzero = cost.nonzero;
  r.macs = cost.macs;
  r.effective_macs = effective_cost(cost).macs;
  // As many runs as fit in about half a second (10 to 500): a 0.1 ms model needs hundreds for a
  // stable median, a 50 ms one a few.
  LatencyOptions lo;
  lo.min_runs = 10;
  lo.budget_ms = 500.0;
  lo.max_runs = 500;
  const LatencyStats lat = measure_model_latency(m, how.device, how.shapes, lo);
  set_latency(r, lat);
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

}  // namespace lopper
