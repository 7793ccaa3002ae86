// The op table: every ONNX op lopper understands is described once, in src/ops/<family>.cpp, and
// registered by name with its forward (ATen calls; works under autograd and on any device) and its
// MAC count. Internal header.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/graph.h"

namespace lopper::ops {

/// Typed access to a node's attributes; errors name the node.
class AttrReader {
 public:
  explicit AttrReader(const ir::Node& node) : node_(&node) {}
  const ir::Node& node() const { return *node_; }

  bool has_attr(const char* name) const { return node_->attr(name) != nullptr; }
  int64_t attr_int(const char* name) const;  // required
  int64_t attr_int(const char* name, int64_t def) const;
  float attr_float(const char* name, float def) const;
  std::string attr_string(const char* name, const std::string& def) const;
  std::vector<int64_t> attr_ints(const char* name, std::vector<int64_t> def = {}) const;
  std::vector<float> attr_floats(const char* name, std::vector<float> def = {}) const;
  std::vector<std::string> attr_strings(const char* name) const;
  at::Tensor attr_tensor(const char* name) const;       // required
  const ir::Graph& attr_graph(const char* name) const;  // required

  /// Throws lopper::Error "[op] node 'N' (Op): <msg>".
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw Error(
        detail::concat("[op] node '", node_->label(), "' (", node_->op_type, "): ", args...));
  }
  // NOTE: the arguments are evaluated whether or not cond holds: where building them costs (a
  // string of a shape), write `if (!cond) fail(...)`; a Reshape spent half its time on them.
  template <typename... Args>
  void check(bool cond, const Args&... args) const {
    if (!cond) fail(args...);
  }

 protected:
  const ir::Attribute* find(const char* name, ir::AttrType type) const;
  const ir::Node* node_;
};

class OpContext;
/// Runs a subgraph (If/Loop/Scan bodies) with the given inputs; provided by the executor.
using SubgraphRunner = std::function<std::vector<at::Tensor>(
    const ir::Graph& graph, const std::vector<at::Tensor>& inputs)>;

/// What an op's forward sees: inputs, attributes, outputs, and a per-node state slot for weights
/// prepacked at the first run (only used in inference, where initializers never change).
class OpContext : public AttrReader {
 public:
  OpContext(const ir::Node& node, int64_t opset, bool training, const at::Device& device)
      : AttrReader(node), opset_(opset), training_(training), device_(device) {}

  int64_t opset() const { return opset_; }
  /// True when running for training (BatchNorm uses batch statistics, Dropout drops).
  bool training() const { return training_; }
  /// True when autograd is on: prepacked state must not be used, it would cut the gradient.
  bool grad_mode() const { return grad_mode_; }
  /// Whether constant weights may be prepared at the first run (transposed or packed copies,
  /// kernels chosen by timing): not under autograd, nor when the executor is told not to
  /// (ExecOptions::prepack, for one-off passes over big models).
  bool prepack() const { return !grad_mode_ && prepack_; }
  const at::Device& device() const { return device_; }
  /// True when the model's weights do not fit in the CPU's last-level cache: each layer's weights
  /// then come from memory at every run, and kernels are timed that way (kernel_choice.h).
  bool weights_exceed_cache() const { return weights_exceed_cache_; }
  /// True when the executor runs a float32 model in a lower precision (ExecOptions::precision):
  /// a 16-bit op may then compute in float32 and round once, as PyTorch's 16-bit ops do, where a
  /// model typed in 16 bits follows ONNX's reference, which rounds after every step.
  bool lowered() const { return lowered_; }

  size_t num_inputs() const { return inputs_.size(); }
  bool has_input(size_t i) const { return i < inputs_.size() && inputs_[i].defined(); }
  const at::Tensor& input(size_t i) const {
    if (!has_input(i)) fail("missing required input ", i);
    return inputs_[i];
  }
  /// Input i is an initializer: the same tensor on every run of this executor.
  bool is_constant(size_t i) const { return i < constant_.size() && constant_[i]; }

  size_t num_outputs() const { return outputs_.size(); }
  bool wants_output(size_t i) const { return i < wanted_.size() && wanted_[i]; }
  void set_output(size_t i, at::Tensor t) {
    if (i >= outputs_.size())
      fail("produces output ", i, " but the node names only ", outputs_.size());
    outputs_[i] = std::move(t);
  }

  /// Per-node cache; T is created on first use. Invalidate by the caller when weights change.
  template <typename T>
  T& state() {
    if (!(*state_)) *state_ = std::make_shared<T>();
    return *static_cast<T*>(state_->get());
  }
  bool has_state() const { return state_ && *state_; }

  std::vector<at::Tensor> run_subgraph(const ir::Graph& g,
                                       const std::vector<at::Tensor>& in) const {
    if (!subgraph_runner_) fail("subgraphs are not available here");
    return subgraph_runner_(g, in);
  }
  /// Drops what the nodes of subgraph g keep between runs (packed weights, kernel choices): for
  /// an op that no longer runs g (it is made again if g runs after all).
  void release_subgraph_state(const ir::Graph& g) const {
    if (subgraph_releaser_) subgraph_releaser_(g);
  }

  // Set by the executor.
  std::vector<at::Tensor> inputs_;
  std::vector<bool> constant_;
  std::vector<at::Tensor> outputs_;
  std::vector<bool> wanted_;
  std::shared_ptr<void>* state_ = nullptr;
  std::vector<KernelDecision>* decisions_ = nullptr;  // where kernel choices are reported
  SubgraphRunner subgraph_runner_;
  std::function<void(const ir::Graph&)> subgraph_releaser_;
  bool grad_mode_ = false;
  bool prepack_ = true;
  bool weights_exceed_cache_ = false;
  bool lowered_ = false;

 private:
  int64_t opset_;
  bool training_;
  at::Device device_;
};

/// Shapes seen at one node, for MAC counting.
struct MacContext : AttrReader {
  MacContext(const ir::Node& n, std::vector<std::vector<int64_t>> in,
             std::vector<std::vector<int64_t>> out)
      : AttrReader(n), in_shapes(std::move(in)), out_shapes(std::move(out)) {}
  std::vector<std::vector<int64_t>> in_shapes;  // empty vector for a missing input
  std::vector<std::vector<int64_t>> out_shapes;
};

using Forward = std::function<void(OpContext&)>;
using MacCount = std::function<int64_t(const MacContext&)>;
class ChannelContext;  // ops/channels.h
/// How the op carries prunable channels (ops/channels.h); empty: a barrier to structured pruning.
using ChannelRule = std::function<void(ChannelContext&)>;
class ShapeArithContext;  // ops/channels.h
struct ShapeEntry;        // ops/channels.h
/// How the op computes the integer vectors that shape arithmetic passes along (ops/channels.h):
/// its output's entries; nothing when it does not follow them.
using ShapeRule = std::function<std::optional<std::vector<ShapeEntry>>(const ShapeArithContext&)>;

struct OpDef {
  std::string domain;  // "" for ai.onnx
  std::string op_type;
  Forward forward;
  MacCount macs = {};         // empty: the op costs no multiply-accumulates worth counting
  bool deterministic = true;  // false for random ops (never constant-folded)
  ChannelRule channels = {};  // set with OpTable::set_channels beside the op's registration
  ShapeRule shape = {};       // set with OpTable::set_shape_rule
  /// The inputs ONNX defines as shapes, sizes, bounds or axes (a Reshape's target, a Slice's
  /// bounds): a computation on constants only there is a constant to the channel rules.
  std::vector<size_t> shape_operands = {};
};

/// An op of the default domain (ai.onnx) with its rules, registered by OpTable::add_onnx: OpDef's
/// fields of the same names.
struct OnnxOp {
  const char* op_type;
  Forward forward;
  ChannelRule channels = {};
  ShapeRule shape = {};
  std::vector<size_t> shape_operands = {};
};

class OpTable {
 public:
  static const OpTable& global();
  void add(OpDef def);
  /// Registers each op of the default domain, its rules beside it.
  void add_onnx(std::initializer_list<OnnxOp> ops);
  /// Gives the registered op(s) `op_types` (default domain) a channel rule.
  void set_channels(std::initializer_list<const char*> op_types, ChannelRule rule);
  /// Gives the registered op(s) `op_types` (default domain) a shape-arithmetic rule.
  void set_shape_rule(std::initializer_list<const char*> op_types, ShapeRule rule);
  /// Names the inputs of `op_types` (default domain) that are shape operands.
  void set_shape_operands(std::initializer_list<const char*> op_types, std::vector<size_t> inputs);
  const OpDef* find(const std::string& domain, const std::string& op_type) const;
  std::vector<const OpDef*> all() const;

 private:
  std::unordered_map<std::string, OpDef> ops_;
};

// One registration function per family (src/ops/<family>.cpp).
void register_elementwise(OpTable& t);
void register_activation(OpTable& t);
void register_reduce(OpTable& t);
void register_shape(OpTable& t);
void register_tensor(OpTable& t);
void register_conv(OpTable& t);
void register_gemm(OpTable& t);
void register_norm(OpTable& t);
void register_pool(OpTable& t);
void register_resize(OpTable& t);
void register_attention(OpTable& t);
void register_random(OpTable& t);
void register_detection(OpTable& t);
void register_control(OpTable& t);
void register_rnn(OpTable& t);
void register_loss(OpTable& t);
void register_quant(OpTable& t);
void register_signal(OpTable& t);

// --- helpers shared by op files -------------------------------------------------------------
/// A 1-D (or scalar) integer tensor as a vector (copies to the CPU when needed).
std::vector<int64_t> to_int_vector(const at::Tensor& t);
/// Input i, which must hold one value, as an integer (errors name it `what`).
int64_t scalar_int(const OpContext& c, size_t i, const char* what);
/// A numeric scalar tensor's value as double.
double to_double(const at::Tensor& t);
/// Normalises a possibly negative axis for a tensor of `rank` dims; fails on out of range.
int64_t normalize_axis(const AttrReader& ctx, int64_t axis, int64_t rank);
/// ONNX TensorProto data type code -> ATen scalar type (fails naming the node).
at::ScalarType scalar_type_of(const AttrReader& ctx, int64_t onnx_type);
/// Reshape's target for `x`: ONNX's 0 (copy the input's dim, unless `allowzero`) and -1 (inferred)
/// resolved; fails naming the node when `x` cannot take that shape.
std::vector<int64_t> reshape_target(const AttrReader& ctx, const at::Tensor& x,
                                    std::vector<int64_t> shape, bool allowzero);
/// The same for an input of these sizes.
std::vector<int64_t> reshape_target(const AttrReader& ctx, const std::vector<int64_t>& sizes,
                                    std::vector<int64_t> shape, bool allowzero);
/// Product of dims.
int64_t numel_of(const std::vector<int64_t>& shape);
/// Fails with "[exec] node 'N' (Op): output [AxB] needs 4.0 TB, more than this machine's memory
/// (24 GB)" when a tensor of `shape` and `type` would not fit. Ops whose output shape comes from
/// values (ConstantOfShape, Expand, Tile, Range, Resize, Pad ...) call it before allocating.
void check_output_fits(const AttrReader& ctx, const std::vector<int64_t>& shape,
                       at::ScalarType type);
/// softmax(scale * x) along x's last axis: Softmax's, ScaledSoftmax's and ScaledAttention's
/// (lopper's row kernel in float32 CPU inference; ATen's, half precision summed in float32,
/// elsewhere).
at::Tensor scaled_softmax(const OpContext& c, const at::Tensor& x, float scale);

}  // namespace lopper::ops
