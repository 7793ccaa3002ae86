// ir::Model -> ONNX ModelProto, written atomically (with external data when needed).
#include <ATen/ATen.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "lopper/error.h"
#include "lopper/files.h"
#include "lopper/onnx_io.h"
#include "onnx.pb.h"
#include "onnx/tensor_proto.h"

namespace lopper::onnx {
namespace {

using namespace lopper_onnx;

void fill_type(const ir::TypeInfo& t, TypeProto* p) {
  if (!t.is_tensor()) {
    if (!(t.raw.size() == 1 && t.raw[0] == '\0')) p->ParseFromString(t.raw);
    return;
  }
  auto* tt = p->mutable_tensor_type();
  if (t.elem_type != ir::DType::kUndefined) tt->set_elem_type(static_cast<int32_t>(t.elem_type));
  if (t.has_shape) {
    auto* shape = tt->mutable_shape();
    for (const auto& d : t.dims) {
      auto* pd = shape->add_dim();
      if (d.is_static())
        pd->set_dim_value(d.value);
      else if (!d.param.empty())
        pd->set_dim_param(d.param);
    }
  }
  if (!t.denotation.empty()) p->set_denotation(t.denotation);
}

void fill_value_info(const ir::ValueInfo& v, ValueInfoProto* p) {
  p->set_name(v.name);
  if (!v.doc_string.empty()) p->set_doc_string(v.doc_string);
  if (v.type.elem_type != ir::DType::kUndefined || v.type.has_shape || !v.type.is_tensor())
    fill_type(v.type, p->mutable_type());
}

template <typename Repeated>
void fill_props(const std::vector<std::pair<std::string, std::string>>& props, Repeated* out) {
  for (const auto& [k, v] : props) {
    auto* e = out->Add();
    e->set_key(k);
    e->set_value(v);
  }
}

// A top-level initializer written after the rest of the graph: its TensorProto without the bytes,
// and the tensor the bytes are streamed from (undefined when the proto holds them).
struct TailInit {
  TensorProto meta;
  at::Tensor data;
};

struct Writer {
  SaveOptions opts;
  // Set: the top graph's initializers go here instead of into the GraphProto (save_model streams
  // them), so no second copy of the weights is ever made.
  std::vector<TailInit>* tail = nullptr;
  bool sparse_all() const { return opts.sparse == SaveOptions::Sparse::kAll; }
  bool sparse_none() const { return opts.sparse == SaveOptions::Sparse::kNone; }

  void fill_graph(const ir::Graph& g, GraphProto* p, bool top = false) {
    p->set_name(g.name);
    if (!g.doc_string.empty()) p->set_doc_string(g.doc_string);
    fill_props(g.metadata_props, p->mutable_metadata_props());
    for (const auto& v : g.inputs) fill_value_info(v, p->add_input());
    for (const auto& v : g.outputs) fill_value_info(v, p->add_output());
    for (const auto& v : g.value_info) fill_value_info(v, p->add_value_info());
    for (const auto& init : g.initializers) {
      // ONNX sparse tensors need rank >= 1.
      bool sparse = !sparse_none() && (init.sparse || sparse_all()) &&
                    init.value.is_floating_point() && init.value.numel() > 0 &&
                    init.value.dim() > 0;
      if (sparse && sparse_all() && !init.sparse) {
        // Only when it makes the file smaller: each nonzero costs its value plus an int64 index
        // (fp32: worth it past 2/3 zeros).
        // (ATen's count_nonzero lacks the float8 types; their bytes tell zero from nonzero.)
        const at::Tensor& v = init.value;
        int64_t nnz = (at::isFloat8Type(v.scalar_type()) ? v.contiguous().view(at::kByte) : v)
                          .count_nonzero()
                          .item<int64_t>();
        int64_t elem = static_cast<int64_t>(v.element_size());
        sparse = nnz * (elem + 8) < v.numel() * elem;
      }
      if (sparse) {
        auto* s = p->add_sparse_initializer();
        tensor_to_sparse_proto(init.value, init.name, s);
        if (!init.doc_string.empty()) s->mutable_values()->set_doc_string(init.doc_string);
      } else if (top && tail) {
        TailInit ti;
        at::Tensor c = init.value.detach().cpu().contiguous();
        if (c.nbytes() >= 4096) {
          tensor_meta_to_proto(c, &ti.meta);
          ti.data = c;
        } else {
          tensor_to_proto(c, &ti.meta);
        }
        ti.meta.set_name(init.name);
        if (!init.doc_string.empty()) ti.meta.set_doc_string(init.doc_string);
        tail->push_back(std::move(ti));
      } else {
        auto* t = p->add_initializer();
        tensor_to_proto(init.value, t);
        t->set_name(init.name);
        if (!init.doc_string.empty()) t->set_doc_string(init.doc_string);
      }
    }
    for (const auto& n : g.nodes) {
      auto* pn = p->add_node();
      for (const auto& i : n.inputs) pn->add_input(i);
      for (const auto& o : n.outputs) pn->add_output(o);
      if (!n.name.empty()) pn->set_name(n.name);
      pn->set_op_type(n.op_type);
      if (!n.domain.empty()) pn->set_domain(n.domain);
      if (!n.doc_string.empty()) pn->set_doc_string(n.doc_string);
      fill_props(n.metadata_props, pn->mutable_metadata_props());
      for (const auto& a : n.attrs) fill_attribute(a, pn->add_attribute());
    }
  }

  void fill_attribute(const ir::Attribute& a, AttributeProto* p) {
    if (!a.raw.empty()) {
      p->ParseFromString(a.raw);
      return;
    }
    p->set_name(a.name);
    if (!a.ref_attr_name.empty()) p->set_ref_attr_name(a.ref_attr_name);
    if (!a.doc_string.empty()) p->set_doc_string(a.doc_string);
    p->set_type(static_cast<AttributeProto::AttributeType>(a.type));
    switch (a.type) {
      case ir::AttrType::kFloat:
        p->set_f(a.f);
        break;
      case ir::AttrType::kInt:
        p->set_i(a.i);
        break;
      case ir::AttrType::kString:
        p->set_s(a.s);
        break;
      case ir::AttrType::kTensor:
        tensor_to_proto(a.t, p->mutable_t());
        break;
      case ir::AttrType::kGraph:
        fill_graph(*a.g, p->mutable_g());
        break;
      case ir::AttrType::kFloats:
        for (float f : a.floats) p->add_floats(f);
        break;
      case ir::AttrType::kInts:
        for (int64_t i : a.ints) p->add_ints(i);
        break;
      case ir::AttrType::kStrings:
        for (const auto& s : a.strings) p->add_strings(s);
        break;
      case ir::AttrType::kTensors:
        for (const auto& t : a.tensors) tensor_to_proto(t, p->add_tensors());
        break;
      case ir::AttrType::kGraphs:
        for (const auto& g : a.graphs) fill_graph(*g, p->add_graphs());
        break;
      default:
        break;
    }
  }

  void fill_model(const ir::Model& m, ModelProto* p) {
    p->set_ir_version(m.ir_version);
    for (const auto& o : m.opset_import) {
      auto* op = p->add_opset_import();
      if (!o.domain.empty()) op->set_domain(o.domain);
      op->set_version(o.version);
    }
    if (!m.producer_name.empty()) p->set_producer_name(m.producer_name);
    if (!m.producer_version.empty()) p->set_producer_version(m.producer_version);
    if (!m.domain.empty()) p->set_domain(m.domain);
    if (m.model_version) p->set_model_version(m.model_version);
    if (!m.doc_string.empty()) p->set_doc_string(m.doc_string);
    fill_props(m.metadata_props, p->mutable_metadata_props());
    for (const auto& f : m.functions) p->add_functions()->ParseFromString(f);
    for (const auto& t : m.training_info) p->add_training_info()->ParseFromString(t);
    fill_graph(m.graph, p->mutable_graph(), /*top=*/true);
  }
};

// Appends `n` bytes to the external data file at the next 4 KiB boundary and points `t` at them.
void write_external(TensorProto* t, const void* bytes, size_t n, const std::string& location,
                    std::ofstream& data, uint64_t& offset) {
  // NOTE: 4 KiB alignment lets runtimes mmap tensors directly (ONNX Runtime does).
  uint64_t aligned = (offset + 4095) / 4096 * 4096;
  if (aligned > offset) {
    std::string pad(aligned - offset, '\0');
    data.write(pad.data(), static_cast<std::streamsize>(pad.size()));
  }
  data.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
  auto add = [&](const char* k, const std::string& v) {
    auto* e = t->add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  add("location", location);
  add("offset", std::to_string(aligned));
  add("length", std::to_string(n));
  offset = aligned + n;
  t->clear_raw_data();
  t->set_data_location(TensorProto::EXTERNAL);
}

// Moves every large dense initializer's bytes (in this graph and its subgraphs) into `data`.
void externalize(GraphProto* g, const std::string& location, size_t min_bytes, std::ofstream& data,
                 uint64_t& offset) {
  auto move_out = [&](TensorProto* t) {
    if (!t->has_raw_data() || t->raw_data().size() < min_bytes) return;
    std::string raw = std::move(*t->mutable_raw_data());
    write_external(t, raw.data(), raw.size(), location, data, offset);
  };
  for (auto& t : *g->mutable_initializer()) move_out(&t);
  for (auto& n : *g->mutable_node())
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) externalize(a.mutable_g(), location, min_bytes, data, offset);
      for (auto& sg : *a.mutable_graphs()) externalize(&sg, location, min_bytes, data, offset);
    }
}

size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) v >>= 7, ++n;
  return n;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Protobuf wire format: field number and wire type 2 (length-delimited).
constexpr uint8_t kModelGraph = 7 << 3 | 2, kGraphInitializer = 5 << 3 | 2,
                  kTensorRawData = 9 << 3 | 2;

// Bytes of one tail initializer as a GraphProto.initializer entry's payload.
size_t tail_size(const TailInit& t) {
  size_t n = t.meta.ByteSizeLong();
  if (t.data.defined()) n += 1 + varint_size(t.data.nbytes()) + t.data.nbytes();
  return n;
}

}  // namespace

std::string serialize_model(const ir::Model& model) {
  ModelProto p;
  Writer{}.fill_model(model, &p);
  LOPPER_CHECK(p.ByteSizeLong() <= static_cast<size_t>(INT_MAX),
               "[export] model is over 2 GB; save it with external data");
  return p.SerializeAsString();
}

// NOTE: the model is streamed to the file, never serialized into one buffer: the model proto
// without the top graph's initializers, then the graph field, whose payload is the rest of the
// graph followed by each initializer, its bytes written straight from the tensor. Protobuf parsers
// accept fields in any order, so this is the same message SerializeAsString would give, with the
// initializers after the nodes. Peak memory stays at the model itself (bench/prune_speed.py).
void save_model(const ir::Model& model, const std::string& path, const SaveOptions& opts) {
  OutputFiles out("export");
  save_model(model, path, opts, out);
  out.commit();
}

void save_model(const ir::Model& model, const std::string& path, const SaveOptions& opts,
                OutputFiles& files) {
  if (!files.declared(path)) files.declare(path, "-o");
  ModelProto p;
  std::vector<TailInit> tail;
  Writer{opts, &tail}.fill_model(model, &p);
  // NOTE: protobuf refuses messages over 2 GB; leave headroom for the graph itself.
  constexpr size_t kLimit = size_t(1) << 30 | size_t(1) << 29 | size_t(1) << 28;  // 1.75 GiB
  size_t total = p.ByteSizeLong();
  for (const auto& t : tail) total += 1 + varint_size(tail_size(t)) + tail_size(t);
  if (opts.mapped) {
    // The initializers that still view the mapped copy are references to it; the rest stay inside.
    total = p.ByteSizeLong();
    for (auto& t : tail) {
      const int64_t at = t.data.defined() ? opts.mapped->offset_of(t.data) : -1;
      if (at >= 0 && t.data.nbytes() > 0) {
        auto add = [&](const char* k, const std::string& v) {
          auto* e = t.meta.add_external_data();
          e->set_key(k);
          e->set_value(v);
        };
        add("location", opts.mapped_location);
        add("offset", std::to_string(at));
        add("length", std::to_string(t.data.nbytes()));
        t.meta.set_data_location(TensorProto::EXTERNAL);
        t.data = at::Tensor();
      }
      total += 1 + varint_size(tail_size(t)) + tail_size(t);
    }
    LOPPER_CHECK(total <= kLimit,
                 "[export] the initializers outside the mapped external data "
                 "push the model past 2 GB");
  }
  bool external = !opts.mapped && (opts.external_data || total > kLimit);
  std::string data_tmp, data_path;
  if (external) {
    std::filesystem::path mp(path);
    std::string location = mp.filename().string() + ".data";
    data_path = (mp.parent_path() / location).string();
    // NOTE: the external data file is an output too: one an input reads (another model's data
    // under this name) is refused here, before anything is written.
    if (!files.declared(data_path)) files.declare(data_path, "external data of " + path);
    data_tmp = files.temp(data_path);
    std::ofstream data(data_tmp, std::ios::binary | std::ios::trunc);
    LOPPER_CHECK(data.good(), "[export] cannot write '", data_path, "'");
    uint64_t offset = 0;
    for (auto& t : tail) {
      if (t.data.defined() && t.data.nbytes() >= opts.external_min_bytes) {
        write_external(&t.meta, t.data.data_ptr(), t.data.nbytes(), location, data, offset);
        t.data = at::Tensor();
      } else if (!t.data.defined() && t.meta.raw_data().size() >= opts.external_min_bytes) {
        std::string raw = std::move(*t.meta.mutable_raw_data());
        write_external(&t.meta, raw.data(), raw.size(), location, data, offset);
      }
    }
    externalize(p.mutable_graph(), location, opts.external_min_bytes, data, offset);
    data.flush();
    LOPPER_CHECK(data.good(), "[export] cannot write '", data_path, "'");
  }
  std::unique_ptr<GraphProto> graph(p.release_graph());
  std::string head = p.SerializeAsString(), body = graph->SerializeAsString();
  size_t graph_len = body.size();
  for (const auto& t : tail) graph_len += 1 + varint_size(tail_size(t)) + tail_size(t);
  LOPPER_CHECK(head.size() + graph_len <= static_cast<size_t>(INT_MAX),
               "[export] the graph alone is over 2 GB");
  std::string tmp = files.temp(path);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    LOPPER_CHECK(out.good(), "[export] cannot write '", path, "': ", std::strerror(errno));
    auto put = [&](const void* b, size_t n) {
      out.write(static_cast<const char*>(b), static_cast<std::streamsize>(n));
    };
    std::string buf = head;
    buf.push_back(static_cast<char>(kModelGraph));
    put_varint(buf, graph_len);
    buf += body;
    put(buf.data(), buf.size());
    for (const auto& t : tail) {
      buf.clear();
      buf.push_back(static_cast<char>(kGraphInitializer));
      put_varint(buf, tail_size(t));
      t.meta.AppendToString(&buf);
      if (t.data.defined()) {
        buf.push_back(static_cast<char>(kTensorRawData));
        put_varint(buf, t.data.nbytes());
      }
      put(buf.data(), buf.size());
      if (t.data.defined()) put(t.data.data_ptr(), t.data.nbytes());
    }
    out.flush();
    LOPPER_CHECK(out.good(), "[export] cannot write '", path, "': ", std::strerror(errno));
  }
}

void save_tensor_pb(const at::Tensor& t, const std::string& path, const std::string& name) {
  TensorProto p;
  tensor_to_proto(t, &p);
  if (!name.empty()) p.set_name(name);
  write_file_atomic(path, p.SerializeAsString());
}

}  // namespace lopper::onnx
