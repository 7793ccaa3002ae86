#include "lopper/executor.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/InferenceMode.h>

#include <sched.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "exec/allocator.h"
#include "exec/fuse.h"
#include "exec/kernel_choice.h"
#include "kernels/cpu/bf16.h"
#include "kernels/cpu/sparse.h"
#include "kernels/cuda/library.h"
#include "lopper/error.h"
#include "lopper/memory.h"
#include "lopper/onnx_io.h"
#include "ops/op.h"

namespace lopper {

namespace {

// The CPUs this process may run on (its affinity mask); empty when it cannot be read.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// The cgroup's CPU quota, rounded up to whole CPUs (cgroup v2 cpu.max, v1 cpu.cfs_quota_us);
// 0 when there is none.
int cgroup_cpu_quota() {
  double quota = -1, period = 0;
  std::ifstream v2("/sys/fs/cgroup/cpu.max");
  std::string q;
  if (v2 >> q >> period) {
    if (q != "max") quota = std::atof(q.c_str());
  } else {
    std::ifstream qf("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
    std::ifstream pf("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    if (!(qf >> quota) || !(pf >> period)) quota = -1;
  }
  if (quota <= 0 || period <= 0) return 0;
  return std::max(1, static_cast<int>(std::ceil(quota / period)));
}

// Per CPU: (idle + iowait, all) time so far, from /proc/stat (in USER_HZ ticks).
std::map<int, std::pair<uint64_t, uint64_t>> cpu_times() {
  std::map<int, std::pair<uint64_t, uint64_t>> times;
  std::ifstream f("/proc/stat");
  std::string line;
  while (std::getline(f, line)) {
    if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || !std::isdigit(line[3])) continue;
    std::istringstream in(line.substr(3));
    int cpu = 0;
    uint64_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    in >> cpu;
    for (auto& x : v) in >> x;  // user nice system idle iowait irq softirq steal
    uint64_t all = 0;
    for (auto x : v) all += x;
    times[cpu] = {v[3] + v[4], all};
  }
  return times;
}

}  // namespace

// NOTE: why the default is the idle CPUs, not every CPU. With one thread per core, a core held by
// another process makes OpenMP's barriers wait for that core's scheduler slice (libgomp spins
// 300000 times before sleeping, so its threads never yield): every parallel region can cost a
// tick, and a 0.1 ms model measures 35 ms. Median of `lopper bench MODEL --json` medians (3
// processes each; lenet5: --iters 200 --warmup 20, resnet18: --iters 20 --warmup 3), on a 2-vCPU
// VM (torch 2.14 wheel, its libgomp), each started once the machine was quiet; "1 busy"/"2 busy":
// 1 or 2 `python3 -c 'while True: pass'` running (ms):
//
//                                          lenet5                  resnet18
//   setting                           idle  1 busy  2 busy     idle  1 busy  2 busy
//   --threads 2 (the old default)    0.106  0.121*   0.110     16.0   145.4   47.2*
//   --threads 1                      0.082   0.084   0.087     27.6    28.3    40.5
//   --threads 2, OMP_WAIT_POLICY=    0.563   0.123   0.302     16.5    27.2    44.7
//     PASSIVE
//   --threads 2, GOMP_SPINCOUNT=     0.108   1.278   0.115     15.3    33.4    35.8
//     10000
//   default (idle CPUs: 2, 1, 1)     0.106   0.082   0.087     15.5    27.5    35.1
//   * unstable: in some processes a tenth of the runs or more took 25-50 ms (lenet5: p90 250x the
//     median) or a whole process 184 ms (resnet18); with other work on the machine, lenet5
//     processes measured 30-60 ms for every run.
//
// Counting the idle CPUs is close to the best in every column. The wait policy alone is not: a
// passive wait costs a wake-up per parallel region (5x on lenet5 when idle), and spinning less
// only moves the cliff. It could not be set here anyway: libgomp reads OMP_WAIT_POLICY and
// GOMP_SPINCOUNT in its own initialiser, before main() (setenv there is too late, checked with
// OMP_DISPLAY_ENV=VERBOSE), and re-executing lopper to set them would double its 0.35 s start.
// The 20 ms sample is /proc/stat's per-CPU idle time (10 ms ticks), summed over the allowed CPUs.
// What it cannot see is load that starts later in a long run; --threads and OMP_NUM_THREADS
// override it.
int max_threads() { return std::max(4, 4 * static_cast<int>(std::thread::hardware_concurrency())); }

int default_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0 && n <= 4096) return static_cast<int>(n);
  }
  std::vector<int> cpus = allowed_cpus();
  int n = cpus.empty() ? static_cast<int>(std::thread::hardware_concurrency())
                       : static_cast<int>(cpus.size());
  if (const int quota = cgroup_cpu_quota()) n = std::min(n, quota);
  if (n <= 1) return 1;
  // The idle share of the allowed CPUs over a short window (this process sleeps meanwhile), in
  // CPUs: a process spinning on one core takes one away, wherever the scheduler moves it.
  const auto before = cpu_times();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto after = cpu_times();
  uint64_t idle_ticks = 0, all_ticks = 0;
  int seen = 0;
  for (int c : cpus) {
    auto a = before.find(c), b = after.find(c);
    if (a == before.end() || b == after.end()) continue;
    idle_ticks += b->second.first - a->second.first;
    all_ticks += b->second.second - a->second.second;
    ++seen;
  }
  if (seen == 0 || all_ticks == 0) return n;  // no /proc/stat, or a view without these CPUs
  const double idle = double(seen) * double(idle_ticks) / double(all_ticks);
  return std::max(1, std::min(n, static_cast<int>(idle + 0.5)));
}

void configure_threads(int threads) {
  const int n = threads > 0 ? threads : default_threads();
  // NOTE: one intra-op pool (OpenMP, which MKL and oneDNN share in the torch wheel) sized to the
  // cores, and a single inter-op thread: two pools of full size oversubscribe small machines.
  at::set_num_threads(n);
  try {
    at::set_num_interop_threads(1);
  } catch (const std::exception&) {
    // Already set (it may only be set once per process); keep the first setting.
  }
}

at::ScalarType parse_precision(const std::string& s) {
  if (s == "fp32") return at::kFloat;
  if (s == "bf16") return at::kBFloat16;
  if (s == "fp16") return at::kHalf;
  throw UsageError(
      detail::concat("[precision] bad precision '", s, "' (expected fp32, bf16 or fp16)"));
}

bool load_cuda() { return kernels::cuda::library() != nullptr; }

namespace {
// A float32 input in the executor's lowered precision: a CPU bf16 one by lopper's conversion
// (ATen's took 0.1 ms on a 3x224x224 image, AMD EPYC Zen 4, 2 threads), in the input's layout.
at::Tensor lowered_input(const at::Tensor& t, at::ScalarType precision) {
  if (precision == at::kBFloat16 && t.device().is_cpu() && t.is_contiguous())
    return kernels::cpu::narrow_to_bf16(t);
  return t.to(precision);
}
}  // namespace

bool cuda_available() { return load_cuda() && at::hasCUDA() && at::globalContext().hasCUDA(); }

namespace {

// Why CUDA is unavailable, for the error of a device the user asked for.
std::string why_no_cuda() {
  if (!load_cuda()) return "lopper's CUDA library: " + kernels::cuda::load_error();
  try {
    (void)at::detail::getCUDAHooks().versionCUDART();
  } catch (const std::exception&) {
    // ATen keeps the answer it got before libtorch_cuda was loaded (kernels/cuda/library.h).
    return "CUDA was looked up in this process before lopper loaded its CUDA library: call "
           "lopper::load_cuda() first";
  }
  return "no CUDA GPU is available";
}

}  // namespace

at::Device parse_device(const std::string& spec) {
  if (spec == "cpu") return at::Device(at::kCPU);
  if (spec.rfind("cuda", 0) == 0) {
    int index = 0;
    if (spec.size() > 4) {
      LOPPER_CHECK(spec[4] == ':' && spec.size() > 5 &&
                       spec.find_first_not_of("0123456789", 5) == std::string::npos &&
                       spec.size() < 9,
                   "[device] bad device '", spec, "' (expected cpu, cuda or cuda:N)");
      index = std::stoi(spec.substr(5));
    }
    LOPPER_CHECK(cuda_available(), "[device] '", spec, "' requested, but ", why_no_cuda());
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  throw Error(detail::concat("[device] bad device '", spec, "' (expected cpu, cuda or cuda:N)"));
}

at::Device check_device(const std::string& spec) {
  const bool index = spec.size() > 5 && spec.size() < 9 && spec.compare(0, 5, "cuda:") == 0 &&
                     spec.find_first_not_of("0123456789", 5) == std::string::npos;
  if (spec != "cpu" && spec != "cuda" && !index)
    throw UsageError("[device] bad device '" + spec + "' (expected cpu, cuda or cuda:N)");
  return parse_device(spec);
}

namespace {

// The last inputs and outputs of a step whose inputs are all constants or shape values (see
// Executor::Impl::mark_shape_steps): the same small inputs again give the same outputs.
struct Memo {
  std::vector<at::Tensor> key;  // the non-constant inputs, by input position (undefined: constant)
  std::vector<at::Tensor> outs;
};

struct Step {
  const ir::Node* node = nullptr;
  const ops::OpDef* op = nullptr;
  int64_t opset = 0;
  std::vector<int> in;       // -1: omitted optional input
  std::vector<int> out;      // -1: omitted optional output
  std::vector<int> release;  // slots whose last reader is this step
  std::shared_ptr<void> state;
  bool shape_only = false;  // computes on constants and shape values only: memoised
  std::unique_ptr<Memo> memo;
};

// A shape value small enough to compare each run (a shape, an index, a few bounds).
constexpr int64_t kMemoMaxElements = 64;

// Whether `t` equals `key` (type, shape and bytes); both CPU tensors.
bool same_value(const at::Tensor& t, const at::Tensor& key) {
  if (t.scalar_type() != key.scalar_type() || t.sizes() != key.sizes()) return false;
  const at::Tensor a = t.contiguous();
  return a.nbytes() == 0 || std::memcmp(a.data_ptr(), key.data_ptr(), a.nbytes()) == 0;
}

struct Plan {
  std::vector<Step> steps;
  std::unordered_map<std::string, int> slot_of;
  std::vector<at::Tensor> constants;  // by slot; defined for initializers and folded values
  std::vector<std::pair<std::string, int>> outer;  // names read from enclosing scopes
  std::vector<int> input_slots;  // graph inputs in order (initializer-backed ones included)
  std::vector<int> output_slots;
  int num_slots = 0;
};

struct Env {
  const Plan* plan;
  std::vector<at::Tensor> vals;
  const Env* parent;
  const at::Tensor* lookup(const std::string& name) const {
    for (const Env* e = this; e; e = e->parent) {
      auto it = e->plan->slot_of.find(name);
      if (it != e->plan->slot_of.end() && e->vals[it->second].defined())
        return &e->vals[it->second];
    }
    return nullptr;
  }
};

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

std::string shape_str(const std::vector<ir::Dim>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    out += (i ? "," : "") + (dims[i].is_static() ? std::to_string(dims[i].value)
                                                 : (dims[i].param.empty() ? "?" : dims[i].param));
  return out + "]";
}

}  // namespace

struct Executor::Impl {
  const ir::Model& model;
  ExecOptions opts;
  at::Device device{at::kCPU};
  std::unordered_map<const ir::Graph*, std::unique_ptr<Plan>> plans;
  std::vector<const ir::ValueInfo*> real_inputs;
  NamedTensors params;
  std::unique_ptr<ir::Graph> fused;  // the rewritten top graph (inference), else null
  std::vector<KernelDecision> decisions;
  bool weights_exceed_cache = false;  // the top graph's constants outgrow the last-level cache

  Impl(const ir::Model& m, ExecOptions o) : model(m), opts(std::move(o)) {
    opts.autograd = opts.autograd || opts.training;
  }
  const ir::Graph& top() const { return fused ? *fused : model.graph; }
  bool lowered() const { return !opts.autograd && opts.precision != at::kFloat; }

  const Plan& plan_for(const ir::Graph& g, bool top) {
    auto it = plans.find(&g);
    if (it != plans.end()) return *it->second;
    auto plan = std::make_unique<Plan>();
    build(g, *plan, top);
    return *plans.emplace(&g, std::move(plan)).first->second;
  }

  int slot(Plan& p, const std::string& name) {
    auto it = p.slot_of.find(name);
    if (it != p.slot_of.end()) return it->second;
    p.slot_of[name] = p.num_slots;
    return p.num_slots++;
  }

  void build(const ir::Graph& g, Plan& p, bool top) {
    const auto& table = ops::OpTable::global();
    std::unordered_set<std::string> local;
    for (const auto& v : g.inputs) local.insert(v.name);
    for (const auto& t : g.initializers) local.insert(t.name);
    for (const auto& n : g.nodes)
      for (const auto& o : n.outputs)
        if (!o.empty()) local.insert(o);
    std::vector<std::string> outer_names;
    for (const auto& n : g.nodes)
      for (const auto& r : ir::node_reads(n))
        if (!local.count(r)) outer_names.push_back(r);
    LOPPER_CHECK(top ? outer_names.empty() : true, "[exec] node reads '",
                 outer_names.empty() ? "" : outer_names[0], "', which nothing produces");
    auto order = g.topological_order(outer_names);

    for (const auto& v : g.inputs) p.input_slots.push_back(slot(p, v.name));
    for (const auto& t : g.initializers) {
      int s = slot(p, t.name);
      at::Tensor v = t.value.to(device);
      if (lowered() && v.scalar_type() == at::kFloat) v = v.to(opts.precision);
      if (opts.autograd && v.is_floating_point()) {
        v = v.detach().clone().requires_grad_(true);
      }
      if (top) params.emplace_back(t.name, v);
      if (static_cast<int>(p.constants.size()) <= s) p.constants.resize(s + 1);
      p.constants[s] = v;
    }
    std::unordered_set<std::string> outer_set(outer_names.begin(), outer_names.end());
    for (const auto& name : outer_set) p.outer.emplace_back(name, slot(p, name));

    for (size_t idx : order) {
      const ir::Node& n = g.nodes[idx];
      Step st;
      st.node = &n;
      st.op = table.find(n.domain, n.op_type);
      LOPPER_CHECK(st.op, "[exec] node '", n.label(), "': unsupported op '",
                   n.domain.empty() ? "" : n.domain + ".", n.op_type, "'");
      st.opset = model.opset(n.domain);
      for (const auto& i : n.inputs) st.in.push_back(i.empty() ? -1 : slot(p, i));
      for (const auto& o : n.outputs) st.out.push_back(o.empty() ? -1 : slot(p, o));
      p.steps.push_back(std::move(st));
    }
    for (const auto& v : g.outputs) {
      auto it = p.slot_of.find(v.name);
      LOPPER_CHECK(it != p.slot_of.end(), "[exec] graph output '", v.name,
                   "' is not produced by any node");
      p.output_slots.push_back(it->second);
    }
    p.constants.resize(p.num_slots);

    if (!opts.autograd && opts.fold_constants) fold(p);
    if (!opts.autograd) mark_shape_steps(p);
    // Constants made by folding (and Constant nodes' values) take the precision too.
    if (lowered())
      for (auto& v : p.constants)
        if (v.defined() && v.scalar_type() == at::kFloat) v = v.to(opts.precision);
    plan_releases(p);
    if (top) {
      int64_t bytes = 0;
      for (const auto& v : p.constants)
        if (v.defined()) bytes += static_cast<int64_t>(v.nbytes());
      // The weights subgraphs hold themselves (ai.lopper.ConvChain's body) count too.
      std::function<void(const ir::Graph&)> sub = [&](const ir::Graph& sg) {
        for (const auto& n : sg.nodes)
          for (const auto& a : n.attrs) {
            std::vector<const ir::Graph*> gs;
            if (a.g) gs.push_back(a.g.get());
            for (const auto& x : a.graphs) gs.push_back(x.get());
            for (const ir::Graph* x : gs) {
              for (const auto& t : x->initializers) bytes += static_cast<int64_t>(t.value.nbytes());
              sub(*x);
            }
          }
      };
      sub(g);
      const int64_t llc = last_level_cache_bytes();
      weights_exceed_cache = llc > 0 && bytes > llc;
    }
  }

  // Runs, once, every node whose inputs are all constant; its outputs become constants.
  void fold(Plan& p) {
    c10::InferenceMode guard;
    std::vector<Step> kept;
    for (auto& st : p.steps) {
      bool foldable = st.op->deterministic;
      for (const auto& a : st.node->attrs)
        if (a.g || !a.graphs.empty()) foldable = false;
      for (int s : st.in)
        if (s >= 0 && !p.constants[s].defined()) foldable = false;
      if (!foldable) {
        kept.push_back(std::move(st));
        continue;
      }
      std::vector<at::Tensor> outs = execute(
          st, [&](int s) { return p.constants[s]; }, nullptr);
      for (size_t k = 0; k < st.out.size(); ++k)
        if (st.out[k] >= 0) p.constants[st.out[k]] = outs[k];
    }
    p.steps = std::move(kept);
  }

  // Marks the steps that compute only from constants and from shapes (Shape and Size of any
  // value, and what deterministic ops make of those): a model exported with its shape arithmetic
  // (Shape -> Gather -> Unsqueeze -> Concat -> Reshape, torch.chunk's split points, Swin's window
  // masks) runs it every time, 5-20% of a small model's time, where ONNX Runtime folds it once
  // for the static input shapes. Such a step keeps its last inputs and outputs (Memo) and reuses
  // the outputs while its inputs are the same: checked each run, so a shape that depends on the
  // data (after NonZero, say) is still right.
  void mark_shape_steps(Plan& p) {
    std::vector<bool> shape_value(p.num_slots, false);
    for (int s = 0; s < p.num_slots; ++s) shape_value[s] = p.constants[s].defined();
    for (auto& st : p.steps) {
      const bool source =
          st.node->domain.empty() && (st.node->op_type == "Shape" || st.node->op_type == "Size");
      bool only = !source && st.op->deterministic && !st.in.empty();
      for (const auto& a : st.node->attrs)
        if (a.g || !a.graphs.empty()) only = false;
      for (int s : st.in)
        if (s >= 0 && !shape_value[s]) only = false;
      st.shape_only = only;
      if (source || only)
        for (int s : st.out)
          if (s >= 0) shape_value[s] = true;
    }
  }

  void plan_releases(Plan& p) {
    std::vector<int> last(p.num_slots, -1);
    for (size_t i = 0; i < p.steps.size(); ++i) {
      for (int s : p.steps[i].in)
        if (s >= 0) last[s] = static_cast<int>(i);
      for (const auto& r : ir::node_reads(*p.steps[i].node))
        last[p.slot_of.at(r)] = static_cast<int>(i);
    }
    std::unordered_set<int> keep(p.output_slots.begin(), p.output_slots.end());
    for (int s = 0; s < p.num_slots; ++s)
      if (last[s] >= 0 && !keep.count(s) && !p.constants[s].defined())
        p.steps[last[s]].release.push_back(s);
  }

  // "[exec] node 'N' (Op): out of memory allocating 3.1 TB (this machine has 24 GB)".
  std::string out_of_memory(const ir::Node& n, const std::string& size) const {
    std::string where = device.is_cpu()
                            ? "this machine has " + human_bytes(static_cast<double>(memory_bytes()))
                            : "on " + device.str();
    return detail::concat("[exec] node '", n.label(), "' (", n.op_type, "): out of memory",
                          size.empty() ? "" : " allocating " + size, " (", where, ")");
  }

  template <typename Get>
  std::vector<at::Tensor> execute(Step& st, Get&& get, const Env* env) {
    ops::OpContext ctx(*st.node, st.opset, opts.training, device);
    ctx.inputs_.resize(st.in.size());
    ctx.constant_.resize(st.in.size());
    for (size_t k = 0; k < st.in.size(); ++k) {
      if (st.in[k] < 0) continue;
      ctx.inputs_[k] = get(st.in[k]);
      ctx.constant_[k] = env ? env->plan->constants[st.in[k]].defined() : true;
    }
    ctx.outputs_.resize(st.out.size());
    ctx.wanted_.resize(st.out.size());
    for (size_t k = 0; k < st.out.size(); ++k) ctx.wanted_[k] = st.out[k] >= 0;
    ctx.state_ = &st.state;
    ctx.decisions_ = &decisions;
    ctx.grad_mode_ = opts.autograd;
    ctx.prepack_ = opts.prepack;
    ctx.weights_exceed_cache_ = weights_exceed_cache;
    ctx.lowered_ = lowered();
    ctx.subgraph_runner_ = [this, env](const ir::Graph& g, const std::vector<at::Tensor>& in) {
      return run_graph(g, in, env);
    };
    ctx.subgraph_releaser_ = [this](const ir::Graph& g) {
      auto it = plans.find(&g);
      if (it != plans.end())
        for (auto& step : it->second->steps) step.state.reset();
    };
    try {
      st.op->forward(ctx);
    } catch (const Error&) {
      throw;
    } catch (const OutOfMemory& e) {  // lopper's CPU allocator: the size is known
      throw Error(out_of_memory(*st.node, human_bytes(static_cast<double>(e.bytes()))));
    } catch (const std::bad_alloc&) {
      throw Error(out_of_memory(*st.node, ""));
    } catch (const c10::Error& e) {
      // NOTE: ATen's own allocators say "not enough memory: you tried to allocate N bytes" (CPU)
      // or "CUDA out of memory. Tried to allocate 2.00 GiB" (an OutOfMemoryError), over lines.
      std::string msg = e.what_without_backtrace();
      if (dynamic_cast<const c10::OutOfMemoryError*>(&e) ||
          msg.find("not enough memory") != std::string::npos)
        throw Error(out_of_memory(*st.node, allocation_size_in(msg)));
      throw Error(detail::concat("[exec] node '", st.node->label(), "' (", st.node->op_type,
                                 "): ", first_line(msg)));
    }
    for (size_t k = 0; k < st.out.size(); ++k)
      if (st.out[k] >= 0 && !ctx.outputs_[k].defined())
        throw Error(detail::concat("[exec] node '", st.node->label(), "' (", st.node->op_type,
                                   "): output ", k, " was not produced"));
    if (on_node_) on_node_(*st.node, ctx.inputs_, ctx.outputs_);
    return std::move(ctx.outputs_);
  }

  // A shape step whose non-constant inputs are those of its memo: its outputs set from it.
  bool reuse_memo(const Step& st, Env& env) {
    if (!st.memo) return false;
    const Plan& p = *env.plan;
    for (size_t k = 0; k < st.in.size(); ++k) {
      const int s = st.in[k];
      if (s < 0 || p.constants[s].defined()) continue;
      const at::Tensor& v = env.vals[s];
      if (!v.defined() || !same_value(v, st.memo->key[k])) return false;
    }
    for (size_t k = 0; k < st.out.size(); ++k)
      if (st.out[k] >= 0) env.vals[st.out[k]] = st.memo->outs[k];
    if (on_node_) {
      std::vector<at::Tensor> ins;
      for (int s : st.in) ins.push_back(s >= 0 ? env.vals[s] : at::Tensor());
      on_node_(*st.node, ins, st.memo->outs);
    }
    return true;
  }

  // Keeps a shape step's inputs and outputs when its non-constant inputs are small CPU tensors
  // (checked first: a step fed a large value, a mask made from a shape, is run each time and
  // keeps nothing).
  void remember(Step& st, const Env& env, const std::vector<at::Tensor>& outs) {
    const Plan& p = *env.plan;
    auto varying = [&](size_t k) { return st.in[k] >= 0 && !p.constants[st.in[k]].defined(); };
    st.memo.reset();
    for (size_t k = 0; k < st.in.size(); ++k) {
      if (!varying(k)) continue;
      const at::Tensor& v = env.vals[st.in[k]];
      if (!v.device().is_cpu() || v.numel() > kMemoMaxElements || v.requires_grad()) return;
    }
    auto m = std::make_unique<Memo>();
    m->key.resize(st.in.size());
    for (size_t k = 0; k < st.in.size(); ++k)
      if (varying(k)) m->key[k] = env.vals[st.in[k]].contiguous();
    m->outs = outs;
    st.memo = std::move(m);
  }

  std::vector<at::Tensor> run_graph(const ir::Graph& g, const std::vector<at::Tensor>& inputs,
                                    const Env* parent) {
    const Plan& p = plan_for(g, parent == nullptr);
    Env env{&p, std::vector<at::Tensor>(p.constants), parent};
    LOPPER_CHECK(inputs.size() <= p.input_slots.size(), "[exec] graph '", g.name, "' takes ",
                 p.input_slots.size(), " inputs, got ", inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined()) env.vals[p.input_slots[i]] = inputs[i];
    for (const auto& [name, s] : p.outer) {
      const at::Tensor* t = parent ? parent->lookup(name) : nullptr;
      LOPPER_CHECK(t, "[exec] subgraph '", g.name, "' reads '", name, "', which is not defined");
      env.vals[s] = *t;
    }
    for (const Step& cst : p.steps) {
      Step& st = const_cast<Step&>(cst);
      if (st.shape_only && reuse_memo(st, env)) {
        for (int s : st.release) env.vals[s].reset();
        continue;
      }
      auto outs = execute(
          st,
          [&](int s) -> const at::Tensor& {
            if (!env.vals[s].defined()) {
              std::string name;
              for (const auto& [n, slot] : p.slot_of)
                if (slot == s) name = n;
              throw Error(detail::concat("[exec] node '", st.node->label(), "': input '", name,
                                         "' has no value"));
            }
            return env.vals[s];
          },
          &env);
      if (st.shape_only) remember(st, env, outs);
      for (size_t k = 0; k < st.out.size(); ++k)
        if (st.out[k] >= 0) env.vals[st.out[k]] = std::move(outs[k]);
      for (int s : st.release) env.vals[s].reset();
    }
    std::vector<at::Tensor> out;
    for (int s : p.output_slots) out.push_back(env.vals[s]);
    return out;
  }

  std::function<void(const ir::Node&, const std::vector<at::Tensor>&,
                     const std::vector<at::Tensor>&)>
      on_node_;
};

Executor::Executor(const ir::Model& model, ExecOptions opts)
    : impl_(std::make_unique<Impl>(model, std::move(opts))) {
  impl_->device = parse_device(impl_->opts.device);
  const auto prec = impl_->opts.precision;
  // NOTE: a precision the executor does not run is the caller's mistake (a usage error: the CLI's
  // exit 2, Python's ValueError), as a bad device is.
  if (!(prec == at::kFloat || prec == at::kBFloat16 || prec == at::kHalf))
    throw UsageError(detail::concat("[precision] the executor runs fp32, bf16 or fp16, not ",
                                    at::toString(prec)));
  if (prec == at::kHalf && !impl_->device.is_cuda())
    throw UsageError("[precision] fp16 needs a CUDA device (" LOPPER_OPTION(
        "device") " cuda); on the CPU use fp32 or bf16");
  if (impl_->device.is_cpu()) kernels::cpu::active_isa();  // a bad LOPPER_ISA fails here, at load
  exec::install_caching_cpu_allocator();
  impl_->real_inputs = model.graph.real_inputs();
  if (!impl_->opts.autograd && impl_->opts.fuse)
    impl_->fused =
        std::make_unique<ir::Graph>(exec::fuse_for_inference(model.graph, model.opset()));
  impl_->plan_for(impl_->top(), true);
}

Executor::~Executor() = default;

const std::vector<const ir::ValueInfo*>& Executor::inputs() const { return impl_->real_inputs; }

std::vector<std::string> Executor::output_names() const {
  std::vector<std::string> out;
  for (const auto& v : impl_->model.graph.outputs) out.push_back(v.name);
  return out;
}

NamedTensors Executor::parameters() const { return impl_->params; }
const at::Device& Executor::device() const { return impl_->device; }
std::vector<KernelDecision> Executor::kernel_decisions() const { return impl_->decisions; }

void Executor::check_inputs(const NamedTensors& inputs) const {
  const ir::Graph& g = impl_->model.graph;
  std::unordered_map<std::string, const at::Tensor*> given;
  for (const auto& [name, t] : inputs) {
    bool known = false;
    for (const auto& v : g.inputs) known |= v.name == name;
    LOPPER_CHECK(known, "[run] the model has no input named '", name, "'");
    given[name] = &t;
  }
  for (const auto& v : g.inputs) {
    auto it = given.find(v.name);
    if (it == given.end()) {
      LOPPER_CHECK(g.find_initializer(v.name), "[run] missing input '", v.name, "'");
      continue;
    }
    const at::Tensor& t = *it->second;
    if (v.type.is_tensor() && v.type.elem_type != ir::DType::kUndefined) {
      auto want = onnx::to_scalar_type(v.type.elem_type);
      LOPPER_CHECK(t.scalar_type() == want, "[run] input '", v.name, "': expected ",
                   ir::dtype_name(v.type.elem_type), ", got ",
                   ir::dtype_name(onnx::to_dtype(t.scalar_type())));
    }
    if (v.type.is_tensor() && v.type.has_shape) {
      const auto& dims = v.type.dims;
      bool ok = static_cast<int64_t>(dims.size()) == t.dim();
      for (size_t d = 0; ok && d < dims.size(); ++d)
        ok = !dims[d].is_static() || dims[d].value == t.size(d);
      LOPPER_CHECK(ok, "[run] input '", v.name, "': expected shape ", shape_str(dims), ", got ",
                   shape_str(t.sizes()));
    }
  }
}

std::vector<at::Tensor> Executor::run(const NamedTensors& inputs) {
  check_inputs(inputs);
  const ir::Graph& g = impl_->model.graph;
  std::unordered_map<std::string, at::Tensor> given;
  for (const auto& [name, t] : inputs) given[name] = t;
  std::vector<at::Tensor> ordered;
  for (const auto& v : g.inputs) {
    auto it = given.find(v.name);
    if (it == given.end()) {
      ordered.emplace_back();  // initializer default
      continue;
    }
    at::Tensor t = it->second.to(impl_->device);
    if (impl_->lowered() && t.scalar_type() == at::kFloat)
      t = lowered_input(t, impl_->opts.precision);
    ordered.push_back(t);
  }
  impl_->on_node_ = on_node;
  if (impl_->opts.autograd) {
    auto outs = impl_->run_graph(impl_->top(), ordered, nullptr);
    ops::flush_kernel_choices();
    return outs;
  }
  c10::InferenceMode guard;
  auto outs = impl_->run_graph(impl_->top(), ordered, nullptr);
  ops::flush_kernel_choices();  // the choices this run timed, in one write
  // Kernels may hand back channels-last tensors; callers get the standard layout.
  // NOTE: a bf16 output is widened first (in its layout, by lopper's conversion), so that the
  // layout change is the float32 transposes: ATen's strided bf16 copy and its conversion took
  // 0.2 ms on a 16x112x112 map (AMD EPYC Zen 4, 2 threads).
  for (auto& t : outs) {
    if (impl_->lowered() && t.defined() && t.scalar_type() == impl_->opts.precision)
      t = t.scalar_type() == at::kBFloat16 ? kernels::cpu::widen_bf16(t) : t.to(at::kFloat);
    if (t.defined() && !t.is_contiguous()) t = kernels::cpu::standard_layout(t);
  }
  return outs;
}

}  // namespace lopper
