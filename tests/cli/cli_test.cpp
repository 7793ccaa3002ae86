// The lopper command line: exit codes, one-line errors, no partial output, and the JSON of inspect
// and bench.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dnnl/primitives.h"
#include "exec/kernel_choice.h"
#include "lopper/executor.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace lopper;
using namespace lopper::test;

namespace {

// Expects a failure with exit code `code` and one line on stderr containing `needle`.
void expect_error(const test::CliResult& r, int code, const std::string& needle) {
  EXPECT_EQ(r.code, code) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

}  // namespace

TEST(Cli, VersionAndHelp) {
  auto r = lopper_cli("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("lopper "), std::string::npos);
  for (const char* sub : {"inspect", "run", "bench", "convert", "prune"}) {
    r = lopper_cli(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.out.find("--"), std::string::npos) << sub;
  }
}

TEST(Cli, UsageErrorsExitTwo) {
  expect_error(lopper_cli("inspect --no-such-flag x.onnx"), 2, "no-such-flag");
  expect_error(lopper_cli("frobnicate"), 2, "frobnicate");
  expect_error(lopper_cli("bench " + fixture("mlp.ts.onnx") + " --batch 0"), 2, "batch");
  expect_error(lopper_cli("run " + fixture("mlp.ts.onnx") + " --input nofile --out /tmp/x"), 2,
               "NAME=FILE");
}

TEST(Cli, BadModelsExitOne) {
  TempDir d;
  expect_error(lopper_cli("inspect " + d / "missing.onnx"), 1, "cannot open");
  { std::ofstream(d / "junk.onnx") << "this is not a model"; }
  expect_error(lopper_cli("inspect " + d / "junk.onnx"), 1, "junk.onnx");
  std::string bytes = slurp(fixture("resnet18.ts.onnx"));
  ASSERT_GT(bytes.size(), 1000u);
  { std::ofstream(d / "cut.onnx", std::ios::binary) << bytes.substr(0, bytes.size() / 2); }
  expect_error(lopper_cli("bench " + d / "cut.onnx"), 1, "cut.onnx");
}

TEST(Cli, RunWritesOutputsAndRefusesBadInputs) {
  TempDir d;
  auto r = lopper_cli("run " + fixture("mlp.ts.onnx") +
                      " --input input=" + fixture("mlp.input_0.npy") + " --out " + d / "out");
  ASSERT_EQ(r.code, 0) << r.err;
  int files = 0;
  for (auto& e : fs::directory_iterator(d.path / "out")) {
    ++files;
    at::Tensor got = load_npy(e.path().string());
    at::Tensor want = load_npy(fixture("mlp.expected_0.npy"));
    EXPECT_LE(test::relative_max_diff(got, want), 1e-4);
  }
  EXPECT_EQ(files, 1);

  save_npy(at::zeros({4, 1, 14, 14}), d / "small.npy");
  r = lopper_cli("run " + fixture("mlp.ts.onnx") + " --input input=" + d / "small.npy" + " --out " +
                 d / "bad");
  expect_error(r, 1, "expected shape");
  EXPECT_FALSE(fs::exists(d.path / "bad")) << "no partial output on failure";
  save_npy(at::zeros({4, 1, 28, 28}, at::kDouble), d / "f64.npy");
  expect_error(lopper_cli("run " + fixture("mlp.ts.onnx") + " --input input=" + d / "f64.npy" +
                          " --out " + d / "bad"),
               1, "expected float32");
  expect_error(lopper_cli("run " + fixture("mlp.ts.onnx") + " --input nosuch=" + d / "f64.npy" +
                          " --out " + d / "bad"),
               1, "no input named 'nosuch'");
  expect_error(lopper_cli("run " + fixture("mlp.ts.onnx") + " --out " + d / "bad"), 1,
               "missing input 'input'");
  { std::ofstream(d / "junk.npy") << "garbage"; }
  expect_error(lopper_cli("run " + fixture("mlp.ts.onnx") + " --input input=" + d / "junk.npy" +
                          " --out " + d / "bad"),
               1, "not a .npy file");
  EXPECT_FALSE(fs::exists(d.path / "bad"));
}

TEST(Cli, InspectCountsParamsAndMacs) {
  auto r = lopper_cli("inspect " + fixture("mlp.ts.onnx") + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  // 784*256+256 + 256*128+128 + 128*10+10; the fixture's input is [4, 1, 28, 28].
  EXPECT_EQ(j["params"].get<int64_t>(), 235146);
  EXPECT_EQ(j["nonzero"].get<int64_t>(), 235146);
  EXPECT_EQ(j["macs"].get<int64_t>(), 4 * (784 * 256 + 256 * 128 + 128 * 10));
  ASSERT_EQ(j["layers"].size(), 3u);
  EXPECT_EQ(j["layers"][0]["params"].get<int64_t>(), 784 * 256);
  EXPECT_EQ(j["layers"][0]["op"], "Gemm");

  // torchvision resnet18 with BatchNorm kept: 11,689,512 parameters, 1.82 GMACs at 1x3x224x224.
  r = lopper_cli("inspect " + fixture("resnet18.preserve.onnx") + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["params"].get<int64_t>(), 11689512);
  EXPECT_NEAR(j["macs"].get<double>() / 1e9, 1.82, 0.01);
  EXPECT_EQ(j["layers"].size(), 21u);  // 20 convolutions + fc
  // Each layer by the PyTorch parameter its weight is, which the table shows too.
  EXPECT_EQ(j["layers"][1]["name"], "/layer1/layer1.0/conv1/Conv");
  EXPECT_EQ(j["layers"][1]["param"], "layer1.0.conv1.weight");
  r = lopper_cli("inspect " + fixture("resnet18.preserve.onnx"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\nlayer1.0.conv1.weight "), std::string::npos) << r.out;
}

TEST(Cli, BenchReportsLatency) {
  auto r =
      lopper_cli("bench " + fixture("mlp.ts.onnx") + " --iters 5 --warmup 1 --threads 1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["median_ms"].get<double>(), 0.0);
  EXPECT_GE(j["p90_ms"].get<double>(), j["median_ms"].get<double>());
  EXPECT_EQ(j["batch"].get<int64_t>(), 4);  // the model's static batch
  // --iters is the number of timed runs, also above the helper's default cap of 500.
  r = lopper_cli("bench " + fixture("mlp.ts.onnx") + " --iters 700 --warmup 0 --threads 1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["iters"].get<int64_t>(), 700);
  if (!cuda_available()) {
    expect_error(lopper_cli("bench " + fixture("mlp.ts.onnx") + " --device cuda:0"), 1, "CUDA");
    expect_error(lopper_cli("compare " + fixture("mlp.ts.onnx") + " " + fixture("mlp.ts.onnx") +
                            " --iters 1 --device cuda"),
                 1, "CUDA");
  }
  expect_error(lopper_cli("bench " + fixture("mlp.ts.onnx") + " --device tpu"), 2, "bad device");
  expect_error(lopper_cli("bench " + fixture("mlp.ts.onnx") + " --precision fp8"), 2,
               "bad precision 'fp8'");
  if (!cuda_available())
    expect_error(lopper_cli("bench " + fixture("mlp.ts.onnx") + " --precision fp16"), 2,
                 "fp16 needs a CUDA device");
  auto bf16 =
      lopper_cli("bench " + fixture("mlp.ts.onnx") + " --iters 2 --warmup 0 --precision bf16");
  EXPECT_EQ(bf16.code, 0) << bf16.err;
  // --profile: time per op type and per node, every node of the run once.
  r = lopper_cli("bench " + fixture("mlp.ts.onnx") + " --iters 3 --warmup 1 --profile --json");
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  int64_t calls = 0;
  for (const auto& op : j["profile"]) calls += op["calls_per_run"].get<int64_t>();
  ASSERT_GT(calls, 0);
  EXPECT_EQ(static_cast<int64_t>(j["profile_nodes"].size()), calls);
  double slowest = j["profile_nodes"][0]["ms_per_run"].get<double>();
  for (const auto& n : j["profile_nodes"]) {
    EXPECT_LE(n["ms_per_run"].get<double>(), slowest);
    EXPECT_NE(n["node"].get<std::string>().find(" ("), std::string::npos);
  }
}

// --explain names every weighted layer's choice and candidates; the second load takes the choices
// from the per-machine cache; LOPPER_ISA picks the ISA or fails at load with one line; a corrupt
// cache is rebuilt.
// A CPU run maps none of the CUDA libraries (0.18 s and 400 MB a start); --device cuda loads
// lopper's CUDA library, and libtorch_cuda with it, before anything else. The dynamic loader's own
// log (LD_DEBUG=files, on stderr) tells which objects the process opened.
TEST(Cli, CudaLibrariesLoadOnlyForACudaDevice) {
  ::setenv("LD_DEBUG", "files", 1);
  auto cpu = lopper_cli("bench " + fixture("mlp.ts.onnx") + " --iters 1 --warmup 0 --threads 1");
  auto gpu = lopper_cli("bench " + fixture("mlp.ts.onnx") +
                        " --iters 1 --warmup 0 --threads 1 --device cuda");
  ::unsetenv("LD_DEBUG");
  ASSERT_EQ(cpu.code, 0) << cpu.err.substr(cpu.err.size() - std::min<size_t>(cpu.err.size(), 2000));
  EXPECT_NE(cpu.err.find("file=libtorch_cpu.so"), std::string::npos);  // the log is there
  EXPECT_EQ(cpu.err.find("libtorch_cuda"), std::string::npos);
  EXPECT_EQ(cpu.err.find("liblopper_cuda"), std::string::npos);
  EXPECT_EQ(cpu.err.find("libcublas"), std::string::npos);
  EXPECT_NE(gpu.err.find("liblopper_cuda.so"), std::string::npos);
  EXPECT_NE(gpu.err.find("file=libtorch_cuda.so"), std::string::npos);
  if (!cuda_available()) {
    EXPECT_EQ(gpu.code, 1);
    EXPECT_NE(gpu.err.find("lopper: [device] 'cuda' requested, but no CUDA GPU is available"),
              std::string::npos);
  }
}

TEST(Cli, BenchExplainsKernelChoicesAndCachesThem) {
  TempDir dir;
  ASSERT_EQ(lopper_cli("prune " + fixture("mlp.ts.onnx") + " -o " + dir / "p.onnx" +
                       " --method l1 --amount 0.9")
                .code,
            0);
  setenv("LOPPER_CACHE_DIR", (dir / "cache").c_str(), 1);
  setenv("LOPPER_ISA", "avx2", 1);
  // A fixed thread count: choices are cached per thread count, and the default follows the load.
  const std::string bench =
      "bench " + dir / "p.onnx" + " --iters 2 --warmup 0 --explain --json --threads 1";
  // Timed while the machine runs slow: used, reported, not cached (the next run times again).
  setenv("LOPPER_CHOICE_BUSY", "1", 1);
  for (int run = 0; run < 2; ++run) {
    auto busy = lopper_cli(bench);
    ASSERT_EQ(busy.code, 0) << busy.err;
    const auto report = nlohmann::json::parse(busy.out);  // (a temporary dies before the loop)
    for (const auto& l : report.at("kernels").at("layers")) {
      EXPECT_TRUE(l.at("busy").get<bool>()) << l.dump();
      EXPECT_FALSE(l.at("cached").get<bool>()) << l.dump();
    }
  }
  auto busy_text = lopper_cli("bench " + dir / "p.onnx" + " --iters 2 --warmup 0 --explain");
  EXPECT_NE(busy_text.out.find("timed while the machine ran slow: not cached"), std::string::npos)
      << busy_text.out;
  // Idle from here on (a noisy CI machine must not make the caching below flaky).
  setenv("LOPPER_CHOICE_BUSY", "0", 1);
  auto first = lopper_cli(bench);
  ASSERT_EQ(first.code, 0) << first.err;
  // NOTE: .at() throughout: a key missing from lopper's output must fail the test with its name
  // (a const json's operator[] on a missing key is undefined: on a GPU machine it crashed the test
  // without a word).
  const auto j = nlohmann::json::parse(first.out).at("kernels");
  EXPECT_EQ(j.at("isa"), "avx2");
  ASSERT_EQ(j.at("layers").size(), 3u) << first.out;  // the MLP's three Gemms
  for (const auto& l : j.at("layers")) {
    SCOPED_TRACE(l.dump());
    EXPECT_FALSE(l.at("cached").get<bool>());
    EXPECT_NEAR(l.at("sparsity").get<double>(), 0.9, 0.01);
    EXPECT_TRUE(l.at("ms").contains("aten"));
    EXPECT_TRUE(l.at("ms").contains("csr-dot"));  // a 90% sparse weight has sparse candidates
    EXPECT_TRUE(l.at("ms").contains(l.at("chosen").get<std::string>()));
  }
  EXPECT_TRUE(fs::exists(dir / "cache/kernels.json"));
  auto second = lopper_cli(bench);
  ASSERT_EQ(second.code, 0) << second.err;
  const auto j2 = nlohmann::json::parse(second.out).at("kernels").at("layers");
  ASSERT_EQ(j2.size(), 3u) << second.out;
  for (size_t i = 0; i < j2.size(); ++i) {
    EXPECT_TRUE(j2.at(i).at("cached").get<bool>());
    EXPECT_EQ(j2.at(i).at("chosen"), j.at("layers").at(i).at("chosen"));
  }
  std::ofstream(dir / "cache/kernels.json") << "{ not json";
  auto third = lopper_cli(bench);
  ASSERT_EQ(third.code, 0) << third.err;
  EXPECT_FALSE(
      nlohmann::json::parse(third.out).at("kernels").at("layers").at(0).at("cached").get<bool>());
  auto text = lopper_cli("bench " + dir / "p.onnx" + " --iters 2 --warmup 0 --explain");
  EXPECT_NE(text.out.find("kernel choice per layer (sparse kernels: avx2"), std::string::npos);
  setenv("LOPPER_ISA", "sse9", 1);
  expect_error(lopper_cli(bench), 1, "LOPPER_ISA='sse9' is not an ISA");
  unsetenv("LOPPER_ISA");
  unsetenv("LOPPER_CACHE_DIR");
  unsetenv("LOPPER_CHOICE_BUSY");
}

// oneDNN's primitives called directly are a candidate where its library loads (the
// implementation oneDNN picked named with the decision), none with LOPPER_DNNL_LIBRARY=off, and
// where the library named is missing or not a library, lopper runs as before and says why beside
// the layer's choice.
TEST(Cli, BenchOffersOneDnnDirectWhereItsLibraryLoads) {
  TempDir dir;
  setenv("LOPPER_KERNEL_CACHE", "off", 1);
  std::ofstream(dir / "not-a-library.so") << "text";
  const std::string bench =
      "bench " + fixture("mlp.ts.onnx") + " --iters 2 --warmup 0 --explain --json --threads 1";
  auto layers = [&](const char* library) {
    if (library)
      setenv("LOPPER_DNNL_LIBRARY", library, 1);
    else
      unsetenv("LOPPER_DNNL_LIBRARY");
    auto r = lopper_cli(bench);
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out).at("kernels").at("layers");
  };
  auto offered = [](const nlohmann::json& l) { return l.at("ms").contains("onednn-direct"); };
  auto refused = [](const nlohmann::json& l) {
    for (const auto& why : l.at("refused"))
      if (why.get<std::string>().rfind("onednn-direct: ", 0) == 0) return why.get<std::string>();
    return std::string();
  };
  // where offered, oneDNN's own name for the implementation it runs ("brg:avx512_core_amx" on a
  // CPU with AMX) comes with the decision
  auto implementation = [](const nlohmann::json& l) {
    const auto& i = l.at("implementations");
    return i.contains("onednn-direct") ? i.at("onednn-direct").get<std::string>() : "";
  };
  if (lopper::dnnl::available())
    for (const auto& l : layers(nullptr)) {
      EXPECT_TRUE(offered(l)) << l.dump();
      EXPECT_NE(implementation(l), "") << l.dump();
    }
  for (const auto& l : layers("off")) {
    EXPECT_FALSE(offered(l)) << l.dump();
    EXPECT_EQ(refused(l), "") << l.dump();
    EXPECT_EQ(implementation(l), "") << l.dump();
  }
  const std::string missing = dir / "missing/libdnnl.so.3", text = dir / "not-a-library.so";
  for (const std::string& path : {missing, text})
    for (const auto& l : layers(path.c_str())) {
      EXPECT_FALSE(offered(l)) << l.dump();
      EXPECT_NE(refused(l).find("could not be loaded: " + path), std::string::npos) << l.dump();
    }
  unsetenv("LOPPER_DNNL_LIBRARY");
  unsetenv("LOPPER_KERNEL_CACHE");
}

// The cache keeps the current kernel generation's choices only, and at most kMaxChoices a machine
// (the newest): a cache left by older builds and many models is not parsed at every start.
TEST(Cli, KernelCacheDropsOldGenerationsAndStaysBounded) {
  TempDir dir;
  fs::create_directories(dir / "cache");
  const std::string gen = std::to_string(lopper::ops::kKernelGeneration);
  nlohmann::json cache = nlohmann::json::object();
  cache["some cpu | avx2 | kernels 3"]["k"] = {{"kernel", "aten"}};
  nlohmann::json& many = cache["some device | kernels " + gen];
  const size_t n = lopper::ops::kMaxChoices + 100;
  for (size_t i = 0; i < n; ++i)
    many["k" + std::to_string(i)] = {{"kernel", "aten"}, {"at", static_cast<int64_t>(i)}};
  std::ofstream(dir / "cache/kernels.json") << cache.dump();
  setenv("LOPPER_CACHE_DIR", (dir / "cache").c_str(), 1);
  setenv("LOPPER_CHOICE_BUSY", "0", 1);
  auto r = lopper_cli("bench " + fixture("small_cnn.ts.onnx") +
                      " --iters 1 --warmup 0 --threads 1 --explain --json");
  unsetenv("LOPPER_CACHE_DIR");
  unsetenv("LOPPER_CHOICE_BUSY");
  ASSERT_EQ(r.code, 0) << r.err;
  size_t timed = 0;
  const auto report = nlohmann::json::parse(r.out);
  for (const auto& l : report.at("kernels").at("layers"))
    timed += l.at("ms").size() > 1 && !l.at("cached").get<bool>();
  ASSERT_GT(timed, 0u) << r.out;  // something was written
  std::ifstream in(dir / "cache/kernels.json");
  const auto after = nlohmann::json::parse(in);
  EXPECT_FALSE(after.contains("some cpu | avx2 | kernels 3"));
  const auto& kept = after.at("some device | kernels " + gen);
  EXPECT_EQ(kept.size(), lopper::ops::kMaxChoices);
  EXPECT_TRUE(kept.contains("k" + std::to_string(n - 1)));  // the newest stay
  EXPECT_FALSE(kept.contains("k0"));
  EXPECT_FALSE(kept.contains("k99"));
  EXPECT_TRUE(kept.contains("k100"));
  // This run's choices, under this machine, stamped.
  bool mine = false;
  for (const auto& [machine, keys] : after.items())
    if (machine.find("some ") != 0)
      for (const auto& [key, value] : keys.items())
        mine = mine || (key != "probe" && value.contains("kernel") && value.contains("at"));
  EXPECT_TRUE(mine) << after.dump().substr(0, 2000);
}

TEST(Cli, ConvertRoundTrips) {
  TempDir d;
  auto r = lopper_cli("convert " + fixture("small_cnn.ts.onnx") + " -o " + d / "out.onnx");
  ASSERT_EQ(r.code, 0) << r.err;
  ir::Model a = onnx::load_model(fixture("small_cnn.ts.onnx"));
  ir::Model b = onnx::load_model(d / "out.onnx");
  EXPECT_EQ(a.graph.nodes.size(), b.graph.nodes.size());
  // Refuses to overwrite its input.
  r = lopper_cli("convert " + d / "out.onnx" + " -o " + d / "out.onnx");
  expect_error(r, 2, "input");
}
