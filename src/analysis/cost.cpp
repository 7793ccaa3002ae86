#include <ATen/ATen.h>

#include <unordered_map>
#include <unordered_set>

#include "analysis/weights.h"
#include "lopper/analysis.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/memory.h"
#include "lopper/onnx_io.h"
#include "ops/op.h"
#include "util/pattern.h"

namespace lopper {

std::map<std::string, std::vector<int64_t>> resolve_input_shapes(
    const ir::Model& model, const std::map<std::string, std::vector<int64_t>>& overrides,
    int64_t dynamic_dim) {
  auto inputs = model.graph.real_inputs();
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& [name, dims] : overrides) {
    std::string key = name;
    if (key.empty()) {
      LOPPER_CHECK(inputs.size() == 1, "[shape] the model has ", inputs.size(),
                   " inputs: name the one the shape is for (NAME=1x3x224x224)");
      key = inputs[0]->name;
    }
    bool known = false;
    for (const auto* v : inputs) known |= v->name == key;
    LOPPER_CHECK(known, "[shape] the model has no input named '", key, "'");
    out[key] = dims;
  }
  for (const auto* v : inputs) {
    if (out.count(v->name)) continue;
    LOPPER_CHECK(v->type.is_tensor() && v->type.has_shape, "[shape] input '", v->name,
                 "' has no declared shape: give one with " LOPPER_OPTION("input_shapes") " ",
                 v->name, "=...");
    std::vector<int64_t> dims;
    for (const auto& d : v->type.dims) dims.push_back(d.is_static() ? d.value : dynamic_dim);
    out[v->name] = dims;
  }
  // Shape analysis feeds tensors of these shapes: refuse, before allocating, what cannot fit.
  for (const auto* v : inputs) {
    at::ScalarType type = at::kFloat;
    if (v->type.elem_type != ir::DType::kUndefined) {
      try {
        type = onnx::to_scalar_type(v->type.elem_type);
      } catch (const Error&) {
        type = at::kByte;  // a type ATen lacks: count one byte per element
      }
    }
    double bytes = tensor_bytes(out[v->name], c10::elementSize(type));
    if (!exceeds_memory(bytes)) continue;
    bool given = overrides.count(v->name) || (overrides.count("") && inputs.size() == 1);
    std::string what = detail::concat(
        "[shape] ", given ? LOPPER_OPTION("input_shapes") " for input '" : "input '", v->name, "' ",
        dims_string(out[v->name]), " (", ir::dtype_name(onnx::to_dtype(type)), ")");
    if (given) throw UsageError(memory_message(what, bytes));
    throw Error(memory_message(what, bytes));
  }
  return out;
}

namespace {

// layer_weight's walk, with lookups given: `init(name)` the initializer, `made(name)` the node
// that makes the value (nullptr for none).
template <class Init, class Made>
const ir::Initializer* weight_of(const ir::Node& n, Init init, Made made) {
  if (!n.domain.empty()) return nullptr;
  if (n.op_type != "Conv" && n.op_type != "ConvTranspose" && n.op_type != "Gemm" &&
      n.op_type != "MatMul")
    return nullptr;
  if (n.inputs.size() < 2) return nullptr;
  // NOTE: a weight used through a Transpose (how exporters write some Linear layers), and through
  // Identity nodes: TorchScript's exporter stores equal weights once and reads the copies through
  // Identity (nn.TransformerEncoder's layers right after init, ALBERT's shared layers), so every
  // reader is a layer of the one weight.
  std::string w = n.inputs[1];
  bool transposed = false;
  for (int depth = 0; depth < 8; ++depth) {
    if (const ir::Initializer* t = init(w)) return t;
    const ir::Node* p = made(w);
    if (!p || p->outputs.size() != 1 || p->inputs.size() != 1 || !p->domain.empty() ||
        !(p->op_type == "Identity" || (p->op_type == "Transpose" && !transposed)))
      return nullptr;
    transposed = transposed || p->op_type == "Transpose";
    w = p->inputs[0];
  }
  return nullptr;
}

}  // namespace

const ir::Initializer* layer_weight(const ir::Graph& g, const ir::Node& n) {
  return weight_of(
      n, [&](const std::string& name) { return g.find_initializer(name); },
      [&](const std::string& name) -> const ir::Node* {
        for (const auto& p : g.nodes)
          for (const auto& o : p.outputs)
            if (o == name) return &p;
        return nullptr;
      });
}

const ir::Initializer* layer_weight(const ir::GraphIndex& index, const ir::Node& n) {
  return weight_of(
      n, [&](const std::string& name) { return index.find_initializer(name); },
      [&](const std::string& name) { return index.producer_node(name); });
}

namespace {

// Names exporters give tensors they made (folded constants, transposed copies), never a
// parameter's: TorchScript's "onnx::Conv_193" and bare numbers, torch.export's "val_59", node
// outputs ("/m/Constant_output_0"; a parameter's name has no '/').
bool exporter_made(const std::string& s) {
  static const Pattern made(R"(onnx::.*|_?val_[0-9]+|[0-9]+|.*/.*)", "names");
  return s.empty() || made.full_match(s);
}

std::string metadata(const ir::Node& n, const std::string& key) {
  for (const auto& [k, v] : n.metadata_props)
    if (k == key) return v;
  return "";
}

// The modules a node was exported from, outermost first (torch.export's name_scopes: a Python
// list's repr, "['', 'm', 'm.encoder', ..., 'linear']", whose last entry is the call itself).
std::vector<std::string> module_scopes(const ir::Node& n) {
  const std::string s = metadata(n, "pkg.torch.onnx.name_scopes");
  std::vector<std::string> out;
  for (size_t at = s.find('\''); at != std::string::npos;) {
    const size_t end = s.find('\'', at + 1);
    if (end == std::string::npos) break;
    out.push_back(s.substr(at + 1, end - at - 1));
    at = s.find('\'', end + 1);
  }
  if (!out.empty()) out.pop_back();
  out.erase(std::remove(out.begin(), out.end(), std::string()), out.end());
  return out;
}

}  // namespace

std::string torch_module(const ir::Node& n) {
  const std::vector<std::string> scopes = module_scopes(n);
  return scopes.empty() ? "" : scopes.back();
}

std::string param_name(const ir::Node& layer, const std::string& weight) {
  if (!exporter_made(weight)) return weight;
  // NOTE: torch.export records the aten call a node came from; its arguments name the parameter's
  // placeholder: "p_" + the parameter's path with every '.' made '_'. The module scopes tell where
  // the path's dots were (innermost first: an attribute such as in_proj_weight keeps its '_').
  // Only calls whose weight is the layer's own: a node fused from another call (a BatchNorm
  // folded into a Conv) names that call's parameters.
  const std::string fx = metadata(layer, "pkg.torch.onnx.fx_node");
  static const Pattern call(
      R"(target=torch\.ops\.aten\.(linear|addmm|mm|matmul|conv[123]d|convolution|conv_transpose[123]d)\.)",
      "fx_node");
  if (fx.empty() || !call.search(fx)) return "";
  static const Pattern placeholder(R"(%(p_[A-Za-z0-9_]*weight)\b)", "fx_node");
  const std::vector<std::string> weights = placeholder.find_all(fx);
  const std::vector<std::string> scopes = module_scopes(layer);
  for (auto s = scopes.rbegin(); s != scopes.rend(); ++s) {
    std::string prefix = "p_" + *s + "_";
    std::replace(prefix.begin(), prefix.end(), '.', '_');
    for (const auto& w : weights)
      if (w.size() > prefix.size() && w.compare(0, prefix.size(), prefix) == 0)
        return *s + "." + w.substr(prefix.size());
  }
  return "";
}

void record_node_shapes(Executor& exec, NodeShapes& seen) {
  exec.on_node = [&seen](const ir::Node& n, const std::vector<at::Tensor>& in,
                         const std::vector<at::Tensor>& out) {
    auto& rec = seen[&n];
    for (const auto& t : in)
      rec.in.push_back(t.defined() ? t.sizes().vec() : std::vector<int64_t>{});
    for (const auto& t : out) {
      rec.out.push_back(t.defined() ? t.sizes().vec() : std::vector<int64_t>{});
      bool small =
          t.defined() && !t.is_floating_point() && t.scalar_type() != at::kBool && t.numel() <= 64;
      rec.small_ints.push_back(small ? t.detach().to(at::kCPU, at::kLong).clone() : at::Tensor());
    }
  };
}

ExecOptions shape_options() {
  ExecOptions opts;
  opts.fold_constants = false;
  opts.fuse = false;     // shapes (and MACs) per node of the model as it is
  opts.prepack = false;  // one run: no weight copies, no kernel timing
  return opts;
}

NodeShapes node_shapes(const ir::Model& model,
                       const std::map<std::string, std::vector<int64_t>>& input_shapes) {
  NodeShapes seen;
  Executor exec(model, shape_options());
  record_node_shapes(exec, seen);
  NamedTensors feeds;
  for (const auto* v : exec.inputs()) {
    auto it = input_shapes.find(v->name);
    LOPPER_ASSERT(it != input_shapes.end(), "no shape for ", v->name);
    auto type = v->type.elem_type == ir::DType::kUndefined
                    ? at::kFloat
                    : onnx::to_scalar_type(v->type.elem_type);
    double bytes = tensor_bytes(it->second, c10::elementSize(type));
    LOPPER_CHECK(
        !exceeds_memory(bytes),
        memory_message(detail::concat("[shape] input '", v->name, "' ", dims_string(it->second)),
                       bytes));
    feeds.emplace_back(v->name, at::zeros(it->second, at::TensorOptions().dtype(type)));
  }
  exec.run(feeds);
  return seen;
}

NodeShapes node_shapes(const ir::Model& model, const NamedTensors& feeds,
                       std::vector<at::Tensor>* outputs) {
  NodeShapes seen;
  ExecOptions eo = shape_options();
  if (!feeds.empty()) eo.device = feeds.front().second.device().str();  // where the inputs are
  Executor exec(model, eo);
  record_node_shapes(exec, seen);
  std::vector<at::Tensor> out = exec.run(feeds);
  if (outputs) *outputs = std::move(out);
  return seen;
}

ModelCost analyze(const ir::Model& model,
                  const std::map<std::string, std::vector<int64_t>>& input_shapes) {
  return analyze(model, input_shapes, node_shapes(model, input_shapes));
}

ModelCost analyze(const ir::Model& model,
                  const std::map<std::string, std::vector<int64_t>>& input_shapes,
                  const NodeShapes& seen) {
  const ir::Graph& g = model.graph;
  ModelCost cost;
  cost.input_shapes = input_shapes;

  // Parameters: float initializers, except BatchNorm running statistics (buffers, not weights).
  std::unordered_set<std::string> buffers;
  for (const auto& n : g.nodes)
    if (n.op_type == "BatchNormalization" && n.domain.empty())
      for (size_t k = 3; k < n.inputs.size() && k < 5; ++k) buffers.insert(n.inputs[k]);
  for (const auto& t : g.initializers) {
    if (!t.value.is_floating_point() || buffers.count(t.name)) continue;
    cost.params += t.value.numel();
    cost.nonzero += t.value.count_nonzero().item<int64_t>();
  }

  const auto& table = ops::OpTable::global();
  const ir::GraphIndex index(g);
  for (const auto& n : g.nodes) {
    auto it = seen.find(&n);
    int64_t macs = 0;
    const ops::OpDef* op = table.find(n.domain, n.op_type);
    if (it != seen.end() && op && op->macs) {
      ops::MacContext mc(n, it->second.in, it->second.out);
      macs = op->macs(mc);
    }
    cost.macs += macs;
    if (const ir::Initializer* w = layer_weight(index, n)) {
      LayerCost l;
      l.name = n.label();
      l.op = n.op_type;
      l.weight = w->name;
      l.param = param_name(n, w->name);
      l.weight_shape = w->value.sizes().vec();
      l.params = w->value.numel();
      l.nonzero = w->value.count_nonzero().item<int64_t>();
      l.macs = macs;
      cost.layers.push_back(std::move(l));
    }
  }
  return cost;
}

std::vector<std::string> load_warnings(const ir::Model& m) {
  // NOTE: an export with BatchNorm in training mode (torch.onnx.export(..., training=TRAINING)
  // or a module left in train()) normalises with each batch's statistics, as ONNX specifies:
  // eval and compare then measure another model than the one deployed, with no error anywhere.
  int64_t opset = 0;
  for (const auto& o : m.opset_import)
    if (o.domain.empty() || o.domain == "ai.onnx") opset = o.version;
  std::vector<std::string> nodes;
  for (const auto& n : m.graph.nodes) {
    if (n.op_type != "BatchNormalization" || !n.domain.empty()) continue;
    const ir::Attribute* a = n.attr("training_mode");
    const bool stats_out = n.outputs.size() > 1 && !n.outputs[1].empty();
    if ((opset >= 14 && a && a->i != 0) || (opset < 14 && stats_out)) nodes.push_back(n.label());
  }
  if (nodes.empty()) return {};
  return {std::to_string(nodes.size()) + " BatchNormalization node" +
          (nodes.size() == 1 ? "" : "s") + " in training mode ('" + nodes.front() + "'" +
          (nodes.size() > 1 ? " and more" : "") +
          "): normalised with each batch's own statistics, as ONNX specifies, not the running "
          "ones; export the module after model.eval() for inference"};
}

}  // namespace lopper
