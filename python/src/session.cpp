// lopper.InferenceSession: ONNX Runtime's session API (run, get_inputs, get_outputs) over lopper's
// executor. numpy arrays and torch tensors cross without a copy, the GIL is released while lopper
// loads and runs, and lopper's errors reach Python as its one line (module.cpp).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/tensor_numpy.h>

#include <climits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "lopper/analysis.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/graph.h"
#include "lopper/onnx_io.h"

namespace py = pybind11;

namespace lopper::python {
namespace {

// ONNX's names of its element types, as ONNX Runtime writes them in NodeArg.type.
const char* onnx_type_name(ir::DType t) {
  switch (t) {
    case ir::DType::kFloat:
      return "float";
    case ir::DType::kUInt8:
      return "uint8";
    case ir::DType::kInt8:
      return "int8";
    case ir::DType::kUInt16:
      return "uint16";
    case ir::DType::kInt16:
      return "int16";
    case ir::DType::kInt32:
      return "int32";
    case ir::DType::kInt64:
      return "int64";
    case ir::DType::kString:
      return "string";
    case ir::DType::kBool:
      return "bool";
    case ir::DType::kFloat16:
      return "float16";
    case ir::DType::kDouble:
      return "double";
    case ir::DType::kUInt32:
      return "uint32";
    case ir::DType::kUInt64:
      return "uint64";
    case ir::DType::kComplex64:
      return "complex64";
    case ir::DType::kComplex128:
      return "complex128";
    case ir::DType::kBFloat16:
      return "bfloat16";
    case ir::DType::kFloat8E4M3FN:
      return "float8e4m3fn";
    case ir::DType::kFloat8E4M3FNUZ:
      return "float8e4m3fnuz";
    case ir::DType::kFloat8E5M2:
      return "float8e5m2";
    case ir::DType::kFloat8E5M2FNUZ:
      return "float8e5m2fnuz";
    case ir::DType::kUInt4:
      return "uint4";
    case ir::DType::kInt4:
      return "int4";
    case ir::DType::kFloat4E2M1:
      return "float4e2m1";
    case ir::DType::kUndefined:
      break;
  }
  return "undefined";
}

// One input or output of a model, described the way ONNX Runtime's NodeArg does.
struct NodeArg {
  std::string name;
  ir::TypeInfo info;

  std::string type() const {
    return info.is_tensor() ? std::string("tensor(") + onnx_type_name(info.elem_type) + ")"
                            : "non-tensor";
  }
  py::list shape() const {
    py::list out;
    if (!info.is_tensor() || !info.has_shape) return out;
    for (const auto& d : info.dims) {
      if (d.is_static())
        out.append(d.value);
      else if (!d.param.empty())
        out.append(d.param);
      else
        out.append(py::none());
    }
    return out;
  }
};

// Runs with `threads` intra-op threads and puts back the count it found (torch's setting, which
// is the same process-wide pool).
class ThreadsScope {
 public:
  explicit ThreadsScope(int threads) : previous_(at::get_num_threads()) {
    if (threads != previous_) at::set_num_threads(threads);
  }
  ~ThreadsScope() {
    if (at::get_num_threads() != previous_) at::set_num_threads(previous_);
  }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;

 private:
  int previous_;
};

std::string type_name(py::handle h) { return Py_TYPE(h.ptr())->tp_name; }

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// A numpy array (or anything numpy.asarray takes) as a tensor on the same memory. torch cannot
// view negative strides (a[::-1]): those arrays are copied first.
at::Tensor tensor_from_array(py::handle value, const std::string& name) {
  py::module_ np = py::module_::import("numpy");
  py::object array = py::reinterpret_borrow<py::object>(value);
  if (!py::isinstance(array, np.attr("ndarray"))) array = np.attr("asarray")(array);
  for (auto stride : array.attr("strides")) {
    if (stride.cast<int64_t>() < 0) {
      array = np.attr("ascontiguousarray")(array);
      break;
    }
  }
  try {
    return torch::utils::tensor_from_numpy(array.ptr(), /*warn_if_not_writeable=*/false);
  } catch (const c10::Error& e) {
    throw UsageError("[run] input '" + name + "': " + first_line(e.what_without_backtrace()));
  }
}

// NOTE: the executor runs in inference mode, so its outputs are inference tensors, which torch
// refuses to update in place or to record for autograd. A new tensor on the same storage is an
// ordinary one: the caller gets the executor's memory without a copy.
at::Tensor as_ordinary_tensor(const at::Tensor& t) {
  if (!t.is_inference()) return t;
  at::Tensor out = at::empty({0}, t.options());
  out.set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
  return out;
}

// `h` as a str; a TypeError naming `what` otherwise.
std::string string_of(py::handle h, const char* what) {
  if (!py::isinstance<py::str>(h))
    throw py::type_error(std::string("[session] ") + what + " must be a str, got " + type_name(h));
  return h.cast<std::string>();
}

// `h` as an int (not a bool); a TypeError otherwise, a ValueError when it does not fit an int.
int int_of(py::handle h, const char* what) {
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr()))
    throw py::type_error(std::string("[session] ") + what + " must be an int, got " + type_name(h));
  const auto i = py::reinterpret_steal<py::object>(PyNumber_Index(h.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow || v < INT_MIN || v > INT_MAX)
    throw UsageError(std::string("[session] ") + what + " " + py::str(i).cast<std::string>() +
                     " is out of range");
  return int(v);
}

// The device of onnxruntime's providers list: names, or (name, options) pairs, in order of
// preference; "CPUExecutionProvider" is the CPU, "CUDAExecutionProvider" a GPU (its device_id
// option, from the pair or provider_options). The first one is used; a provider lopper does not
// run is refused.
std::string device_of_providers(const py::object& providers, const py::object& options) {
  if (py::isinstance<py::str>(providers) || !py::isinstance<py::sequence>(providers))
    throw py::type_error("[session] providers must be a list of provider names, got " +
                         type_name(providers));
  const auto list = providers.cast<py::sequence>();
  if (list.size() == 0) throw UsageError("[session] providers is empty");
  if (!options.is_none() &&
      (!py::isinstance<py::sequence>(options) || py::isinstance<py::str>(options) ||
       options.cast<py::sequence>().size() != list.size()))
    throw UsageError("[session] provider_options must be a list of dicts, one per provider");
  std::string device;
  for (size_t i = 0; i < list.size(); ++i) {
    py::object item = list[i];
    py::object opts = options.is_none() ? py::object(py::none()) : py::object(options[py::int_(i)]);
    if (py::isinstance<py::tuple>(item) && py::len(item) == 2) {
      opts = item[py::int_(1)];
      item = item[py::int_(0)];
    }
    const std::string name = string_of(item, "a provider");
    std::string d;
    if (name == "CPUExecutionProvider") {
      d = "cpu";
    } else if (name == "CUDAExecutionProvider") {
      d = "cuda";
      if (py::isinstance<py::dict>(opts) && opts.contains("device_id"))
        d += ":" + py::str(opts["device_id"]).cast<std::string>();
    } else {
      throw UsageError("[session] provider '" + name +
                       "' is not one lopper runs (CPUExecutionProvider, CUDAExecutionProvider)");
    }
    if (device.empty()) device = d;
  }
  return device;
}

class Session {
 public:
  Session(const py::object& path_or_bytes, const py::object& sess_options,
          const py::object& providers, const py::object& provider_options,
          const py::object& device_arg, const py::object& threads_arg,
          const py::object& precision_arg) {
    std::string device = device_arg.is_none() ? "cpu" : string_of(device_arg, "device");
    // The executor's rule (a bad name, fp16 without a GPU: ValueError).
    const at::ScalarType precision =
        parse_precision(precision_arg.is_none() ? "fp32" : string_of(precision_arg, "precision"));
    int threads = threads_arg.is_none() ? 0 : int_of(threads_arg, "threads");
    // onnxruntime's arguments, where they map: SessionOptions.intra_op_num_threads, and the CPU
    // and CUDA execution providers (the first of the list is used; CUDA with its device_id).
    if (!sess_options.is_none()) {
      if (!py::hasattr(sess_options, "intra_op_num_threads"))
        throw py::type_error(
            "[session] sess_options must be an onnxruntime.SessionOptions (or have "
            "intra_op_num_threads), got " +
            type_name(sess_options));
      const int n = int_of(sess_options.attr("intra_op_num_threads"), "intra_op_num_threads");
      if (n != 0 && threads != 0 && n != threads)
        throw UsageError("[session] threads=" + std::to_string(threads) +
                         " and sess_options.intra_op_num_threads=" + std::to_string(n) + " differ");
      if (threads == 0) threads = n;
    }
    if (!providers.is_none()) {
      if (!device_arg.is_none()) throw UsageError("[session] give device or providers, not both");
      device = device_of_providers(providers, provider_options);
    } else if (!provider_options.is_none()) {
      throw UsageError("[session] provider_options needs providers");
    }
    if (threads < 0 || threads > max_threads())
      throw UsageError("[session] threads must be 0.." + std::to_string(max_threads()) +
                       " (0: lopper's default; at most 4x the hardware threads), got " +
                       std::to_string(threads));
    py::object bytes;
    std::string path;
    if (PyBytes_Check(path_or_bytes.ptr()) || PyByteArray_Check(path_or_bytes.ptr()) ||
        PyMemoryView_Check(path_or_bytes.ptr())) {
      bytes = py::reinterpret_steal<py::object>(PyBytes_FromObject(path_or_bytes.ptr()));
      if (!bytes) throw py::error_already_set();
    } else if (py::isinstance<py::str>(path_or_bytes) || py::hasattr(path_or_bytes, "__fspath__")) {
      path = path_of(path_or_bytes);
    } else {
      throw py::type_error(
          "[session] path_or_bytes must be a path (str or os.PathLike) or the model's bytes, got " +
          type_name(path_or_bytes));
    }
    (void)check_device(device);  // a bad spec is a ValueError, CUDA without a GPU a RuntimeError
    const char* data = bytes ? PyBytes_AS_STRING(bytes.ptr()) : nullptr;
    const size_t size = bytes ? static_cast<size_t>(PyBytes_GET_SIZE(bytes.ptr())) : 0;
    std::vector<std::string> warnings;
    {
      py::gil_scoped_release nogil;
      threads_ = threads > 0 ? threads : default_threads();
      ThreadsScope scope(threads_);
      model_ = std::make_unique<ir::Model>(bytes ? onnx::parse_model(data, size)
                                                 : onnx::load_model(path));
      warnings = load_warnings(*model_);
      ExecOptions opts;
      opts.device = device;
      opts.precision = precision;
      exec_ = std::make_unique<Executor>(*model_, opts);
    }
    for (const auto& w : warnings) warn("[session] " + (bytes ? std::string() : path + ": ") + w);
  }

  py::list run(const py::object& output_names, const py::object& input_feed,
               const py::object& run_options) {
    if (!run_options.is_none()) throw UsageError("[run] run_options is not supported (pass None)");
    if (!py::isinstance<py::dict>(input_feed))
      throw py::type_error("[run] input_feed must be a dict {input name: array}, got " +
                           type_name(input_feed));
    // Inputs: all numpy arrays (or what numpy.asarray takes), or all torch tensors.
    enum class Kind { kNone, kNumpy, kTorch } kind = Kind::kNone;
    NamedTensors feeds;
    for (auto [key, value] : input_feed.cast<py::dict>()) {
      if (!py::isinstance<py::str>(key))
        throw py::type_error("[run] input names must be str, got " + type_name(key));
      const auto name = key.cast<std::string>();
      const Kind k = THPVariable_Check(value.ptr()) ? Kind::kTorch : Kind::kNumpy;
      if (kind != Kind::kNone && k != kind)
        throw UsageError(
            "[run] input_feed mixes numpy arrays and torch tensors: pass one kind "
            "(the outputs come back as that kind)");
      kind = k;
      feeds.emplace_back(name, k == Kind::kTorch ? THPVariable_Unpack(value.ptr())
                                                 : tensor_from_array(value, name));
    }
    const auto names = exec_->output_names();
    std::vector<size_t> picks;
    if (output_names.is_none()) {
      for (size_t i = 0; i < names.size(); ++i) picks.push_back(i);
    } else {
      if (py::isinstance<py::str>(output_names) || !py::hasattr(output_names, "__iter__"))
        throw py::type_error("[run] output_names must be a list of output names or None, got " +
                             type_name(output_names));
      for (auto item : output_names) {
        if (!py::isinstance<py::str>(item))
          throw py::type_error("[run] output names must be str, got " + type_name(item));
        const auto name = item.cast<std::string>();
        size_t i = 0;
        while (i < names.size() && names[i] != name) ++i;
        if (i == names.size()) {
          std::string all;
          for (const auto& n : names) all += (all.empty() ? "'" : ", '") + n + "'";
          throw UsageError("[run] the model has no output named '" + name +
                           "' (its outputs: " + all + ")");
        }
        picks.push_back(i);
      }
    }

    std::vector<at::Tensor> outs;
    {
      py::gil_scoped_release nogil;
      // NOTE: a feed that does not match the model's inputs (a name it lacks, a missing input, a
      // dtype or static dim that differs) is the caller's argument: a ValueError, as ONNX
      // Runtime's InvalidArgument. What fails while the graph runs stays a RuntimeError.
      try {
        exec_->check_inputs(feeds);
      } catch (const Error& e) {
        throw UsageError(e.what());
      }
      std::lock_guard<std::mutex> lock(mutex_);
      ThreadsScope scope(threads_);
      std::vector<at::Tensor> all = exec_->run(feeds);
      // NOTE: outputs belong to the caller, as in ONNX Runtime. One that shares its memory with
      // anything else (an input, an initializer, another output, the same output asked twice) is
      // copied; the others are handed over as they are.
      std::vector<int> asked(all.size(), 0);
      for (size_t i : picks) ++asked[i];
      for (size_t i : picks) {
        at::Tensor t = all[i];
        if (t.defined()) {
          const bool alone = asked[i] == 1 && t.use_count() == 2 && t.storage().use_count() == 1;
          if (!alone) t = t.clone();
          if (kind == Kind::kTorch)
            t = as_ordinary_tensor(t);
          else if (!t.device().is_cpu())
            t = t.cpu();
        }
        outs.push_back(std::move(t));
      }
    }
    py::list result;
    for (auto& t : outs) {
      if (!t.defined())
        result.append(py::none());
      else if (kind == Kind::kTorch)
        result.append(py::cast(std::move(t)));
      else
        result.append(py::reinterpret_steal<py::object>(torch::utils::tensor_to_numpy(t)));
    }
    return result;
  }

  std::vector<NodeArg> inputs() const {
    std::vector<NodeArg> out;
    for (const auto* v : exec_->inputs()) out.push_back({v->name, v->type});
    return out;
  }
  std::vector<NodeArg> outputs() const {
    std::vector<NodeArg> out;
    for (const auto& v : model_->graph.outputs) out.push_back({v.name, v.type});
    return out;
  }
  std::string device() const { return exec_->device().str(); }
  int threads() const { return threads_; }

 private:
  std::unique_ptr<ir::Model> model_;  // the executor keeps a reference: declared first
  std::unique_ptr<Executor> exec_;
  int threads_ = 1;
  std::mutex mutex_;  // one run at a time per executor
};

}  // namespace

void bind_session(py::module_& m) {
  py::class_<NodeArg>(m, "NodeArg", R"doc(One input or output of a model, as ONNX Runtime's NodeArg.

Attributes:
    name (str): the value's name in the graph.
    type (str): its ONNX type, e.g. "tensor(float)", "tensor(int64)".
    shape (list): one entry per dimension: an int when static, the symbol's name (str) when
        dynamic (e.g. "batch"), None when unknown; [] when the model declares no shape.)doc")
      .def_readonly("name", &NodeArg::name, "The value's name in the graph (str).")
      .def_property_readonly("type", &NodeArg::type, "The ONNX type, e.g. \"tensor(float)\".")
      .def_property_readonly("shape", &NodeArg::shape,
                             "The dimensions: int (static), str (symbolic) or None (unknown).")
      .def("__repr__", [](const NodeArg& a) {
        return "NodeArg(name=" + py::repr(py::str(a.name)).cast<std::string>() + ", type='" +
               a.type() + "', shape=" + py::repr(a.shape()).cast<std::string>() + ")";
      });

  py::class_<Session>(m, "InferenceSession", R"doc(Runs an ONNX model with lopper's executor.

The call shape is ONNX Runtime's, so code written for onnxruntime.InferenceSession runs as is:

    sess = lopper.InferenceSession("model.onnx")
    (logits,) = sess.run(None, {"input": x})

lopper runs the graph on ATen (libtorch) with its own fusions, and picks per layer among BLAS,
oneDNN and its own sparse kernels by timing them on the first run, so a pruned model runs at
its sparse speed. The first run() is therefore slower than the ones after it.)doc")
      .def(py::init<const py::object&, const py::object&, const py::object&, const py::object&,
                    const py::object&, const py::object&, const py::object&>(),
           py::arg("path_or_bytes"), py::arg("sess_options") = py::none(),
           py::arg("providers") = py::none(), py::arg("provider_options") = py::none(),
           py::kw_only(), py::arg("device") = py::none(), py::arg("threads") = py::none(),
           py::arg("precision") = py::none(),
           R"doc(Loads a model and prepares it to run.

Args:
    path_or_bytes: the .onnx file (str or os.PathLike; external data is read from its folder),
        or the model's serialized bytes (bytes, bytearray or memoryview; no external data).
    sess_options: an onnxruntime.SessionOptions (or any object with intra_op_num_threads):
        its intra_op_num_threads is the thread count (0: lopper's default); the rest is
        onnxruntime's own and not read.
    providers: onnxruntime's provider list (names or (name, options) pairs, in order of
        preference): "CPUExecutionProvider" runs on the CPU, "CUDAExecutionProvider" on a GPU
        (its "device_id" option); the first is used; any other name is a ValueError.
    provider_options: one dict per provider (onnxruntime's), read for CUDA's device_id.
    device (str): "cpu" (default), "cuda" or "cuda:N".
    threads (int): intra-op threads each run() uses, at most 4x the hardware threads; 0
        (default) is lopper's default: the
        OMP_NUM_THREADS variable when set, else the cores idle when the session is made. The
        count applies while lopper works and is put back after (torch.get_num_threads() is the
        same process-wide pool).
    precision (str): "fp32" (default), "bf16" or "fp16" (CUDA only): the type the model
        computes in (its float weights converted once at load; inputs and outputs stay
        float32). On a CPU with AVX512_BF16 or AMX, bf16 runs oneDNN's bf16 kernels.

Raises:
    ValueError: a bad argument (threads outside 0..4x the hardware threads, a device that is
        not "cpu", "cuda" or "cuda:N", a provider lopper does not run, device and providers
        both given, a precision other than fp32, bf16 and fp16, fp16 on the CPU).
    TypeError: path_or_bytes is neither a path nor bytes.
    RuntimeError: the file or model cannot be read or run (an unsupported op, a missing file,
        corrupt bytes, "cuda" without a GPU), with lopper's one-line message.)doc")
      .def("run", &Session::run, py::arg("output_names"), py::arg("input_feed"),
           py::arg("run_options") = py::none(),
           R"doc(Runs the model and returns the outputs asked for.

Args:
    output_names: the names of the outputs to return, in that order (a list of str), or None
        for all of them in the model's order.
    input_feed (dict): {input name: value} for every input the model needs. Values are all
        numpy arrays (or anything numpy.asarray takes) or all torch tensors, of the dtype the
        model declares (float32 for "tensor(float)", int64 for "tensor(int64)", ...) and a shape
        that matches its static dimensions; dynamic ones (a batch size) take any size. They are
        read in place, never copied or changed (torch tensors on another device than the
        session's are moved to it).
    run_options: ONNX Runtime's RunOptions; only None is accepted.

Returns:
    list: one value per name asked for: numpy arrays when the inputs were numpy, torch tensors
    (on the session's device) when they were torch. They are the caller's: memory lopper made
    for them is handed over without a copy.

Raises:
    ValueError: a bad argument, with lopper's one line: an input or output name the model does
        not have, a missing input, a dtype or static dimension that differs from the model's,
        numpy and torch mixed, an array torch cannot view.
    TypeError: input_feed is not a dict, a name is not a str.
    RuntimeError: lopper's one line when the model fails while it runs on these inputs (e.g.
        dynamic dimensions that do not fit each other).)doc")
      .def("get_inputs", &Session::inputs,
           "The inputs a caller feeds (initializers excluded), as a list of NodeArg.")
      .def("get_outputs", &Session::outputs, "The model's outputs, as a list of NodeArg.")
      .def_property_readonly("device", &Session::device,
                             "The device the model runs on (str: \"cpu\", \"cuda:0\").")
      .def_property_readonly("threads", &Session::threads,
                             "The intra-op threads each run() uses (int).");
}

}  // namespace lopper::python
