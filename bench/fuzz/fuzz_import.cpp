// libFuzzer target: the ONNX importer on arbitrary bytes.
//
// For each input: parse_model (from memory, so external data must be refused), and when it parses,
// the graph's topological order, serialize_model, and a re-parse of what was written (which must
// succeed: lopper reads back what it writes). lopper::Error and c10::Error are the expected
// answers to bad input; anything else — a crash, an ASan report, another exception escaping, an
// abort, a timeout, a huge allocation — is a finding.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "lopper/error.h"
#include "lopper/graph.h"
#include "lopper/onnx_io.h"

namespace {

void visit_graph(const lopper::ir::Graph& g, const std::vector<std::string>& outer, int depth) {
  std::vector<size_t> order;
  try {
    order = g.topological_order(outer);
  } catch (const lopper::Error&) {
    return;  // a cycle, a value produced twice, or an input nothing provides
  }
  // Names visible to subgraphs: the outer scope plus everything this graph defines.
  std::vector<std::string> scope = outer;
  for (const auto& v : g.inputs) scope.push_back(v.name);
  for (const auto& t : g.initializers) scope.push_back(t.name);
  for (size_t i : order) {
    const auto& n = g.nodes[i];
    (void)lopper::ir::node_reads(n);
    for (const auto& o : n.outputs) scope.push_back(o);
    for (const auto& a : n.attrs) {
      if (a.g) visit_graph(*a.g, scope, depth + 1);
      for (const auto& sg : a.graphs) visit_graph(*sg, scope, depth + 1);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);  // deterministic and cheap; libtorch is not instrumented anyway
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lopper::ir::Model model;
  try {
    model = lopper::onnx::parse_model(data, size, "");
  } catch (const lopper::Error&) {
    return 0;
  } catch (const c10::Error&) {
    return 0;
  }
  visit_graph(model.graph, {}, 0);
  (void)model.graph.real_inputs();
  std::string bytes;
  try {
    bytes = lopper::onnx::serialize_model(model);
  } catch (const lopper::Error&) {
    return 0;  // e.g. over 2 GB
  }
  // What lopper writes it must read back.
  try {
    lopper::ir::Model again = lopper::onnx::parse_model(bytes.data(), bytes.size(), "");
    (void)again;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "re-parse of serialize_model()'s output failed: %s\n", e.what());
    std::abort();
  }
  return 0;
}
