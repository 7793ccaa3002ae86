// lopper prune's three flows (per layer, --structured, --target-*): their flags and the helpers
// they share (internal to the CLI).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "lopper/command.h"
#include "lopper/data.h"
#include "lopper/progress.h"
#include "lopper/prune.h"
#include "lopper/report.h"
#include "lopper/target.h"
#include "lopper/train.h"

namespace lopper::cli {

struct Opts {
  std::string model, out, method, amount, scope = "local", pattern = "unstructured", exclude,
                                          recipe, device = "cpu";
  DataFlags data;  // calibration (data-driven criteria), sensitivity (targets), --report's top-1
  double threshold = -1;
  uint64_t seed = 0;
  int norm = 1;
  int64_t calib_batches = 32;  // wanda, sparsegpt, OWL: 128 samples unless given
  bool calib_batches_given = false;
  int64_t block_size = 128;
  double dampening = 0.01, owl_lambda = 0, owl_m = 5;
  bool one_pass = false;
  bool skip_first_last = false, sparse = false, json = false, have_threshold = false,
       allow_tied = false;
  std::string structured;
  double max_layer_amount = 0.9;
  int64_t round_to = 1;
  std::vector<std::string> shapes;
  double target_macs = 0, target_params = 0, target_latency_ms = 0;
  std::string sensitivity, report;
  int64_t eval_batches = 16;
  int threads = 0;
};

// The calibration of the criteria that read the layers' inputs (wanda, sparsegpt, OWL): every
// batch the same size, the papers' 128 samples unless --calib-batches says otherwise.
std::pair<LoaderOptions, CalibrationOptions> input_calibration(const Opts& o,
                                                               const ir::Model& model);
// The calibration of a prune that reads data: its batches (--data, --calib-batches) and options,
// with a progress bar. `layer_inputs`: wanda, sparsegpt, OWL (input_calibration); else gradient
// saliencies.
struct Calibration {
  std::unique_ptr<DataLoader> loader;
  CalibrationOptions co;
  std::unique_ptr<Progress> bar;
  int64_t bar_total = 0;  // the bar's steps: a calibration that counts other steps makes a new one
  bool finish_bar = false;
  void done();  // after the run: the bar's last line
};
std::unique_ptr<Calibration> calibration(const Opts& o, const ir::Model& model, bool layer_inputs);
// --report: the models before (read again from --model) and after, measured on --device, top-1
// and loss on the first --eval-batches batches of --data when it is given (`known`: already
// evaluated there, before and after); `extra` adds what the kind of pruning knows.
void write_html_report(OutputFiles& files, const Opts& o, const ir::Model& after,
                       const std::function<void(HtmlReport&)>& extra = {},
                       const std::pair<EvalResult, EvalResult>* known = nullptr);
// The report's model costs before and after (a model that shrinks, or a target).
void put_costs(nlohmann::json& j, const Opts& o, const OutputFiles& files, const ir::Model& input,
               const ModelCost& before, const ModelCost& after);
// The files of a prune: what it reads, then what it writes (checked before any work).
void declare_files(OutputFiles& files, const Opts& o);

// lopper prune --target-macs|--target-params|--target-latency-ms.
int run_target(const Opts& o, const TargetJob& job);
// lopper prune --structured channel|head.
int run_structured(const Opts& o, const StructuredJob& job);

}  // namespace lopper::cli
