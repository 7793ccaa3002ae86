// lopper convert MODEL -o OUT [--sparse-initializers | --dense] [--external-data]
#include <ATen/ATen.h>

#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "lopper/error.h"
#include "lopper/onnx_io.h"

namespace lopper::cli {

Action add_convert(CLI::App& app) {
  struct Opts {
    std::string model, out;
    bool sparse = false, dense = false, external = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("convert", "read a model and write it again (storage options)");
  cmd->add_option("model", o->model, "the ONNX model")->required();
  cmd->add_option("-o,--out", o->out, "where to write the model")->required();
  auto* sp = cmd->add_flag("--sparse-initializers", o->sparse,
                           "store weights as sparse_initializer where that makes them smaller");
  cmd->add_flag("--dense", o->dense, "store every initializer dense")->excludes(sp);
  cmd->add_flag("--external-data", o->external, "weights in OUT.data beside the model");
  return [o]() {
    namespace fs = std::filesystem;
    refuse_to_overwrite("convert", o->model, o->out);
    ir::Model model = onnx::load_model(o->model);
    onnx::SaveOptions so;
    so.sparse = o->sparse ? onnx::SaveOptions::Sparse::kAll
                          : (o->dense ? onnx::SaveOptions::Sparse::kNone : onnx::SaveOptions::Sparse::kKeep);
    so.external_data = o->external;
    onnx::save_model(model, o->out, so);
    std::cout << o->model << " (" << fs::file_size(o->model) << " bytes) -> " << o->out << " ("
              << fs::file_size(o->out) << " bytes)\n";
    return 0;
  };
}

}  // namespace lopper::cli
