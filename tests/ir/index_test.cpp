// ir::GraphIndex (src/ir/index.h): producers, readers, uses and initializers by name agree with a
// scan of the graph, before and after the changes a pass records.
#include "ir/index.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "test_models.h"

using namespace lopper;
using namespace lopper::test;

namespace {

// x -> MatMul(W) -> h -> Relu -> y, and h read twice by an Add (h + h) -> z.
ir::Graph graph() {
  ir::Graph g;
  g.inputs = {value_info("x", {1, 4})};
  g.outputs = {value_info("y", {1, 4}), value_info("z", {1, 4})};
  g.initializers.push_back({"W", at::ones({4, 4}), "", false});
  g.nodes = {node("MatMul", {"x", "W"}, {"h"}, "mm"), node("Relu", {"h"}, {"y"}, "relu"),
             node("Add", {"h", "h"}, {"z"}, "add")};
  return g;
}

}  // namespace

TEST(GraphIndex, AnswersAsAScanOfTheGraph) {
  const ir::Graph g = graph();
  const ir::GraphIndex ix(g);
  EXPECT_EQ(ix.producer("h"), 0u);
  EXPECT_EQ(ix.producer_node("y"), &g.nodes[1]);
  EXPECT_EQ(ix.producer("x"), ir::GraphIndex::npos);  // a graph input
  EXPECT_EQ(ix.producer("W"), ir::GraphIndex::npos);  // an initializer
  EXPECT_EQ(ix.producer(""), ir::GraphIndex::npos);
  EXPECT_EQ(ix.readers("h"), (std::vector<size_t>{1, 2}));  // each reader once
  EXPECT_EQ(ix.uses("h"), 3u);                              // Add reads it twice
  EXPECT_EQ(ix.uses("y"), 1u);                              // a graph output counts
  EXPECT_TRUE(ix.is_output("z"));
  EXPECT_FALSE(ix.is_output("h"));
  EXPECT_TRUE(ix.readers("nothing").empty());
  EXPECT_EQ(ix.find_initializer("W"), &g.initializers[0]);
  EXPECT_EQ(ix.find_initializer("h"), nullptr);
  for (const char* name : {"x", "W", "h", "y", "mm", "relu"}) EXPECT_TRUE(ix.taken(name)) << name;
  EXPECT_FALSE(ix.taken("h_pruned"));
}

TEST(GraphIndex, RecordsWhatAPassAddsAndRewires) {
  ir::Graph g = graph();
  ir::GraphIndex ix(g);
  g.initializers.push_back({"W2", at::ones({4, 4}), "", false});
  ix.add_initializer(1);
  g.nodes.push_back(node("MatMul", {"x", "W2"}, {"h2"}, "mm2"));
  ix.add_node(3);
  g.nodes[2].inputs[1] = "h2";  // Add(h, h) -> Add(h, h2)
  ix.set_input(2, "h", "h2");
  EXPECT_EQ(ix.find_initializer("W2"), &g.initializers[1]);
  EXPECT_EQ(ix.producer("h2"), 3u);
  EXPECT_EQ(ix.uses("h"), 2u);
  EXPECT_EQ(ix.readers("h"), (std::vector<size_t>{1, 2}));  // Add still reads h once
  EXPECT_EQ(ix.readers("h2"), (std::vector<size_t>{2}));
  g.nodes[2].inputs[0] = "h2";  // Add(h2, h2): it no longer reads h
  ix.set_input(2, "h", "h2");
  EXPECT_EQ(ix.readers("h"), (std::vector<size_t>{1}));
  EXPECT_EQ(ix.uses("h2"), 2u);
  EXPECT_TRUE(ix.taken("mm2") && ix.taken("h2") && ix.taken("W2"));
  // Built again from the graph, it says the same.
  const ir::GraphIndex fresh(g);
  for (const char* v : {"x", "W", "W2", "h", "h2", "y", "z"}) {
    EXPECT_EQ(fresh.producer(v), ix.producer(v)) << v;
    EXPECT_EQ(fresh.readers(v), ix.readers(v)) << v;
    EXPECT_EQ(fresh.uses(v), ix.uses(v)) << v;
    EXPECT_EQ(fresh.initializer(v), ix.initializer(v)) << v;
  }
}
