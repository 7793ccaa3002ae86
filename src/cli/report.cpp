#include "report.h"

#include <iostream>

#include "common.h"
#include "lopper/analysis.h"

namespace lopper::cli {

namespace {
std::string g_command_line = "lopper";
}  // namespace

ReportModel measure_for_report(const std::string& label, const std::string& path,
                               const ir::Model& m, const ModelCost& cost,
                               const ReportMeasure& how) {
  ReportModel r = measure_report_model(label, m, cost, how);
  r.path = path;
  r.file_bytes = model_file_bytes(path, m);
  if (!r.latency_warning.empty())
    std::cerr << "lopper: warning: " << label << " model: " << r.latency_warning << "\n";
  return r;
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
