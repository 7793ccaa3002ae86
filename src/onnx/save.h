// Writing a model as part of a command's outputs (internal: OutputFiles is the CLI's and the
// trainer's, not the public API's).
#pragma once

#include <string>

#include "lopper/onnx_io.h"

namespace lopper {

class OutputFiles;  // util/files.h

namespace onnx {

/// save_model() as part of a command's outputs: the model (and "<path>.data") are staged in
/// `files` and appear only when the caller commits them. An external data file that is one of
/// `files`' inputs (another model's data) is refused.
void save_model(const ir::Model& model, const std::string& path, const SaveOptions& opts,
                OutputFiles& files);

}  // namespace onnx
}  // namespace lopper
