// --report FILE.html for prune, sensitivity and train: the checks made before any work, and the
// figures measured for a report's summary.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lopper/graph.h"
#include "lopper/loss.h"
#include "lopper/report.h"

namespace lopper {
class DataLoader;
struct LatencyStats;
struct ModelCost;
}  // namespace lopper

namespace lopper::cli {

/// How a report's models are measured.
struct ReportMeasure {
  std::string device = "cpu";
  std::map<std::string, std::vector<int64_t>> shapes;  // inputs for latency (dynamic dims: 1)
  DataLoader* data = nullptr;                          // top-1 and loss on it, when given ...
  int64_t eval_batches = 0;                            // ... on its first batches (0: all)
  std::string data_name;                               // "fashion-mnist (test)"
  LossOptions loss;                                    // what the loss on `data` is
};

/// A latency measurement into `m`: its median, p10, p90, runs and the wide-spread warning.
void set_latency(ReportModel& m, const LatencyStats& s);

/// Top-1 and loss measured on `samples` samples of `data_name`, into `m` (and its `measured` note).
void set_accuracy(ReportModel& m, double top1, double loss, int64_t samples,
                  const std::string& data_name);

/// `m`'s summary figures: costs from `cost`, file size of `path`, latency, accuracy.
ReportModel measure_for_report(const std::string& label, const std::string& path,
                               const ir::Model& m, const ModelCost& cost, const ReportMeasure& how);

/// The command line, for a report's header (set by main()).
void set_command_line(int argc, char** argv);
const std::string& command_line();

}  // namespace lopper::cli
