// --report FILE.html for prune, sensitivity and train: the checks made before any work, and the
// figures measured for a report's summary.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lopper/graph.h"
#include "lopper/report.h"

namespace lopper {
class DataLoader;
struct ModelCost;
}  // namespace lopper

namespace lopper::cli {

/// Before any work: throws UsageError when `report` names one of `inputs` or `outputs` (the
/// command's other files) or a folder, or its folder does not exist — so that a long run never
/// ends without its report.
void check_report_path(const std::string& cmd, const std::string& report,
                       const std::vector<std::string>& inputs,
                       const std::vector<std::string>& outputs = {});

/// How a report's models are measured.
struct ReportMeasure {
  std::string device = "cpu";
  std::map<std::string, std::vector<int64_t>> shapes;  // inputs for latency (dynamic dims: 1)
  DataLoader* data = nullptr;  // top-1 and loss on it, when given ...
  int64_t eval_batches = 0;    // ... on its first batches (0: all)
  std::string data_name;       // "fashion-mnist (test)"
};

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
