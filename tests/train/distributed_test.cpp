// Data parallel over real processes on 127.0.0.1. NOTE: each rank is this test binary run again
// (posix_spawn of /proc/self/exe with LOPPER_DIST_CHILD=<scenario> and a gtest filter that picks
// DistributedChild.*), not a fork(): a fork after libtorch's thread pools have started can
// deadlock in the child, an exec cannot.
#include "lopper/distributed.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <regex>
#include <thread>
#include <utility>

#include "lopper/error.h"
#include "test_util.h"

extern char** environ;

namespace lopper {
namespace {

using namespace std::string_literals;

constexpr double kTimeoutS = 3;  // short, so that the failure tests are quick

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A port nothing listens on right now: bind port 0 and ask which one the kernel chose.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (fd >= 0) ::close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

// The message of the lopper::Error that joining the group `o` describes throws ("" when it joins).
std::string join_error(const DistOptions& o) {
  return test::error_of([&] { Distributed d(o); });
}

// Rank `rank` of a group of two whose master's port nothing listens on.
DistOptions two_ranks(int rank, double timeout_s) {
  DistOptions o;
  o.rank = rank;
  o.world = 2;
  o.master_port = free_port();
  o.timeout_s = timeout_s;
  return o;
}

// join_error(o), and the seconds it took.
std::pair<std::string, double> timed_join_error(const DistOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  std::string e = join_error(o);
  return {e, seconds_since(t0)};
}

// Sets (or, with nullptr, unsets) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_.c_str(), old_->c_str(), 1) : ::unsetenv(name_.c_str()); }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// ---- the child side: one rank of a scenario --------------------------------------------------

// Rank r's tensor for slot `seed`: differs per rank and per element.
at::Tensor input(int64_t seed, at::IntArrayRef shape, at::ScalarType dtype, int r) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return (at::arange(n, at::kDouble) * double(seed + 1) + 100.0 * r - 7.5 * seed)
      .reshape(shape)
      .to(dtype);
}

void write_result(const std::string& text) {
  const char* path = std::getenv("LOPPER_DIST_OUT");
  ASSERT_NE(path, nullptr);
  std::ofstream(path) << text;
}

void collectives(Distributed& d) {
  const int r = d.rank(), w = d.world();
  // allreduce_mean: float and double of several shapes, a non-contiguous view, an undefined slot.
  struct Slot {
    int64_t seed;
    std::vector<int64_t> shape;
    at::ScalarType dtype;
  };
  std::vector<Slot> slots = {{0, {3, 4}, at::kFloat},
                             {1, {5}, at::kDouble},
                             {2, {2, 3, 2}, at::kFloat},
                             {3, {7, 1}, at::kDouble},
                             {4, {1}, at::kFloat}};
  std::vector<at::Tensor> g, expect;
  for (const Slot& s : slots) {
    g.push_back(input(s.seed, s.shape, s.dtype, r));
    at::Tensor sum = at::zeros(s.shape, at::kDouble);
    for (int k = 0; k < w; ++k) sum += input(s.seed, s.shape, at::kDouble, k);
    expect.push_back(sum / w);
  }
  at::Tensor base = g[2].clone();
  g[2] = base.transpose(0, 2);  // a non-contiguous view: the result must land in `base`
  expect[2] = expect[2].transpose(0, 2);
  g.insert(g.begin() + 1, at::Tensor());  // an undefined slot, skipped
  d.allreduce_mean(g);
  ASSERT_EQ(g.size(), slots.size() + 1);
  EXPECT_FALSE(g[1].defined());
  g.erase(g.begin() + 1);
  for (size_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(g[i].scalar_type(), slots[i].dtype) << "slot " << i;
    EXPECT_LT(test::relative_max_diff(g[i], expect[i]), 1e-6) << "slot " << i;
  }
  EXPECT_LT(test::relative_max_diff(base.transpose(0, 2), expect[2]), 1e-6);

  // allreduce_sum: metrics, integer counts included.
  std::vector<at::Tensor> m = {at::tensor({1.5 * (r + 1), 10.0}, at::kDouble),
                               at::tensor({int64_t(r + 1), int64_t(2)}, at::kLong)};
  const int64_t version = m[0]._version();
  d.allreduce_sum(m);
  EXPECT_GT(m[0]._version(), version);  // written in place: autograd must know
  EXPECT_DOUBLE_EQ(m[0][0].item<double>(), 1.5 * w * (w + 1) / 2);
  EXPECT_DOUBLE_EQ(m[0][1].item<double>(), 10.0 * w);
  EXPECT_EQ(m[1][0].item<int64_t>(), int64_t(w) * (w + 1) / 2);
  EXPECT_EQ(m[1][1].item<int64_t>(), 2 * w);

  // broadcast from every root: weights that require grad, buffers of other dtypes.
  for (int root = 0; root < w; ++root) {
    at::Tensor weight = input(5, {4, 3}, at::kFloat, r).set_requires_grad(true);
    std::vector<at::Tensor> b = {weight, input(6, {2}, at::kDouble, r),
                                 at::tensor({int64_t(r) * 10 + 3}, at::kLong), at::Tensor()};
    d.broadcast(b, root);
    EXPECT_TRUE(b[0].is_same(weight));
    EXPECT_TRUE(weight.requires_grad());
    EXPECT_TRUE(at::equal(weight, input(5, {4, 3}, at::kFloat, root))) << "root " << root;
    EXPECT_TRUE(at::equal(b[1], input(6, {2}, at::kDouble, root))) << "root " << root;
    EXPECT_EQ(b[2].item<int64_t>(), int64_t(root) * 10 + 3);
  }

  d.barrier();
  d.barrier();
  write_result("ok");
}

// Rank `victim` leaves after a barrier (dies, or hangs when `hang`); the other ranks' next
// collective must throw lopper::Error within the timeout.
void survivor(Distributed& d, int victim, bool hang) {
  d.barrier();
  if (d.rank() == victim) {
    if (hang) std::this_thread::sleep_for(std::chrono::seconds(120));  // the parent kills it
    std::_Exit(0);
  }
  std::vector<at::Tensor> g = {at::ones({1000}), at::ones({3}, at::kDouble)};
  auto t0 = std::chrono::steady_clock::now();
  try {
    d.allreduce_mean(g);
    write_result("no error");
  } catch (const Error& e) {
    double took = seconds_since(t0);
    // The group stays failed: a later call says so at once instead of waiting again.
    std::string again;
    try {
      d.barrier();
    } catch (const Error& e2) {
      again = e2.what();
    }
    write_result(detail::concat(took, "\n", e.what(), "\n", again));
  }
}

TEST(DistributedChild, RunsOnlyAsARankOfAnotherTest) {
  const char* scenario = std::getenv("LOPPER_DIST_CHILD");
  if (scenario == nullptr) GTEST_SKIP() << "a rank spawned by the DistributedTwoRanks tests";
  DistOptions o = dist_options_from_env("cpu");
  o.timeout_s = kTimeoutS;
  Distributed d(o);
  std::string s = scenario;
  if (s == "collectives") {
    collectives(d);
  } else if (s == "dead_peer") {
    survivor(d, 1, false);
  } else if (s == "dead_master") {
    survivor(d, 0, false);
  } else if (s == "hung_peer") {
    survivor(d, 1, true);
  } else {
    FAIL() << "unknown scenario " << s;
  }
}

// ---- the parent side ------------------------------------------------------------------------

struct Ranks {
  std::vector<pid_t> pids;
  std::vector<std::string> outs, logs;
};

Ranks spawn_ranks(const std::string& scenario, int world, const test::TempDir& dir) {
  int port = free_port();
  EXPECT_GT(port, 0);
  Ranks rs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      static const char* drop[] = {
          "LOPPER_DIST_", "GTEST_",       "RANK=",        "WORLD_SIZE=",
          "LOCAL_RANK=",  "MASTER_ADDR=", "MASTER_PORT=", "OMP_NUM_THREADS="};
      bool keep = true;
      for (const char* d : drop) keep = keep && kv.rfind(d, 0) != 0;
      if (keep) env.push_back(kv);
    }
    rs.outs.push_back(dir / ("rank" + std::to_string(r) + ".out"));
    rs.logs.push_back(dir / ("rank" + std::to_string(r) + ".log"));
    for (std::string kv :
         {"LOPPER_DIST_CHILD=" + scenario, "LOPPER_DIST_OUT=" + rs.outs.back(),
          "RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
          "MASTER_ADDR=127.0.0.1"s, "MASTER_PORT=" + std::to_string(port), "OMP_NUM_THREADS=1"s})
      env.push_back(kv);
    std::vector<char*> envp;
    for (auto& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", filter = "--gtest_filter=DistributedChild.*";
    char* argv[] = {exe.data(), filter.data(), nullptr};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, rs.logs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_EQ(rc, 0) << std::strerror(rc);
    rs.pids.push_back(rc == 0 ? pid : -1);
  }
  return rs;
}

// Exit code of `pid`, waiting at most `limit_s`; a rank still running then is killed (-1).
int wait_rank(pid_t pid, double limit_s) {
  if (pid <= 0) return -2;
  auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (seconds_since(t0) > limit_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// NOTE: generous: each rank loads libtorch on a 2-core machine before it does anything.
constexpr double kRankLimitS = 60;

TEST(DistributedTwoRanks, AllreduceMeanSumBroadcastBarrier) {
  test::TempDir dir;
  Ranks rs = spawn_ranks("collectives", 2, dir);
  for (size_t r = 0; r < rs.pids.size(); ++r) {
    int code = wait_rank(rs.pids[r], kRankLimitS);
    EXPECT_EQ(code, 0) << "rank " << r << (code == -1 ? " hung" : " failed") << ":\n"
                       << test::slurp(rs.logs[r]);
    EXPECT_EQ(test::slurp(rs.outs[r]), "ok") << test::slurp(rs.logs[r]);
  }
}

// Runs a scenario in which rank `victim` leaves; checks the survivor's error and its timing.
void expect_survivor_throws(const std::string& scenario, int victim, double max_s,
                            const std::string& kind) {
  test::TempDir dir;
  Ranks rs = spawn_ranks(scenario, 2, dir);
  const int live = 1 - victim;
  int code = wait_rank(rs.pids[live], kRankLimitS);
  wait_rank(rs.pids[victim], 0);  // a hung victim is killed now; a dead one is reaped
  ASSERT_EQ(code, 0) << "rank " << live << (code == -1 ? " hung" : " failed") << ":\n"
                     << test::slurp(rs.logs[live]);
  std::istringstream out(test::slurp(rs.outs[live]));
  double took = -1;
  std::string what, again;
  out >> took;
  out.ignore();
  std::getline(out, what);
  std::getline(out, again);
  ASSERT_GE(took, 0) << "no error: " << test::slurp(rs.outs[live]) << "\n"
                     << test::slurp(rs.logs[live]);
  std::cout << "[ survivor ] " << scenario << ": threw after " << took << " s: " << what << "\n";
  EXPECT_LE(took, max_s);
  EXPECT_EQ(what.rfind("[dist] rank " + std::to_string(live) + ": allreduce_mean: ", 0), 0) << what;
  EXPECT_NE(what.find(kind), std::string::npos) << what;
  EXPECT_NE(again.find("failed earlier"), std::string::npos) << again;
}

TEST(DistributedTwoRanks, DeadPeerMakesTheSurvivorThrow) {
  expect_survivor_throws("dead_peer", 1, kTimeoutS + 2, "did it exit?");
}

TEST(DistributedTwoRanks, DeadMasterMakesTheSurvivorThrow) {
  expect_survivor_throws("dead_master", 0, kTimeoutS + 2, "did it exit?");
}

TEST(DistributedTwoRanks, HungPeerTimesOut) {
  expect_survivor_throws("hung_peer", 1, kTimeoutS + 3, "within 3 s");
}

// ---- in this process: no network, or a rendezvous that cannot complete ----------------------

TEST(DistributedLocal, WorldOneIsANoOpWithoutNetwork) {
  DistOptions o;
  o.master_addr = "no.such.host.invalid";
  o.master_port = 0;  // never used
  Distributed d(o);
  EXPECT_EQ(d.rank(), 0);
  EXPECT_EQ(d.world(), 1);
  EXPECT_TRUE(d.is_main());
  at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3}), a0 = a.clone();
  at::Tensor n = at::tensor({int64_t(7)}, at::kLong);
  std::vector<at::Tensor> ts = {a, at::Tensor()};
  d.allreduce_mean(ts);
  d.broadcast(ts);
  std::vector<at::Tensor> ns = {n};
  d.allreduce_sum(ns);
  d.barrier();
  EXPECT_TRUE(at::equal(a, a0));
  EXPECT_EQ(n.item<int64_t>(), 7);
  // Mistakes are caught the same with one rank as with many.
  EXPECT_EQ(test::error_of([&] { d.allreduce_mean(ns); }),
            "[dist] rank 0: allreduce_mean: tensor 0 is Long; a mean needs a floating-point dtype "
            "(use allreduce_sum)");
  EXPECT_EQ(test::error_of([&] { d.broadcast(ts, 1); }),
            "[dist] rank 0: broadcast: root must be in [0, 1), got 1");
}

TEST(DistributedLocal, RejectsBadOptions) {
  DistOptions o;
  o.world = 2;
  o.rank = 2;
  EXPECT_EQ(join_error(o), "[dist] rank must be in [0, 2), got 2");
  o.rank = 0;
  o.timeout_s = 0;
  EXPECT_EQ(join_error(o), "[dist] timeout must be > 0 s, got 0");
  o.timeout_s = 1;
  o.master_port = 70000;
  EXPECT_EQ(join_error(o), "[dist] master port must be in [1, 65535], got 70000");
  o.device = "tpu";
  EXPECT_EQ(join_error(o), "[dist] device must be cpu, cuda or cuda:N, got 'tpu'");
}

TEST(DistributedLocal, UnreachableMasterFailsWithinTimeout) {
  const DistOptions o = two_ranks(1, 2);
  const auto [e, seconds] = timed_join_error(o);
  ASSERT_NE(e, "") << "joined a master that does not exist";
  std::cout << "[ message  ] " << e << "\n";
  EXPECT_EQ(e.rfind(detail::concat("[dist] rank 1: could not reach the master at 127.0.0.1:",
                                   o.master_port, " within 2 s"),
                    0),
            0)
      << e;
  EXPECT_LT(seconds, o.timeout_s + 1);  // our own deadline, not c10d's backoff
}

TEST(DistributedLocal, MissingRankFailsTheMastersRendezvous) {
  const DistOptions o = two_ranks(0, 1);
  const auto [e, seconds] = timed_join_error(o);
  ASSERT_NE(e, "") << "rendezvous completed with one of two ranks";
  std::cout << "[ message  ] " << e << "\n";
  EXPECT_EQ(e, detail::concat("[dist] rank 0: only 1 of 2 ranks reached the master at 127.0.0.1:",
                              o.master_port, " within 1 s"));
  EXPECT_LT(seconds, o.timeout_s + 2);  // TCPStore polls for workers each second
}

TEST(DistributedLocal, CudaWithoutGpuFailsBeforeAnyNetwork) {
  if (at::hasCUDA()) GTEST_SKIP() << "a GPU is present";
  DistOptions o = two_ranks(0, 30);  // nobody listens: an attempt to connect would time out
  o.device = "cuda:0";
  const auto [e, seconds] = timed_join_error(o);
  ASSERT_NE(e, "") << "NCCL without a GPU";
  // Not the nccl.h mismatch message: the build saw the wheel's own NCCL headers.
  EXPECT_EQ(e,
            "[dist] rank 0: device 'cuda:0' needs NCCL on a GPU, but CUDA is unavailable (no "
            "GPU or driver)");
  EXPECT_LT(seconds, 5);
}

// The gloo headers lopper compiles with (Debian's) are older than the gloo inside libtorch_cpu:
// lopper may call ProcessGroupGloo's functions but must never carry its own copy of gloo code (an
// inline function or vtable of a gloo type, which would interpose libtorch's), nor load libgloo.
TEST(DistributedAbi, CarriesNoGlooCodeOfItsOwn) {
  std::string exe = std::filesystem::read_symlink("/proc/self/exe");
  FILE* p = ::popen(("nm -C '" + exe + "' 2>/dev/null").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string symbols;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) symbols.append(buf, n);
  ::pclose(p);
  if (symbols.empty()) GTEST_SKIP() << "no nm";
  EXPECT_NE(symbols.find("lopper::Distributed::Distributed"), std::string::npos);
  // Defined here: gloo's code or ProcessGroupGloo's inline parts (GlooStore, AsyncWork ...).
  static const std::regex defined(
      "^[0-9a-f]+ [A-Za-z] ((vtable|VTT|typeinfo|typeinfo name) for |(non-)?virtual thunk to )?"
      "(gloo::|c10d::ProcessGroupGloo::).*");
  // Called from here: a gloo function, which means gloo code was inlined into lopper.
  static const std::regex called("^ +U gloo::.*");
  std::istringstream lines(symbols);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_FALSE(std::regex_match(line, defined)) << line;
    EXPECT_FALSE(std::regex_match(line, called)) << line;
  }
  EXPECT_EQ(test::slurp("/proc/self/maps").find("libgloo"), std::string::npos);
}

// ---- dist_options_from_env --------------------------------------------------------------------

class DistributedEnv : public ::testing::Test {
 protected:
  // Every test starts from an environment without torchrun's variables.
  ScopedEnv rank_{"RANK", nullptr}, world_{"WORLD_SIZE", nullptr}, local_{"LOCAL_RANK", nullptr},
      addr_{"MASTER_ADDR", nullptr}, port_{"MASTER_PORT", nullptr};

  static std::string error_of(const std::string& device = "cpu") {
    return test::error_of([&] { dist_options_from_env(device); });
  }
  // The error with the variable `name` set to `value` for the call.
  static std::string error_with(const char* name, const char* value,
                                const std::string& device = "cpu") {
    ScopedEnv e(name, value);
    return error_of(device);
  }
};

TEST_F(DistributedEnv, WorldOneWhenUnset) {
  DistOptions o = dist_options_from_env("cpu");
  EXPECT_EQ(o.world, 1);
  EXPECT_EQ(o.rank, 0);
  EXPECT_EQ(o.device, "cpu");
  ScopedEnv w("WORLD_SIZE", "1"), r("RANK", "0");
  EXPECT_EQ(dist_options_from_env("cpu").world, 1);
}

TEST_F(DistributedEnv, ParsesTorchrunVariables) {
  ScopedEnv w("WORLD_SIZE", "4"), r("RANK", "3"), a("MASTER_ADDR", "10.1.2.3"),
      p("MASTER_PORT", "29511"), l("LOCAL_RANK", "1");
  DistOptions o = dist_options_from_env("cpu");
  EXPECT_EQ(o.world, 4);
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.master_addr, "10.1.2.3");
  EXPECT_EQ(o.master_port, 29511);
  EXPECT_EQ(o.device, "cpu");
  EXPECT_EQ(dist_options_from_env("cuda").device, "cuda:1");    // LOCAL_RANK picks the GPU
  EXPECT_EQ(dist_options_from_env("cuda:0").device, "cuda:0");  // unless one is named
}

TEST_F(DistributedEnv, DefaultsForAddressAndPort) {
  ScopedEnv w("WORLD_SIZE", "2"), r("RANK", "1");
  DistOptions o = dist_options_from_env("cpu");
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
}

TEST_F(DistributedEnv, RejectsMalformedValues) {
  EXPECT_EQ(error_with("WORLD_SIZE", "two"),
            "[dist] WORLD_SIZE must be an integer in [1, 2^31), got 'two'");
  EXPECT_EQ(error_with("WORLD_SIZE", "0"),
            "[dist] WORLD_SIZE must be an integer in [1, 2^31), got '0'");
  ScopedEnv w("WORLD_SIZE", "2");
  EXPECT_EQ(error_of(), "[dist] WORLD_SIZE is 2 but RANK is not set");
  EXPECT_EQ(error_with("RANK", "2"),
            "[dist] RANK must be an integer in [0, WORLD_SIZE=2), got '2'");
  EXPECT_EQ(error_with("RANK", "-1"),
            "[dist] RANK must be an integer in [0, WORLD_SIZE=2), got '-1'");
  ScopedEnv r("RANK", "1");
  EXPECT_EQ(error_with("MASTER_PORT", "12x"),
            "[dist] MASTER_PORT must be an integer in [1, 65535], got '12x'");
  EXPECT_EQ(error_with("MASTER_PORT", "65536"),
            "[dist] MASTER_PORT must be an integer in [1, 65535], got '65536'");
  EXPECT_EQ(error_with("MASTER_ADDR", ""), "[dist] MASTER_ADDR is empty");
  EXPECT_EQ(error_with("LOCAL_RANK", " 1", "cuda"),
            "[dist] LOCAL_RANK must be an integer in [0, 2^31), got ' 1'");
  EXPECT_EQ(error_of("cuda:x"), "[dist] device must be cpu, cuda or cuda:N, got 'cuda:x'");
  EXPECT_EQ(error_of(), "");
}

}  // namespace
}  // namespace lopper
