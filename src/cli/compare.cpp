// lopper compare BEFORE AFTER [--data D] [--split test] [--batch 1] [--iters 200] [--threads T]
//   [--json] [--report FILE]
// The gain, measured: params, nonzero, MACs, file size, accuracy and latency of two models, side by
// side, with the ratio after / before.
#include <fmt/format.h>

#include <iostream>

#include "commands.h"
#include "common.h"
#include "lopper/command.h"
#include "report.h"

namespace lopper::cli {

Action add_compare(CLI::App& app) {
  struct Opts {
    CompareRequest req;
    DataFlags data;
    int threads = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "compare", "two models side by side: params, nonzero, MACs, file size, accuracy, latency");
  cmd->add_option("before", o->req.before, "the model before (e.g. dense)")->required();
  cmd->add_option("after", o->req.after, "the model after (e.g. pruned)")->required();
  o->data.add(cmd, "test", "measure top-1 accuracy on this dataset", /*default_batch_size=*/256);
  cmd->add_option("--batch", o->req.batch, "latency at this batch size (default 1; 1..1048576)");
  cmd->add_option("--iters", o->req.iters, "timed runs per model (default 200; 1..1000000)");
  add_threads_option(cmd, o->threads);
  cmd->add_option("--device", o->req.device, "cpu (default) | cuda | cuda:N");
  cmd->add_option("--precision", o->req.precision, "fp32 (default) | bf16 | fp16 (CUDA only)");
  cmd->add_flag("--json", o->json, "print JSON");
  cmd->add_option("-o,--out", o->req.out, "also write the JSON here");
  cmd->add_option("--report", o->req.report,
                  "write an HTML report here: the two models side by side, per layer");
  return [o]() {
    configure_threads(o->threads);
    CompareRequest& req = o->req;
    req.data = o->data;
    req.command = command_line();
    req.warn = warn;
    const CompareResult res = req.run();
    if (o->json) {
      std::cout << res.json << "\n";
      return 0;
    }
    const CompareMeasured* r[2] = {&res.before, &res.after};
    auto ratio = [](double a, double b) { return a > 0 ? fmt::format("{:.3f}x", b / a) : "-"; };
    std::cout << fmt::format("{:<22} {:>14} {:>14} {:>10}\n", "", "before", "after",
                             "after/before");
    auto line = [&](const std::string& what, double a, double b, const std::string& fa,
                    const std::string& fb) {
      std::cout << fmt::format("{:<22} {:>14} {:>14} {:>10}\n", what, fa, fb, ratio(a, b));
    };
    auto n = [](int64_t v) { return fmt::format("{}", v); };
    line("params", r[0]->params, r[1]->params, n(r[0]->params), n(r[1]->params));
    line("nonzero params", r[0]->nonzero, r[1]->nonzero, n(r[0]->nonzero), n(r[1]->nonzero));
    line("MACs (dense)", r[0]->macs, r[1]->macs, n(r[0]->macs), n(r[1]->macs));
    line("MACs (nonzero)", r[0]->effective_macs, r[1]->effective_macs, n(r[0]->effective_macs),
         n(r[1]->effective_macs));
    line("file bytes", r[0]->file_bytes, r[1]->file_bytes, n(r[0]->file_bytes),
         n(r[1]->file_bytes));
    if (r[0]->top1 >= 0)
      std::cout << fmt::format("{:<22} {:>13.2f}% {:>13.2f}% {:>+9.2f}pt\n",
                               req.data.split + " top-1", 100 * r[0]->top1, 100 * r[1]->top1,
                               100 * (r[1]->top1 - r[0]->top1));
    line(fmt::format("latency ms (batch {})", req.batch), r[0]->latency.median_ms,
         r[1]->latency.median_ms, fmt::format("{:.3f}", r[0]->latency.median_ms),
         fmt::format("{:.3f}", r[1]->latency.median_ms));
    return 0;
  };
}

}  // namespace lopper::cli
