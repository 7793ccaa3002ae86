// lopper run MODEL --input NAME=FILE ... --out DIR
#include <iostream>

#include "commands.h"
#include "common.h"
#include "lopper/command.h"

namespace lopper::cli {

Action add_run(CLI::App& app) {
  struct Opts {
    RunRequest req;
    std::vector<std::string> inputs;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = model_command(app, "run", "run a model on inputs and write every output as .npy",
                            o->req.model);
  cmd->add_option("--input,-i", o->inputs, "NAME=FILE (.npy or ONNX TensorProto .pb)");
  cmd->add_option("--out,-o", o->req.out, "folder for <output name>.npy")->required();
  cmd->add_option("--device", o->req.device, "cpu, cuda or cuda:N");
  cmd->add_option("--precision", o->req.precision, "fp32 (default) | bf16 | fp16 (CUDA only)");
  add_threads_option(cmd, o->threads);
  return [o]() {
    configure_threads(o->threads);
    RunRequest& req = o->req;
    for (const auto& spec : o->inputs) req.inputs.push_back(parse_input_spec(spec));
    req.warn = warn;
    for (const auto& r : req.run())
      std::cout << r.name << " " << shape_string(r.shape) << " -> " << r.path << "\n";
    return 0;
  };
}

}  // namespace lopper::cli
