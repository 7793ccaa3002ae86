// oneDNN's convolution and matrix-product primitives through its C API, the library loaded on
// demand (see primitives.h).
#include "dnnl/primitives.h"

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <utility>
#include <vector>

namespace lopper::dnnl {
namespace {

// The C functions lopper calls, looked up in the loaded library (never linked: lopper builds and
// runs without it). decltype of the header's declarations keeps the signatures exact.
// clang-format off
#define LOPPER_DNNL_FUNCTIONS(X)                                                          \
  X(dnnl_version)                                                                         \
  X(dnnl_engine_create)                                                                   \
  X(dnnl_stream_create)                                                                   \
  X(dnnl_stream_destroy)                                                                  \
  X(dnnl_memory_desc_create_with_tag)                                                     \
  X(dnnl_memory_desc_create_with_strides)                                                 \
  X(dnnl_memory_desc_destroy)                                                             \
  X(dnnl_memory_desc_get_size)                                                            \
  X(dnnl_primitive_attr_create)                                                           \
  X(dnnl_primitive_attr_destroy)                                                          \
  X(dnnl_primitive_attr_set_scratchpad_mode)                                              \
  X(dnnl_primitive_attr_set_post_ops)                                                     \
  X(dnnl_post_ops_create)                                                                 \
  X(dnnl_post_ops_destroy)                                                                \
  X(dnnl_post_ops_append_eltwise)                                                         \
  X(dnnl_post_ops_append_binary)                                                          \
  X(dnnl_convolution_forward_primitive_desc_create)                                       \
  X(dnnl_matmul_primitive_desc_create)                                                    \
  X(dnnl_reorder_primitive_desc_create)                                                   \
  X(dnnl_primitive_desc_query)                                                            \
  X(dnnl_primitive_desc_query_md)                                                         \
  X(dnnl_primitive_desc_destroy)                                                          \
  X(dnnl_primitive_create)                                                                \
  X(dnnl_primitive_execute)                                                               \
  X(dnnl_primitive_destroy)                                                               \
  X(dnnl_memory_create)                                                                   \
  X(dnnl_memory_destroy)
// clang-format on

struct Api {
#define LOPPER_DNNL_FIELD(f) decltype(&::f) f = nullptr;
  LOPPER_DNNL_FUNCTIONS(LOPPER_DNNL_FIELD)
#undef LOPPER_DNNL_FIELD
  dnnl_engine_t engine = nullptr;
  std::string error;  // why the library is not usable ("" when it is)
};

// Where the wheel puts the library, from the folder of a loaded libgomp: the venv's lib/ beside
// lib/pythonX.Y/site-packages/torch/lib/libgomp.so.1.
std::string beside_libgomp() {
  void* sym = dlsym(RTLD_DEFAULT, "omp_get_max_threads");
  Dl_info info{};
  if (!sym || !dladdr(sym, &info) || !info.dli_fname) return "";
  namespace fs = std::filesystem;
  const fs::path lib = fs::path(info.dli_fname).parent_path() / "../../../../libdnnl.so.3";
  return fs::exists(lib) ? lib.lexically_normal().string() : "";
}

Api load() {
  Api api;
  std::vector<std::string> paths;
  if (const char* env = std::getenv("LOPPER_DNNL_LIBRARY"); env && *env) {
    if (std::string(env) == "off") {
      api.error = "LOPPER_DNNL_LIBRARY=off";
      return api;
    }
    paths.push_back(env);
  } else {
#ifdef LOPPER_DNNL_BUILD_LIBRARY
    paths.push_back(LOPPER_DNNL_BUILD_LIBRARY);
#endif
    paths.push_back(beside_libgomp());
    paths.push_back("libdnnl.so.3");
  }
  void* handle = nullptr;
  std::string tried;
  for (const auto& p : paths) {
    if (p.empty()) continue;
    handle = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) break;
    tried += (tried.empty() ? "" : "; ") + std::string(dlerror());
  }
  if (!handle) {
    api.error = "oneDNN's library (the onednn-cpu-gomp wheel) could not be loaded: " + tried;
    return api;
  }
#define LOPPER_DNNL_LOOKUP(f)                                  \
  api.f = reinterpret_cast<decltype(&::f)>(dlsym(handle, #f)); \
  if (!api.f) {                                                \
    api.error = "oneDNN's library lacks " #f;                  \
    return api;                                                \
  }
  LOPPER_DNNL_FUNCTIONS(LOPPER_DNNL_LOOKUP)
#undef LOPPER_DNNL_LOOKUP
  const dnnl_version_t* v = api.dnnl_version();
  // NOTE: an OpenMP build shares the libgomp libtorch loaded (one thread pool, lopper's thread
  // count); a TBB or threadpool build would run a second pool beside it.
  if (v->major != 3 || v->cpu_runtime != DNNL_RUNTIME_OMP) {
    api.error = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) +
                " is not a 3.x build on OpenMP";
    return api;
  }
  if (api.dnnl_engine_create(&api.engine, dnnl_cpu, 0) != dnnl_success)
    api.error = "oneDNN made no CPU engine";
  return api;
}

const Api& api() {
  static const Api a = load();
  return a;
}

void check(dnnl_status_t s, const char* what) {
  if (s != dnnl_success)
    throw std::runtime_error(std::string("oneDNN: ") + what + " failed (status " +
                             std::to_string(int(s)) + ")");
}

// A memory descriptor destroyed with its owner.
struct Md {
  dnnl_memory_desc_t md = nullptr;
  Md() = default;
  Md(std::initializer_list<int64_t> dims, dnnl_data_type_t type, dnnl_format_tag_t tag) {
    dnnl_dims_t d{};
    int n = 0;
    for (int64_t x : dims) d[n++] = x;
    check(api().dnnl_memory_desc_create_with_tag(&md, n, d, type, tag), "a memory descriptor");
  }
  // dims at element strides (a plain layout, any order)
  Md(std::initializer_list<int64_t> dims, dnnl_data_type_t type,
     std::initializer_list<int64_t> strides) {
    dnnl_dims_t d{}, st{};
    int n = 0;
    for (int64_t x : dims) d[n++] = x;
    n = 0;
    for (int64_t x : strides) st[n++] = x;
    check(api().dnnl_memory_desc_create_with_strides(&md, n, d, type, st), "a memory descriptor");
  }
  Md(Md&& o) noexcept : md(std::exchange(o.md, nullptr)) {}
  Md& operator=(Md&& o) noexcept {
    std::swap(md, o.md);
    return *this;
  }
  ~Md() {
    if (md) api().dnnl_memory_desc_destroy(md);
  }
};

// A memory object over a buffer (or one oneDNN allocates, handle DNNL_MEMORY_ALLOCATE).
struct Mem {
  dnnl_memory_t m = nullptr;
  Mem(const_dnnl_memory_desc_t md, void* handle) {
    check(api().dnnl_memory_create(&m, md, api().engine, handle), "a memory object");
  }
  ~Mem() {
    if (m) api().dnnl_memory_destroy(m);
  }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;
};

dnnl_stream_t thread_stream() {
  // The CPU stream runs a primitive on the calling thread: one per thread, made on first use.
  struct Stream {
    dnnl_stream_t s = nullptr;
    Stream() {
      check(api().dnnl_stream_create(&s, api().engine, dnnl_stream_default_flags), "a stream");
    }
    ~Stream() {
      if (s) api().dnnl_stream_destroy(s);
    }
  };
  thread_local Stream stream;
  return stream.s;
}

dnnl_alg_kind_t eltwise_alg(Eltwise e) {
  switch (e) {
    case Eltwise::kLeakyRelu:
      return dnnl_eltwise_relu;
    case Eltwise::kLogistic:
      return dnnl_eltwise_logistic;
    case Eltwise::kTanh:
      return dnnl_eltwise_tanh;
    case Eltwise::kGeluErf:
      return dnnl_eltwise_gelu_erf;
    case Eltwise::kGeluTanh:
      return dnnl_eltwise_gelu_tanh;
    case Eltwise::kHardswish:
      return dnnl_eltwise_hardswish;
    case Eltwise::kSwish:
      return dnnl_eltwise_swish;
    case Eltwise::kNone:
      break;
  }
  return dnnl_alg_kind_undef;
}

// Attributes owned: a user scratchpad, then the residual's add (src1 not null) and the activation.
struct Attr {
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t ops = nullptr;
  Attr(const_dnnl_memory_desc_t src1, Eltwise act, float slope) {
    const Api& a = api();
    check(a.dnnl_post_ops_create(&ops), "post-ops");
    check(a.dnnl_primitive_attr_create(&attr), "attributes");
    if (src1) check(a.dnnl_post_ops_append_binary(ops, dnnl_binary_add, src1), "the residual add");
    if (act != Eltwise::kNone) {
      float alpha = 0.f, beta = 0.f;
      if (act == Eltwise::kLeakyRelu) alpha = slope;
      if (act == Eltwise::kSwish) alpha = 1.f;
      if (act == Eltwise::kHardswish) alpha = 1.f / 6.f, beta = 0.5f;
      check(a.dnnl_post_ops_append_eltwise(ops, eltwise_alg(act), alpha, beta), "the activation");
    }
    check(a.dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad");
    check(a.dnnl_primitive_attr_set_post_ops(attr, ops), "post-ops");
  }
  ~Attr() {
    if (attr) api().dnnl_primitive_attr_destroy(attr);
    if (ops) api().dnnl_post_ops_destroy(ops);
  }
  Attr(const Attr&) = delete;
  Attr& operator=(const Attr&) = delete;
};

// A primitive: its descriptor and itself (a primitive without weights of its own as it is).
struct Plain {
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_primitive_t prim = nullptr;
  Plain() = default;
  Plain(const Plain&) = delete;
  Plain& operator=(const Plain&) = delete;
  ~Plain() {
    if (prim) api().dnnl_primitive_destroy(prim);
    if (pd) api().dnnl_primitive_desc_destroy(pd);
  }
  std::string finish() {
    const char* impl = nullptr;
    std::string name;
    if (api().dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
        impl)
      name = impl;
    check(api().dnnl_primitive_create(&prim, pd), "the primitive");
    return name;
  }
  size_t scratchpad_bytes() const {
    return api().dnnl_memory_desc_get_size(
        api().dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
  }
  // dst = src . weights, memory over the caller's buffers.
  void run(const Md& src_md, const void* src, const Md& w_md, const void* w, const Md& dst_md,
           void* dst, void* scratch, const char* what) const {
    const Api& a = api();
    Mem s(src_md.md, const_cast<void*>(src)), wm(w_md.md, const_cast<void*>(w)), d(dst_md.md, dst);
    Mem pad(a.dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0), scratch);
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, s.m},
                                    {DNNL_ARG_WEIGHTS, wm.m},
                                    {DNNL_ARG_DST, d.m},
                                    {DNNL_ARG_SCRATCHPAD, pad.m}};
    check(a.dnnl_primitive_execute(prim, thread_stream(), 4, args), what);
  }
};

// A convolution's or a linear layer's primitive: beside the primitive, the weight reordered into
// the layout it reads and a copy of the bias (its run reads those, not the caller's).
struct Held : Plain {
  std::vector<uint8_t> bias_bytes;
  std::unique_ptr<Mem> weights, bias;
  // After pd is made: the primitive, the implementation's name, the weight (plain in `plain`)
  // reordered once, the bias (`bytes` of it, plain as the primitive reads it) copied.
  std::string finish(const Md& plain, const void* weight, const Md& bias_md, const void* b,
                     size_t bytes) {
    const Api& a = api();
    const std::string name = Plain::finish();
    const_dnnl_memory_desc_t w_md = a.dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    weights = std::make_unique<Mem>(w_md, DNNL_MEMORY_ALLOCATE);
    Mem from(plain.md, const_cast<void*>(weight));
    dnnl_primitive_desc_t rpd = nullptr;
    check(a.dnnl_reorder_primitive_desc_create(&rpd, plain.md, a.engine, w_md, a.engine, nullptr),
          "the weight's reorder");
    dnnl_primitive_t reorder = nullptr;
    const dnnl_status_t made = a.dnnl_primitive_create(&reorder, rpd);
    a.dnnl_primitive_desc_destroy(rpd);
    check(made, "the weight's reorder");
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, from.m}, {DNNL_ARG_TO, weights->m}};
    const dnnl_status_t ran = a.dnnl_primitive_execute(reorder, thread_stream(), 2, args);
    a.dnnl_primitive_destroy(reorder);
    check(ran, "the weight's reorder");
    if (b) {
      bias_bytes.assign(static_cast<const uint8_t*>(b), static_cast<const uint8_t*>(b) + bytes);
      bias = std::make_unique<Mem>(bias_md.md, bias_bytes.data());
    }
    return name;
  }
  // Runs the primitive on src -> dst (memory over the caller's buffers), plus any extra argument.
  void run(const Md& src_md, const void* x, const Md& dst_md, void* y, void* scratch,
           const Md* src1_md, const void* src1, const char* what) const {
    const Api& a = api();
    Mem src(src_md.md, const_cast<void*>(x)), dst(dst_md.md, y);
    Mem pad(a.dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0), scratch);
    dnnl_exec_arg_t args[6] = {{DNNL_ARG_SRC, src.m},
                               {DNNL_ARG_WEIGHTS, weights->m},
                               {DNNL_ARG_DST, dst.m},
                               {DNNL_ARG_SCRATCHPAD, pad.m}};
    int n = 4;
    if (bias) args[n++] = {DNNL_ARG_BIAS, bias->m};
    std::unique_ptr<Mem> other;
    if (src1_md) {
      other = std::make_unique<Mem>(src1_md->md, const_cast<void*>(src1));
      args[n++] = {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, other->m};
    }
    check(a.dnnl_primitive_execute(prim, thread_stream(), n, args), what);
  }
};

}  // namespace

bool available() { return api().error.empty(); }
std::string unavailable_reason() { return api().error; }

struct Conv::Impl {
  Md src, dst, bias_md, src1;
  Held held;
};

Conv::Conv(const ConvSpec& s, const void* weight, const void* bias)
    : spec_(s), p_(std::make_unique<Impl>()) {
  if (!available()) throw std::runtime_error(unavailable_reason());
  const Api& a = api();
  const dnnl_data_type_t type = s.bf16 ? dnnl_bf16 : dnnl_f32;
  const int64_t oh = s.out_h(), ow = s.out_w();
  if (s.groups < 1 || s.c % s.groups || s.k % s.groups || oh < 1 || ow < 1)
    throw std::runtime_error("oneDNN: an inconsistent convolution shape");
  Impl& p = *p_;
  p.src = Md({s.n, s.c, s.h, s.w}, type, dnnl_acdb);
  p.dst = Md({s.n, s.k, oh, ow}, type, dnnl_acdb);
  const bool grouped = s.groups > 1;
  Md w_any = grouped ? Md({s.groups, s.k / s.groups, s.c / s.groups, s.kh, s.kw}, type,
                          dnnl_format_tag_any)
                     : Md({s.k, s.c, s.kh, s.kw}, type, dnnl_format_tag_any);
  Md w_plain = grouped
                   ? Md({s.groups, s.k / s.groups, s.c / s.groups, s.kh, s.kw}, type, dnnl_abcde)
                   : Md({s.k, s.c, s.kh, s.kw}, type, dnnl_abcd);
  if (s.bias) p.bias_md = Md({s.k}, type, dnnl_a);
  if (s.residual) p.src1 = Md({s.n, s.k, oh, ow}, type, dnnl_acdb);
  const Attr attr(s.residual ? p.src1.md : nullptr, s.act, s.alpha);
  const dnnl_dims_t strides{s.sh, s.sw}, dilates{s.dh - 1, s.dw - 1}, pad_l{s.ph, s.pw};
  // the right and bottom padding that gives the output size (floor division, as ONNX)
  const dnnl_dims_t pad_r{(oh - 1) * s.sh + (s.kh - 1) * s.dh + 1 - s.h - s.ph,
                          (ow - 1) * s.sw + (s.kw - 1) * s.dw + 1 - s.w - s.pw};
  check(
      a.dnnl_convolution_forward_primitive_desc_create(
          &p.held.pd, a.engine, dnnl_forward_inference, dnnl_convolution_direct, p.src.md, w_any.md,
          s.bias ? p.bias_md.md : nullptr, p.dst.md, strides, dilates, pad_l, pad_r, attr.attr),
      "a convolution primitive for this layer");
  impl_ = p.held.finish(w_plain, weight, p.bias_md, s.bias ? bias : nullptr,
                        size_t(s.k) * (s.bf16 ? 2 : 4));
}

Conv::~Conv() = default;

size_t Conv::scratchpad_bytes() const { return p_->held.scratchpad_bytes(); }

void Conv::run(const void* x, const void* residual, void* y, void* scratch) const {
  p_->held.run(p_->src, x, p_->dst, y, scratch, spec_.residual ? &p_->src1 : nullptr, residual,
               "the convolution");
}

struct Linear::Impl {
  Md src, dst, bias_md;
  Held held;
};

Linear::Linear(const LinearSpec& s, const void* weight, const void* bias)
    : spec_(s), p_(std::make_unique<Impl>()) {
  if (!available()) throw std::runtime_error(unavailable_reason());
  if (s.m < 1 || s.k < 1 || s.n < 1) throw std::runtime_error("oneDNN: an empty matrix product");
  const Api& a = api();
  const dnnl_data_type_t type = s.bf16 ? dnnl_bf16 : dnnl_f32;
  Impl& p = *p_;
  p.src = Md({s.m, s.k}, type, dnnl_ab);
  p.dst = Md({s.m, s.n}, type, dnnl_ab);
  // w [n, k] row-major is w^T [k, n] with its columns contiguous: tag ba
  Md w_any({s.k, s.n}, type, dnnl_format_tag_any), w_plain({s.k, s.n}, type, dnnl_ba);
  if (s.bias) p.bias_md = Md({1, s.n}, type, dnnl_ab);
  const Attr attr(nullptr, s.act, s.alpha);
  check(a.dnnl_matmul_primitive_desc_create(&p.held.pd, a.engine, p.src.md, w_any.md,
                                            s.bias ? p.bias_md.md : nullptr, p.dst.md, attr.attr),
        "a matrix-product primitive for this layer");
  impl_ = p.held.finish(w_plain, weight, p.bias_md, s.bias ? bias : nullptr,
                        size_t(s.n) * (s.bf16 ? 2 : 4));
}

Linear::~Linear() = default;

size_t Linear::scratchpad_bytes() const { return p_->held.scratchpad_bytes(); }

void Linear::run(const void* x, void* y, void* scratch) const {
  p_->held.run(p_->src, x, p_->dst, y, scratch, nullptr, nullptr, "the matrix product");
}

struct AttentionProducts::Impl {
  Md q, kt, s, p, v, y;
  Plain first, second;
};

AttentionProducts::AttentionProducts(const AttentionSpec& s)
    : spec_(s), p_(std::make_unique<Impl>()) {
  if (!available()) throw std::runtime_error(unavailable_reason());
  if (s.heads < 1 || s.sq < 1 || s.sk < 1 || s.d < 1 || s.dv < 1)
    throw std::runtime_error("oneDNN: an empty attention");
  const Api& a = api();
  const dnnl_data_type_t type = s.bf16 ? dnnl_bf16 : dnnl_f32;
  Impl& p = *p_;
  const int64_t h = s.heads, hd = h * s.d, hdv = h * s.dv;
  // NOTE: 4-D with a leading 1: oneDNN's brgemm matmul takes the heads of a row side by side only
  // so (3-D views at the same strides fall back to its older gemm, never AMX).
  p.q = Md({1, h, s.sq, s.d}, type, {s.sq * hd, s.d, hd, 1});
  p.kt = Md({1, h, s.d, s.sk}, type, {s.sk * hd, s.d, 1, hd});  // K [sk, h, d] read transposed
  p.s = Md({1, h, s.sq, s.sk}, dnnl_f32, dnnl_abcd);
  p.p = Md({1, h, s.sq, s.sk}, type, dnnl_abcd);
  p.v = Md({1, h, s.sk, s.dv}, type, {s.sk * hdv, s.dv, hdv, 1});
  p.y = Md({1, h, s.sq, s.dv}, type, {s.sq * hdv, s.dv, hdv, 1});
  const Attr attr(nullptr, Eltwise::kNone, 0.f);
  check(a.dnnl_matmul_primitive_desc_create(&p.first.pd, a.engine, p.q.md, p.kt.md, nullptr, p.s.md,
                                            attr.attr),
        "a matrix-product primitive for the attention's scores");
  check(a.dnnl_matmul_primitive_desc_create(&p.second.pd, a.engine, p.p.md, p.v.md, nullptr, p.y.md,
                                            attr.attr),
        "a matrix-product primitive for the attention's output");
  impl_ = p.first.finish() + " / " + p.second.finish();
}

AttentionProducts::~AttentionProducts() = default;

size_t AttentionProducts::scratchpad_bytes() const {
  return std::max(p_->first.scratchpad_bytes(), p_->second.scratchpad_bytes());
}

void AttentionProducts::scores(const void* q, const void* k, float* scores, void* scratch) const {
  p_->first.run(p_->q, q, p_->kt, k, p_->s, scores, scratch, "the attention's scores");
}

void AttentionProducts::output(const void* p, const void* v, void* y, void* scratch) const {
  p_->second.run(p_->p, p, p_->v, v, p_->y, y, scratch, "the attention's output");
}

}  // namespace lopper::dnnl
