// Embedding lopper in a C++ program: load an ONNX model, remove half of its channels, run the
// smaller model and compare what the two cost. examples/embed/ builds it against an installed
// lopper (find_package(lopper)); tests/embed_example.sh builds and runs it under `make test`.
//
//   embed [MODEL.onnx]        (default: examples/cnn_small.onnx)
//
// Prints parameters and MACs before -> after and each output's shape; exits 1 on any error.
#include <lopper/lopper.h>

#include <cstdio>
#include <exception>
#include <string>

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "examples/cnn_small.onnx";
  try {
    lopper::ir::Model model = lopper::onnx::load_model(path);
    // The declared input shapes, every dynamic dim (the batch) set to 1.
    const auto shapes = lopper::resolve_input_shapes(model, {});
    const lopper::ModelCost before = lopper::analyze(model, shapes);

    // Half the channels of every channel group go, the least important first (L1 by default);
    // the dependency graph shrinks the layers that read them too.
    lopper::StructuredOptions opts;
    opts.amount.value = 0.5;
    const lopper::StructuredReport pruned = lopper::prune_structured(model, opts);
    const lopper::ModelCost after = lopper::analyze(model, shapes);

    // The smaller model runs like any other; here on random inputs of the declared shapes.
    lopper::Executor exec(model);
    lopper::NamedTensors inputs;
    for (const lopper::ir::ValueInfo* in : exec.inputs())
      inputs.emplace_back(
          in->name,
          at::randn(shapes.at(in->name)).to(lopper::onnx::to_scalar_type(in->type.elem_type)));
    const std::vector<at::Tensor> outputs = exec.run(inputs);

    std::printf("channels: %lld -> %lld\n", (long long)pruned.channels_before,
                (long long)pruned.channels_after);
    std::printf("params:   %lld -> %lld\n", (long long)before.params, (long long)after.params);
    std::printf("MACs:     %lld -> %lld\n", (long long)before.macs, (long long)after.macs);
    const std::vector<std::string> names = exec.output_names();
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::string dims;
      for (int64_t d : outputs[i].sizes()) dims += (dims.empty() ? "" : "x") + std::to_string(d);
      std::printf("output '%s': [%s]\n", names[i].c_str(), dims.c_str());
    }
    if (outputs.empty() || after.macs >= before.macs || after.params >= before.params) {
      std::fprintf(stderr, "embed: the pruned model is not smaller, or gave no output\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {  // lopper::Error: one line naming the thing
    std::fprintf(stderr, "embed: %s\n", e.what());
    return 1;
  }
}
