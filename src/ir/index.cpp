#include "ir/index.h"

#include <algorithm>

namespace lopper::ir {

namespace {
const std::vector<size_t> kNone;
}

void GraphIndex::rebuild() {
  producer_.clear(), initializer_.clear(), readers_.clear(), uses_.clear();
  outputs_.clear(), names_.clear();
  for (const auto& v : g_->inputs) names_.insert(v.name);
  for (size_t i = 0; i < g_->initializers.size(); ++i) add_initializer(i);
  for (size_t i = 0; i < g_->nodes.size(); ++i) add_node(i);
  for (const auto& o : g_->outputs) outputs_.insert(o.name), ++uses_[o.name];
}

void GraphIndex::read(size_t node, const std::string& value) {
  ++uses_[value];
  auto& r = readers_[value];
  if (r.empty() || r.back() != node) r.push_back(node);
}

void GraphIndex::add_node(size_t i) {
  const Node& n = g_->nodes[i];
  names_.insert(n.name);
  for (const auto& o : n.outputs)
    if (!o.empty()) producer_.emplace(o, i), names_.insert(o);
  for (const auto& r : node_reads(n)) read(i, r);
}

void GraphIndex::remove_node(size_t i) {
  const Node& n = g_->nodes[i];
  for (const auto& o : n.outputs)
    if (auto p = producer_.find(o); p != producer_.end() && p->second == i) producer_.erase(p);
  for (const auto& value : node_reads(n)) {
    if (auto u = uses_.find(value); u != uses_.end() && u->second > 0) --u->second;
    auto& r = readers_[value];
    r.erase(std::remove(r.begin(), r.end(), i), r.end());
  }
}

void GraphIndex::add_initializer(size_t i) {
  const std::string& name = g_->initializers[i].name;
  initializer_.emplace(name, i);  // the first of a name, as Graph::find_initializer
  names_.insert(name);
}

void GraphIndex::set_input(size_t node, const std::string& before, const std::string& after) {
  if (!before.empty()) {
    if (auto u = uses_.find(before); u != uses_.end() && u->second > 0) --u->second;
    const auto reads = node_reads(g_->nodes[node]);
    if (std::find(reads.begin(), reads.end(), before) == reads.end()) {
      auto& r = readers_[before];
      r.erase(std::remove(r.begin(), r.end(), node), r.end());
    }
  }
  if (!after.empty()) {
    ++uses_[after];
    auto& r = readers_[after];
    if (std::find(r.begin(), r.end(), node) == r.end()) r.push_back(node);
  }
}

size_t GraphIndex::producer(const std::string& value) const {
  auto it = producer_.find(value);
  return it == producer_.end() ? npos : it->second;
}

const std::vector<size_t>& GraphIndex::readers(const std::string& value) const {
  auto it = readers_.find(value);
  return it == readers_.end() ? kNone : it->second;
}

size_t GraphIndex::uses(const std::string& value) const {
  auto it = uses_.find(value);
  return it == uses_.end() ? 0 : it->second;
}

size_t GraphIndex::initializer(const std::string& name) const {
  auto it = initializer_.find(name);
  return it == initializer_.end() ? npos : it->second;
}

bool GraphIndex::taken(const std::string& name) const { return names_.count(name) > 0; }

}  // namespace lopper::ir
