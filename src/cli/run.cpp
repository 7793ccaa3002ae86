// lopper run MODEL --input NAME=FILE ... --out DIR
#include <ATen/ATen.h>

#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"

namespace lopper::cli {

Action add_run(CLI::App& app) {
  struct Opts {
    std::string model, out, device = "cpu", precision = "fp32";
    std::vector<std::string> inputs;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("run", "run a model on inputs and write every output as .npy");
  cmd->add_option("model", o->model, "the ONNX model")->required();
  cmd->add_option("--input,-i", o->inputs, "NAME=FILE (.npy or ONNX TensorProto .pb)");
  cmd->add_option("--out,-o", o->out, "folder for <output name>.npy")->required();
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N");
  cmd->add_option("--precision", o->precision, "fp32 (default) | bf16 | fp16 (CUDA only)");
  cmd->add_option("--threads", o->threads, "intra-op threads (0: one per core)");
  return [o]() {
    configure_threads(o->threads);
    ir::Model model = onnx::load_model(o->model);
    Executor exec(model, exec_options(o->device, o->precision));
    NamedTensors feeds;
    for (const auto& spec : o->inputs) feeds.push_back(parse_input_spec(spec));
    auto outs = exec.run(feeds);
    auto names = exec.output_names();
    std::filesystem::create_directories(o->out);
    for (size_t i = 0; i < outs.size(); ++i) {
      std::string file = (std::filesystem::path(o->out) / (safe_file_name(names[i]) + ".npy")).string();
      save_npy(outs[i], file);
      std::cout << names[i] << " " << shape_string(outs[i].sizes()) << " -> " << file << "\n";
    }
    return 0;
  };
}

}  // namespace lopper::cli
