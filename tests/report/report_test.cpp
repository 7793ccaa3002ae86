// The HTML report: its data (models, layers matched by name, sensitivity, training), the page
// (Chart.js and the data inlined, nothing left of the template's markers, "</" escaped), and
// --report's bad paths on prune, sensitivity and train. tests/python/check_reports.py renders the
// pages in headless Chromium.
#include "lopper/report.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "lopper/analysis.h"
#include "lopper/error.h"
#include "lopper/npy.h"
#include "lopper/sensitivity.h"
#include "lopper/train.h"
#include "test_models.h"

namespace lopper {
namespace {

namespace fs = std::filesystem;
using test::fixture;
using test::lopper_cli;

LayerCost layer(const std::string& name, int64_t params, int64_t nonzero, int64_t macs) {
  LayerCost l;
  l.name = name;
  l.op = "Gemm";
  l.params = params;
  l.nonzero = nonzero;
  l.macs = macs;
  return l;
}

TEST(HtmlReport, MatchesLayersByNameAcrossModels) {
  HtmlReport rep("prune", "t", "lopper prune a.onnx");
  ModelCost before, after;
  before.layers = {layer("fc1", 100, 100, 1000), layer("fc2", 50, 50, 500)};
  // The pruned model lost fc2 and gained fc3 (a rewrite); fc1 kept its name.
  after.layers = {layer("fc3", 10, 10, 10), layer("fc1", 100, 20, 1000)};
  ReportModel mb{"before", "a.onnx", 150, 150, 1500, 10}, ma{"after", "b.onnx", 110, 30, 1010, 8};
  mb.top1 = 0.9;
  rep.add_model(mb, before);
  rep.add_model(ma, after);
  const auto& d = rep.data();
  ASSERT_EQ(d["models"].size(), 2u);
  EXPECT_EQ(d["models"][0]["top1"], 0.9);
  EXPECT_FALSE(d["models"][1].contains("top1"));  // not measured: left out
  EXPECT_FALSE(d["models"][0].contains("latency_ms"));
  ASSERT_EQ(d["layers"].size(), 3u);
  EXPECT_EQ(d["layers"][0]["name"], "fc1");
  EXPECT_EQ(d["layers"][0]["nonzero"], nlohmann::json({100, 20}));
  EXPECT_EQ(d["layers"][1]["name"], "fc2");
  EXPECT_EQ(d["layers"][1]["params"], nlohmann::json({50, 0}));
  EXPECT_EQ(d["layers"][2]["name"], "fc3");
  EXPECT_EQ(d["layers"][2]["macs"], nlohmann::json({0, 10}));
}

TEST(HtmlReport, LayersCarryTheirParameterNames) {
  HtmlReport rep("prune", "t", "lopper prune a.onnx");
  ModelCost cost;
  cost.layers = {layer("node_MatMul_58", 100, 100, 1000), layer("/fc/Gemm", 10, 10, 10)};
  cost.layers[0].param = "m.encoder.layer.0.query.weight";
  rep.add_model(ReportModel{"before", "a.onnx", 110, 110, 1010, 10}, cost);
  SensitivityResult s;
  s.unit = "weight";
  LayerSensitivity l;
  l.name = "node_MatMul_58";
  l.param = "m.encoder.layer.0.query.weight";
  s.layers = {l};
  rep.add_sensitivity(s, false);
  const auto& d = rep.data();
  EXPECT_EQ(d["layers"][0]["name"], "node_MatMul_58");
  EXPECT_EQ(d["layers"][0]["param"], "m.encoder.layer.0.query.weight");
  EXPECT_EQ(d["layers"][1]["param"], "");  // the page shows the node's name
  EXPECT_EQ(d["sensitivity"]["layers"][0]["param"], "m.encoder.layer.0.query.weight");
  // The page labels a layer by its parameter, else its node.
  EXPECT_NE(rep.html().find("short(l.param || l.name)"), std::string::npos);
}

TEST(HtmlReport, PageInlinesChartJsAndEscapedData) {
  HtmlReport rep("sensitivity", "</script><script>alert(1)</script>", "lopper sensitivity");
  rep.add_note("a note with </script> inside and {{data}} and {{chart.js}}");
  SensitivityResult s;
  s.unit = "weight";
  s.method = "l1";
  s.top1 = 0.5;
  s.loss = 1.0;
  s.samples = 8;
  s.params = 1000;
  LayerSensitivity l;
  l.name = "fc1";
  l.points = {{0.5, 0.5, 1.2, 0.4, 600, 900}, {0.9, 0.9, 2.0, 0.2, 200, 500}};
  s.layers = {l};
  rep.add_sensitivity(s);
  const std::string page = rep.html();
  EXPECT_NE(page.find("Chart.js v"), std::string::npos);             // the library's banner
  EXPECT_EQ(page.find("{{chart.js}}"), page.rfind("{{chart.js}}"));  // only the note's
  // The only "</script" are the page's own elements' ends: 4 scripts.
  size_t closes = 0;
  for (size_t at = page.find("</script"); at != std::string::npos;
       at = page.find("</script", at + 1))
    ++closes;
  EXPECT_EQ(closes, 4u);
  EXPECT_NE(page.find("<\\/script><script>alert(1)<\\/script>"), std::string::npos);
  // The trade-off: the unpruned point, then the layer's curve at its share of parameters removed.
  const auto& t = rep.data()["tradeoff"]["series"];
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0]["role"], "reference");
  EXPECT_DOUBLE_EQ(t[1]["points"][2]["x"].get<double>(), 0.8);  // 1 - 200/1000
  EXPECT_DOUBLE_EQ(t[1]["points"][2]["y"].get<double>(), 0.2);
}

TEST(HtmlReport, WritesAtomicallyAndNamesAnUnwritablePath) {
  test::TempDir tmp;
  HtmlReport rep("train", "t", "lopper train");
  TrainResult r;
  r.epochs = {EpochStats{1, 0.5, 0.8}};
  r.notes = {"agp epoch 1: pruned"};
  rep.add_training(r, {{0.5, 0.7, 0.6, 0.01}}, "test", 0.75);
  rep.write(tmp / "r.html");
  EXPECT_NE(test::slurp(tmp / "r.html").find("\"eval\":{\"split\":\"test\",\"top1\":0.75}"),
            std::string::npos);
  EXPECT_EQ(rep.data()["notes"][0], "agp epoch 1: pruned");
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(tmp.path)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);  // no temporary left behind
  EXPECT_THROW(rep.write(tmp / "no/r.html"), Error);
}

TEST(ReportCli, RefusesBadReportPathsBeforeAnyWork) {
  test::TempDir tmp;
  const std::string data = test::random_npy_data(tmp, 16, 3);
  const std::string in = fixture("mlp.ts.onnx"), out = tmp / "p.onnx";
  struct Case {
    std::string args;
    std::string needle;
  } cases[] = {
      {"prune " + in + " -o " + out + " --method l1 --amount 0.5 --report " + (tmp / "no/r.html"),
       "no folder"},
      {"prune " + in + " -o " + out + " --method l1 --amount 0.5 --report " + in, "names an input"},
      {"prune " + in + " -o " + out + " --method l1 --amount 0.5 --report " + out,
       "another output"},
      {"prune " + in + " -o " + out + " --method l1 --amount 0.5 --report " + tmp.path.string(),
       "is a folder"},
      {"prune " + in + " -o " + out + " --method l1 --amount 0.5 --eval-batches 2",
       "--eval-batches is for"},
      {"prune " + in + " -o " + out + " --method l1 --amount 0.5 --data " + data +
           " --calib-batches 2 --report " + (tmp / "r.html"),
       "--calib-batches is for grad, taylor, wanda and sparsegpt only"},
      {"prune " + in + " -o " + out + " --target-macs 0.5 --report " + (tmp / "x/r.html"),
       "no folder"},
      {"prune " + in + " -o " + out + " --structured channel --amount 0.5 --report " + out +
           ".report.json",
       "another output"},
      {"sensitivity " + in + " --data " + data + " -o " + (tmp / "s.json") + " --report " +
           (tmp / "s.json"),
       "another output"},
      {"sensitivity " + in + " --data " + data + " --report " + (tmp / "no/s.html"), "no folder"},
      {"train " + in + " --data " + data + " -o " + out + " --epochs 1 --report " + out +
           ".train.json",
       "another output"},
      {"train " + in + " --data " + data + " -o " + out + " --epochs 1 --report " +
           (tmp / "no/t.html"),
       "no folder"},
  };
  for (const auto& c : cases) {
    auto r = lopper_cli(c.args);
    EXPECT_EQ(r.code, 2) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(test::lines(r.err), 1) << c.args << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.args;  // refused before any work: nothing written
    EXPECT_FALSE(fs::exists(tmp / "s.json")) << c.args;
  }
  // --data with a method that needs none is there for the report's accuracy.
  auto ok = lopper_cli("prune " + in + " -o " + out + " --method l1 --amount 0.5 --data " + data +
                       " --eval-batches 2 --report " + (tmp / "r.html"));
  ASSERT_EQ(ok.code, 0) << ok.err;
  const std::string page = test::slurp(tmp / "r.html");
  EXPECT_NE(page.find(" runs on cpu, batch 4; top-1 and loss on 8 samples of "), std::string::npos);
  auto without = lopper_cli("prune " + in + " -o " + (tmp / "q.onnx") +
                            " --method l1 --amount 0.5 --data " + data);
  EXPECT_EQ(without.code, 2) << without.err;
  EXPECT_NE(without.err.find("(or --report's accuracy)"), std::string::npos) << without.err;
}

}  // namespace
}  // namespace lopper
