// lopper convert MODEL -o OUT [--sparse-initializers | --dense] [--external-data]
#include <ATen/ATen.h>

#include <filesystem>
#include <iostream>

#include "commands.h"
#include "common.h"
#include "lopper/error.h"
#include "lopper/files.h"
#include "lopper/onnx_io.h"

namespace lopper::cli {

Action add_convert(CLI::App& app) {
  struct Opts {
    std::string model, out;
    bool sparse = false, dense = false, external = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd =
      model_command(app, "convert", "read a model and write it again (storage options)", o->model);
  cmd->add_option("-o,--out", o->out, "where to write the model")->required();
  auto* sp = cmd->add_flag("--sparse-initializers", o->sparse,
                           "store weights as sparse_initializer where that makes them smaller");
  cmd->add_flag("--dense", o->dense, "store every initializer dense")->excludes(sp);
  cmd->add_flag("--external-data", o->external, "weights in OUT.data beside the model");
  return [o]() {
    namespace fs = std::filesystem;
    // What it reads (the model and its external data), then what it writes: an output that is
    // an input — another name for the model, or the data file the model reads — is refused.
    OutputFiles files("convert");
    files.input(o->model);
    files.declare(o->out, "-o");
    if (o->external) files.declare(o->out + ".data", "--external-data (" + o->out + ".data)");
    ir::Model model = load_input_model(files, o->model);
    onnx::SaveOptions so;
    so.sparse = o->sparse ? onnx::SaveOptions::Sparse::kAll
                          : (o->dense ? onnx::SaveOptions::Sparse::kNone
                                      : onnx::SaveOptions::Sparse::kKeep);
    so.external_data = o->external;
    onnx::save_model(model, o->out, so, files);
    const int64_t written = staged_model_bytes(files, o->out);
    files.commit();
    std::cout << o->model << " (" << model_file_bytes(o->model, model) << " bytes) -> " << o->out
              << " (" << written << " bytes)\n";
    return 0;
  };
}

}  // namespace lopper::cli
