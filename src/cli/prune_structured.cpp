// lopper prune --structured channel | head.
#include <fmt/format.h>
#include <iostream>
#include <nlohmann/json.hpp>
#include "common.h"
#include "lopper/analysis.h"
#include "lopper/error.h"
#include "lopper/files.h"
#include "lopper/onnx_io.h"
#include "lopper/prune.h"
#include "lopper/report.h"
#include "lopper/structured.h"
#include "prune.h"
#include "report.h"

namespace lopper::cli {

// lopper prune --structured channel|head: channels or heads removed, the model shrinks.
int run_structured(const Opts& o, const StructuredJob& job) {
  const StructuredOptions& so = job.options;
  OutputFiles files("prune");
  declare_files(files, o);
  ir::Model model = load_input_model(files, o.model);
  auto shapes = resolve_input_shapes(model, so.input_shapes);
  ModelCost before = analyze(model, shapes);
  StructuredReport r;
  if (job.needs_data) {
    const auto cal = calibration(o, model, false);
    r = job.run(model, cal->loader.get(), cal->co);
    cal->done();
  } else {
    r = job.run(model, nullptr, {});
  }
  ModelCost after = analyze(model, shapes);
  onnx::SaveOptions save;
  if (o.sparse) save.sparse = onnx::SaveOptions::Sparse::kAll;
  onnx::save_model(model, o.out, save, files);
  for (const auto& w : r.warnings) std::cerr << "lopper: [prune] warning: " << w << "\n";

  nlohmann::json j = to_json(r);
  j["model"] = o.model;
  j["out"] = o.out;
  j["structured"] = o.structured;
  j["method"] = so.criterion;
  j["scope"] = so.scope == PruneScope::kGlobal ? "global" : "local";
  put_costs(j, o, files, model, before, after);
  std::string report_path = o.out + ".report.json";
  files.write(report_path, j.dump(2) + "\n");
  if (!o.report.empty())
    write_html_report(files, o, model, [&](HtmlReport& rep) {
      for (const auto& b : r.barriers) rep.add_note("channels kept: " + b);
      for (const auto& w : r.warnings) rep.add_note(w);
    });
  files.commit();
  if (o.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << to_table(r) << cost_change(before, after)
            << fmt::format("file     {:>14} bytes (was {})\n", j["file_bytes_after"].get<int64_t>(),
                           j["file_bytes_before"].get<int64_t>());
  if (!r.barriers.empty()) {
    std::cout << "barriers (channels kept):\n";
    for (const auto& b : r.barriers) std::cout << "  " << b << "\n";
  }
  std::cout << "report   " << report_path << "\n";
  if (!o.report.empty()) std::cout << "report   " << o.report << "\n";
  return 0;
}
}  // namespace lopper::cli
