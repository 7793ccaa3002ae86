// lopper inspect MODEL [--shape NAME=1x3x224x224] [--json]
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "lopper/command.h"
#include "lopper/error.h"

namespace lopper::cli {

namespace {
std::string human(double v) {
  if (v >= 1e9) return fmt::format("{:.2f} G", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f} M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f} K", v / 1e3);
  return fmt::format("{:.0f}", v);
}
}  // namespace

Action add_inspect(CLI::App& app) {
  struct Opts {
    InspectRequest req;
    std::vector<std::string> shapes;
    bool json = false;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = model_command(app, "inspect", "per-layer parameters, nonzeros and MACs of a model",
                            o->req.model);
  cmd->add_option("--shape", o->shapes, "NAME=1x3x224x224 (dynamic dims default to 1)");
  cmd->add_flag("--json", o->json, "print one JSON object");
  add_threads_option(cmd, o->threads);
  return [o]() {
    configure_threads(o->threads);
    InspectRequest& req = o->req;
    req.input_shapes = parse_shape_overrides(o->shapes);
    const InspectResult r = req.run();
    const ModelCost& cost = r.cost;
    const int64_t file_bytes = r.file_bytes;
    if (o->json) {
      nlohmann::json j;
      j["model"] = req.model;
      j["params"] = cost.params;
      j["nonzero"] = cost.nonzero;
      j["macs"] = cost.macs;
      j["file_bytes"] = file_bytes;
      j["inputs"] = cost.input_shapes;
      j["layers"] = nlohmann::json::array();
      for (size_t i = 0; i < cost.layers.size(); ++i) {
        const LayerCost& l = cost.layers[i];
        j["layers"].push_back({{"name", l.name},
                               {"op", l.op},
                               {"weight", l.weight},
                               {"param", l.param},
                               {"shape", l.weight_shape},
                               {"params", l.params},
                               {"nonzero", l.nonzero},
                               {"macs", l.macs},
                               {"shared", bool(r.shared[i])}});
      }
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::vector<std::string> names;
    // A layer by its PyTorch parameter where the model names it, else by its node.
    auto label = [](const LayerCost& l) { return l.param.empty() ? l.name : l.param; };
    for (const auto& l : cost.layers) names.push_back(label(l));
    size_t w = name_column_width(names, 4);
    std::cout << fmt::format("{:<{}}  {:<13} {:<18} {:>12} {:>12} {:>9} {:>14}\n", "layer", w, "op",
                             "weight", "params", "nonzero", "sparsity", "MACs");
    for (size_t i = 0; i < cost.layers.size(); ++i) {
      const LayerCost& l = cost.layers[i];
      std::string shape = shape_string(l.weight_shape) + (r.shared[i] ? " shared" : "");
      double sp = l.params ? 100.0 * (1.0 - double(l.nonzero) / double(l.params)) : 0.0;
      std::string name = fit_name(label(l), w);
      std::cout << fmt::format("{:<{}}  {:<13} {:<18} {:>12} {:>12} {:>8.1f}% {:>14}\n", name, w,
                               l.op, shape, l.params, l.nonzero, sp, l.macs);
    }
    if (std::find(r.shared.begin(), r.shared.end(), true) != r.shared.end())
      std::cout << "shared: one weight several layers read (stored once, counted once in params)\n";
    double sp = cost.params ? 100.0 * (1.0 - double(cost.nonzero) / double(cost.params)) : 0.0;
    std::cout << "\ninputs:";
    for (const auto& [n, d] : cost.input_shapes) std::cout << " " << n << "=" << shape_string(d);
    std::cout << "\n"
              << fmt::format("params   {:>14}  ({})\n", cost.params, human(cost.params))
              << fmt::format("nonzero  {:>14}  ({}, sparsity {:.1f}%)\n", cost.nonzero,
                             human(cost.nonzero), sp)
              << fmt::format("MACs     {:>14}  ({})\n", cost.macs, human(cost.macs))
              << fmt::format("file     {:>14}  ({}B)\n", file_bytes, human(file_bytes));
    return 0;
  };
}

}  // namespace lopper::cli
