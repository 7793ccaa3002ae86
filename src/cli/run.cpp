// lopper run MODEL --input NAME=FILE ... --out DIR
#include <ATen/ATen.h>

#include <filesystem>
#include <iostream>

#include "commands.h"
#include "common.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/files.h"
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
  auto* cmd =
      model_command(app, "run", "run a model on inputs and write every output as .npy", o->model);
  cmd->add_option("--input,-i", o->inputs, "NAME=FILE (.npy or ONNX TensorProto .pb)");
  cmd->add_option("--out,-o", o->out, "folder for <output name>.npy")->required();
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N");
  cmd->add_option("--precision", o->precision, "fp32 (default) | bf16 | fp16 (CUDA only)");
  add_threads_option(cmd, o->threads);
  return [o]() {
    configure_threads(o->threads);
    OutputFiles files("run");
    ir::Model model = load_input_model(files, o->model);
    NamedTensors feeds;
    for (const auto& spec : o->inputs) {
      files.input(spec.substr(spec.rfind('=') + 1));
      feeds.push_back(parse_input_spec(spec));
    }
    // The folder is checked (and made, if new) before the run; each output is declared then, so a
    // name that is an input or not a regular file is refused before any is written.
    files.folder(o->out, "--out");
    Executor exec(model, exec_options(o->device, o->precision));
    const auto names = exec.output_names();
    std::vector<std::string> paths;
    for (const auto& n : names) {
      paths.push_back((std::filesystem::path(o->out) / (safe_file_name(n) + ".npy")).string());
      files.declare(paths.back(), "output '" + n + "'");
    }
    auto outs = exec.run(feeds);
    for (size_t i = 0; i < outs.size(); ++i) files.write(paths[i], npy_bytes(outs[i]));
    files.commit();
    for (size_t i = 0; i < outs.size(); ++i)
      std::cout << names[i] << " " << shape_string(outs[i].sizes()) << " -> " << paths[i] << "\n";
    return 0;
  };
}

}  // namespace lopper::cli
