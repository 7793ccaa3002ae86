// lopper convert MODEL -o OUT [--sparse-initializers | --dense] [--external-data]
#include <iostream>

#include "commands.h"
#include "common.h"
#include "lopper/command.h"

namespace lopper::cli {

Action add_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertRequest>();
  auto* cmd =
      model_command(app, "convert", "read a model and write it again (storage options)", o->model);
  cmd->add_option("-o,--out", o->out, "where to write the model")->required();
  cmd->add_flag("--sparse-initializers", o->sparse_initializers,
                "store weights as sparse_initializer where that makes them smaller");
  cmd->add_flag("--dense", o->dense, "store every initializer dense");
  cmd->add_flag("--external-data", o->external_data, "weights in OUT.data beside the model");
  return [o]() {
    ConvertRequest& req = *o;
    req.warn = warn;
    const ConvertResult r = req.run();
    std::cout << req.model << " (" << r.model_bytes << " bytes) -> " << req.out << " ("
              << r.written_bytes << " bytes)\n";
    return 0;
  };
}

}  // namespace lopper::cli
