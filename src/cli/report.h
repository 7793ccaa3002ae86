// --report FILE.html for prune, sensitivity and train: the checks made before any work, and the
// figures measured for a report's summary.
#pragma once

#include <string>

#include "lopper/graph.h"
#include "lopper/report.h"

namespace lopper {
struct ModelCost;
}  // namespace lopper

namespace lopper::cli {

/// `m`'s summary figures (measure_report_model, lopper/report.h) with the file size of `path`; a
/// wide latency spread is also a warning on stderr.
ReportModel measure_for_report(const std::string& label, const std::string& path,
                               const ir::Model& m, const ModelCost& cost, const ReportMeasure& how);

/// The command line, for a report's header (set by main()).
void set_command_line(int argc, char** argv);
const std::string& command_line();

}  // namespace lopper::cli
