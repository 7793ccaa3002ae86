// The text tables and the JSON of the pruning reports name a layer by its PyTorch parameter where
// the model tells it (else by its node), keep the name column fitted, and say which readers share
// a weight: a tied embedding left alone, or pruned with it.
#include <gtest/gtest.h>

#include <sstream>

#include "lopper/prune.h"
#include "lopper/report.h"
#include "lopper/structured.h"
#include "lopper/target.h"

using namespace lopper;

namespace {

PruneLayerReport layer(const std::string& name, const std::string& weight,
                       const std::string& param) {
  PruneLayerReport l;
  l.name = name;
  l.op = "MatMul";
  l.weight = weight;
  l.param = param;
  l.params = 100;
  l.nonzero_before = 100;
  l.nonzero_after = 50;
  l.method = "l1";
  l.amount = "0.5";
  return l;
}

// The table's rows, header first.
std::vector<std::string> rows(const std::string& table) {
  std::vector<std::string> out;
  std::istringstream in(table);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

TEST(PruneTable, NamesLayersByParameterAndSaysWhatSharesAWeight) {
  PruneReport r;
  r.layers.push_back(layer("node_MatMul_58", "val_59", "m.encoder.layer.0.query.weight"));
  r.layers.push_back(layer("/m/lm_head/MatMul", "onnx::MatMul_528", ""));
  PruneLayerReport tied = layer("node_linear", "m.lm_head.weight", "m.lm_head.weight");
  tied.shared = {{"node_embedding", "Gather", "m.transformer.wte", "embedding"}};
  r.layers.push_back(tied);
  PruneLayerReport skipped = tied;
  skipped.nonzero_after = 100;
  skipped.skipped = "tied with embedding 'm.transformer.wte' (Gather): ...";
  r.layers.push_back(skipped);

  const std::vector<std::string> t = rows(to_table(r));
  ASSERT_GE(t.size(), 5u);
  EXPECT_EQ(t[1].rfind("m.encoder.layer.0.query.weight  ", 0), 0u) << t[1];
  EXPECT_EQ(t[2].rfind("/m/lm_head/MatMul  ", 0), 0u) << t[2];  // no parameter name: the node's
  EXPECT_NE(t[3].find("l1 0.5  [shared with embedding 'm.transformer.wte' (Gather)]"),
            std::string::npos)
      << t[3];
  EXPECT_NE(t[4].find("skipped: tied with embedding"), std::string::npos) << t[4];
  EXPECT_EQ(t[4].find("[shared with"), std::string::npos) << t[4];
  // One column width for every row: the op column starts at the same place.
  const size_t op = t[1].find("  MatMul");
  for (size_t i = 2; i <= 4; ++i) EXPECT_EQ(t[i].find("  MatMul"), op) << t[i];

  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j["layers"][0]["name"], "node_MatMul_58");
  EXPECT_EQ(j["layers"][0]["weight"], "val_59");
  EXPECT_EQ(j["layers"][0]["param"], "m.encoder.layer.0.query.weight");
  EXPECT_EQ(j["layers"][1]["param"], "");
  EXPECT_FALSE(j["layers"][1].contains("shared"));
  EXPECT_EQ(j["layers"][2]["shared"],
            nlohmann::json::parse(R"([{"node": "node_embedding", "op": "Gather", "use":
                                  "embedding", "module": "m.transformer.wte"}])"));
}

TEST(PruneTable, LongNamesAreCutFromTheLeft) {
  PruneReport r;
  const std::string longest(60, 'x');
  r.layers.push_back(layer("n", "w", longest + ".weight"));
  const std::vector<std::string> t = rows(to_table(r));
  EXPECT_EQ(t[1].rfind("…" + std::string(40, 'x') + ".weight  ", 0), 0u) << t[1];
  EXPECT_EQ(name_column_width({longest}, 5), 48u);
}

TEST(StructuredTable, ListsLayersByParameter) {
  StructuredReport r;
  ChannelGroupReport g;
  g.kind = "channel";
  g.layers = {"node_addmm_2", "node_gelu", "node_addmm_3"};
  g.layer_params = {"m.h.0.mlp.c_fc.weight", "", "m.h.0.mlp.c_proj.weight"};
  g.size_before = 256, g.size_after = 179;
  r.groups.push_back(g);
  const std::string t = to_table(r);
  EXPECT_NE(t.find("m.h.0.mlp.c_fc.weight, node_gelu, m.h.0.mlp.c_proj.weight"), std::string::npos)
      << t;
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j["groups"][0]["layers"][0], "node_addmm_2");
  EXPECT_EQ(j["groups"][0]["layer_params"][2], "m.h.0.mlp.c_proj.weight");
  EXPECT_EQ(g.layer_label(1), "node_gelu");
}

TEST(TargetTable, NamesUnitsByParameter) {
  TargetReport r;
  TargetUnit a;
  a.name = "node_MatMul_58";
  a.param = "m.encoder.layer.0.query.weight";
  a.weight = "val_59";
  a.amount = 0.5;
  TargetUnit b;
  b.name = "/fc/Gemm";
  b.amount = 0.25;
  r.units = {a, b};
  const std::vector<std::string> t = rows(to_table(r, false, false));
  EXPECT_EQ(t[1].rfind("m.encoder.layer.0.query.weight  ", 0), 0u) << t[1];
  EXPECT_EQ(t[2].rfind("/fc/Gemm  ", 0), 0u) << t[2];
  const nlohmann::json j = to_json(r, false);
  EXPECT_EQ(j["layers"][0]["param"], "m.encoder.layer.0.query.weight");
  EXPECT_FALSE(j["layers"][1].contains("param"));
}
