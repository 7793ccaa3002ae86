// Runs an ir::Model with ATen on the CPU or a CUDA device, for inference or under autograd.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lopper/graph.h"

namespace lopper {

struct ExecOptions {
  /// "cpu", "cuda" or "cuda:N".
  std::string device = "cpu";
  /// Training semantics: BatchNormalization uses batch statistics, Dropout drops. Implies autograd.
  bool training = false;
  /// Autograd records the graph: float initializers are leaves that require grad (see
  /// parameters()), nothing is prepacked, fused or folded. Off: inference mode.
  bool autograd = false;
  /// Fold nodes whose inputs are all constant at load (inference only).
  bool fold_constants = true;
  /// Rewrite a private copy of the graph for speed (inference only): BatchNorm folded into Conv,
  /// activations and residual adds fused into the convolution.
  bool fuse = true;
  /// Prepare constant weights at the first inference run (transposed and packed copies, the
  /// fastest kernel of each layer chosen by timing). Off: every layer computes on its weights as
  /// they are, with ATen, no copy: for one pass over a model too big to hold twice (calibration).
  bool prepack = true;
  /// Inference precision: kFloat, kBFloat16 or kHalf (CUDA only). Below fp32, float32
  /// initializers and inputs are cast once, the graph computes in that type, and float outputs
  /// come back as float32. Ignored with autograd.
  at::ScalarType precision = at::kFloat;
};

/// "fp32" | "bf16" | "fp16" -> the ScalarType; throws lopper::Error on anything else.
at::ScalarType parse_precision(const std::string& s);

/// The intra-op thread count lopper uses unless told otherwise: OMP_NUM_THREADS when set, else the
/// CPUs this process may use (affinity mask, cgroup quota) that are idle now (sampled from
/// /proc/stat over 20 ms; a CPU another process keeps busy is left out), at least 1. See the
/// measurements in src/exec/executor.cpp.
int default_threads();
/// The most intra-op threads lopper accepts: 4x the hardware threads, at least 4 (libgomp aborts
/// the process when it cannot start the threads asked for; more than 4 per hardware thread only
/// ever slows a run down).
int max_threads();

/// Configures ATen's thread pools: `threads` intra-op threads (0 = default_threads()) and one
/// inter-op thread, so the OpenMP and MKL pools never oversubscribe the cores.
void configure_threads(int threads);

/// Loads lopper's CUDA library (liblopper_cuda.so, and with it libtorch_cuda and the CUDA
/// libraries) if it is not loaded yet; false when it cannot be. lopper calls it when a CUDA device
/// is asked for; a program that embeds lopper and touches CUDA through ATen itself first (seeds
/// its generators, say) calls it before: ATen keeps the answer of its first look for CUDA.
bool load_cuda();

/// The instruction set lopper's CPU kernels run with on this machine: "avx512", "avx2" or
/// "scalar" (the LOPPER_ISA environment variable may ask for a lower one).
std::string cpu_isa();

/// True when lopper's CUDA library loads, the linked libtorch has CUDA and a GPU is present.
bool cuda_available();

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// How one layer's kernel was chosen at the first inference run: every candidate is timed on the
/// layer's real input and the fastest kept; the choice is cached per machine (see
/// docs/kernels.md), and a cached choice is reused without timing.
struct KernelDecision {
  std::string node, op;
  std::vector<int64_t> weight_shape, input_shape;
  double sparsity = 0;  // fraction of the weight's values that are zero
  std::string chosen;
  std::vector<std::pair<std::string, double>> timings;  // candidate -> best time (ms)
  bool cached = false;  // true: taken from the cache (timings as measured then)
  bool cold = false;    // timed with the weights out of the caches (the model's outgrow them)
  bool busy = false;    // timed while the machine ran slow: used for this run, not cached
  std::vector<std::string> refused;  // candidates that could not run here, each with why
  // candidate -> the library's own name for what it runs (oneDNN's primitives: the ISA they use,
  // AMX where the CPU has it), for the candidates that have one
  std::vector<std::pair<std::string, std::string>> implementations;
  // The chosen kernel and its runner-up timed in the model (candidate -> median ms a call) where
  // they were within a margin alone and took turns on the layer's next calls; `chosen` is the
  // faster there. Empty: no such trial.
  std::vector<std::pair<std::string, double>> in_model;
  bool in_trial = false;  // that trial is under way: the layer's next calls still take turns
};

class Executor {
 public:
  /// Plans `model` (kept by reference: it must outlive the executor). Throws lopper::Error naming
  /// the node and op for any op lopper does not support.
  Executor(const ir::Model& model, ExecOptions opts = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// Runs the graph. Inputs are checked first (check_inputs). Returns the graph outputs in
  /// declaration order. The first inference run also prepacks weights and times candidate
  /// kernels per layer, so it is slower than the ones after it. One run at a time per executor
  /// (runs update per-node state).
  std::vector<at::Tensor> run(const NamedTensors& inputs);
  /// Throws lopper::Error ("[run] ...") naming the first input of `inputs` that the graph does
  /// not declare, the first declared input it lacks (one without an initializer default), or the
  /// first whose dtype or static dims differ from the declaration: what run() checks first.
  void check_inputs(const NamedTensors& inputs) const;

  /// Names and declared types of the inputs a caller must feed.
  const std::vector<const ir::ValueInfo*>& inputs() const;
  std::vector<std::string> output_names() const;

  /// Called after every node with its outputs (e.g. to record shapes). Off by default.
  std::function<void(const ir::Node&, const std::vector<at::Tensor>& in,
                     const std::vector<at::Tensor>& out)>
      on_node;

  /// The executor's own copy of each initializer (on its device). With autograd, float ones
  /// require grad.
  NamedTensors parameters() const;

  const at::Device& device() const;

  /// The kernel chosen for each layer that had a choice, in the order they were made (after the
  /// first run).
  std::vector<KernelDecision> kernel_decisions() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Parses "cpu" / "cuda" / "cuda:N", checking that CUDA is available for the latter.
at::Device parse_device(const std::string& spec);
/// parse_device() for a device the user named: a spec that is not "cpu", "cuda" or "cuda:N" (N of
/// 1 to 3 digits) throws lopper::UsageError (the caller's mistake), CUDA without a GPU
/// lopper::Error.
at::Device check_device(const std::string& spec);

}  // namespace lopper
