// lopper prune --structured channel | head.
#include <fmt/format.h>
#include <iostream>
#include <nlohmann/json.hpp>
#include "cli/common.h"
#include "cli/prune.h"
#include "cli/report.h"
#include "lopper/analysis.h"
#include "lopper/error.h"
#include "lopper/onnx_io.h"
#include "lopper/prune.h"
#include "lopper/report.h"
#include "lopper/structured.h"
#include "onnx/save.h"
#include "prune/importance.h"
#include "util/files.h"

namespace lopper::cli {

// lopper prune --structured channel|head: channels or heads removed, the model shrinks.
int run_structured(const Opts& o) {
  StructuredOptions so;
  if (o.structured == "channel")
    so.unit = StructuredUnit::kChannel;
  else if (o.structured == "head")
    so.unit = StructuredUnit::kHead;
  else
    throw UsageError("[prune] --structured takes channel or head, got '" + o.structured + "'");
  const importance::Criterion& crit = channel_criterion(o.method);
  so.criterion = crit.name;
  std::optional<PruneRecipe> recipe;
  if (!o.recipe.empty()) {
    // One rule with lopper.prune_structured: a recipe sets every group's amount.
    if (!o.amount.empty())
      throw UsageError(
          "[prune] --recipe sets each group's amount: drop --amount (put it in the "
          "recipe)");
    recipe = load_prune_recipe(o.recipe);
    so.recipe = &*recipe;
  } else {
    if (o.amount.empty()) throw UsageError("[prune] --structured needs --amount A (or --recipe)");
    so.amount = parse_flag([&] { return PruneAmount::parse(o.amount); });
  }
  if (o.scope == "global")
    so.scope = PruneScope::kGlobal;
  else if (o.scope != "local")
    throw UsageError("[prune] unknown scope '" + o.scope + "' (scopes: local, global)");
  so.max_layer_amount = o.max_layer_amount;
  so.round_to = o.round_to;
  so.exclude = o.exclude;
  so.seed = o.seed;
  so.input_shapes = parse_shape_overrides(o.shapes);
  const bool needs_data = crit.needs_data();
  if (needs_data && !o.data.given())
    throw UsageError("[prune] --method " + so.criterion + " ranks channels " +
                     importance::data_needed(crit) + " on data: give --data SPEC");
  if (!needs_data && o.data.given() && o.report.empty())
    throw UsageError("[prune] --data is for the methods that rank by data (" + data_methods() +
                     ") only, or for the accuracy in --report");

  OutputFiles files("prune");
  declare_files(files, o);
  ir::Model model = load_input_model(files, o.model);
  auto shapes = resolve_input_shapes(model, so.input_shapes);
  ModelCost before = analyze(model, shapes);
  std::optional<Saliency> saliency;
  if (needs_data) saliency = calibrate(o, model);
  StructuredReport r = prune_structured(model, so, saliency ? &*saliency : nullptr);
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
  j["scope"] = o.scope;
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
