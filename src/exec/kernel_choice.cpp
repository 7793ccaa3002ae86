#include "exec/kernel_choice.h"

#include <ATen/Parallel.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "kernels/cpu/sparse.h"
#include "kernels/cuda/library.h"
#include "lopper/files.h"
#include "lopper/memory.h"

namespace lopper::ops {
namespace {

// FNV-1a over 64-bit words (and the tail bytes): a weight's identity, not a security hash.
uint64_t hash_bytes(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown cpu";
}

std::string shape_key(at::IntArrayRef s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += 'x';
    out += std::to_string(s[i]);
  }
  return out;
}

// The per-machine cache of choices: one JSON object per machine, layer key -> choice.
class ChoiceCache {
 public:
  static ChoiceCache& get() {
    static ChoiceCache cache;
    return cache;
  }

  std::optional<nlohmann::json> find(const std::string& machine, const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    load();
    auto m = data_.find(machine);
    if (m == data_.end() || !m->is_object()) return std::nullopt;
    auto k = m->find(key);
    if (k == m->end() || !k->is_object()) return std::nullopt;
    return *k;
  }

  // Kept in memory until flush(): a model's first run times many layers, and each write of the
  // file read and wrote it whole.
  void put(const std::string& machine, const std::string& key, nlohmann::json value) {
    std::lock_guard<std::mutex> lock(mu_);
    load();
    value["at"] = static_cast<int64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count());
    if (!data_[machine].is_object()) data_[machine] = nlohmann::json::object();
    data_[machine][key] = value;
    if (!path_.empty()) pending_[machine][key] = std::move(value);
  }

  // Writes the choices made since the last flush.
  // NOTE: merged into what another process may have written since; a cache that cannot be
  // written only costs the timing again next time, so failures are silent.
  void flush() {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty() || path_.empty()) return;
    try {
      nlohmann::json disk = read_json();
      for (const auto& [machine, keys] : pending_.items()) {
        if (!disk[machine].is_object()) disk[machine] = nlohmann::json::object();
        for (const auto& [key, value] : keys.items()) disk[machine][key] = value;
      }
      bound(disk);
      std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
      write_file_atomic(path_, disk.dump(1));
      data_ = std::move(disk);
    } catch (const std::exception&) {
    }
    pending_ = nlohmann::json::object();
  }

  ~ChoiceCache() { flush(); }

 private:
  // Choices of other kernel generations are dropped (never read again: the generation is part of
  // the machine), and each machine keeps its kMaxChoices newest.
  // NOTE: one session's benchmarks and tests left 10,686 choices of an older generation (2.2 of
  // the file's 2.7 MB): parsing it cost every run of lopper 0.12 s before its first layer.
  static void bound(nlohmann::json& cache) {
    const std::string current = " | kernels " + std::to_string(kKernelGeneration);
    for (auto it = cache.begin(); it != cache.end();) {
      const std::string& machine = it.key();
      const size_t at = machine.rfind(" | kernels ");
      const bool stale = at != std::string::npos && machine.compare(at, std::string::npos, current);
      if (stale || !it->is_object()) {
        it = cache.erase(it);
        continue;
      }
      if (it->size() > kMaxChoices) {
        std::vector<std::pair<int64_t, std::string>> by_age;
        for (const auto& [key, value] : it->items())
          if (key != "probe")
            by_age.emplace_back(value.is_object() ? value.value("at", int64_t{0}) : 0, key);
        std::sort(by_age.begin(), by_age.end());
        const size_t excess = std::min(it->size() - kMaxChoices, by_age.size());
        for (size_t i = 0; i < excess; ++i) it->erase(by_age[i].second);
      }
      ++it;
    }
  }

  void load() {
    if (loaded_) return;
    loaded_ = true;
    const char* off = std::getenv("LOPPER_KERNEL_CACHE");
    if (off && (std::string(off) == "off" || std::string(off) == "0")) return;
    std::string dir;
    if (const char* d = std::getenv("LOPPER_CACHE_DIR"); d && *d) {
      dir = d;
    } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
      dir = std::string(x) + "/lopper";
    } else if (const char* h = std::getenv("HOME"); h && *h) {
      dir = std::string(h) + "/.cache/lopper";
    } else {
      return;
    }
    path_ = dir + "/kernels.json";
    // NOTE: the cache is lopper's own file: anything else in its place (a folder, a FIFO, which an
    // open would block on) is left alone, with one warning, and this run keeps its choices in
    // memory only; a file that does not parse, or parses into another shape, is rebuilt.
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      std::cerr << "lopper: warning: [kernels] the kernel cache '" << path_
                << "' is not a regular file: ignored (kernel choices are timed again)\n";
      path_.clear();
      return;
    }
    data_ = read_json();
    bound(data_);
  }

  // The cache's JSON, "{}" when it is missing, unreadable, not a regular file or not an object.
  // Entries of another shape are dropped by bound() or never matched by find().
  nlohmann::json read_json() const {
    std::string bytes;
    try {
      bytes = read_file(path_);
    } catch (const std::exception&) {
      return nlohmann::json::object();
    }
    nlohmann::json j = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
    return j.is_object() ? j : nlohmann::json::object();  // a corrupt cache is rebuilt
  }

  std::mutex mu_;
  bool loaded_ = false;
  std::string path_;
  nlohmann::json data_ = nlohmann::json::object();
  nlohmann::json pending_ = nlohmann::json::object();  // machine -> key -> choice, not yet written
};

// Reads a buffer twice the size of the last-level cache, so that what a kernel reads next comes
// from memory, as it does in a model whose weights outgrow the cache.
void evict_caches() {
  static const std::vector<int64_t> buffer(
      std::max<int64_t>(last_level_cache_bytes(), int64_t{1} << 20) * 2 / sizeof(int64_t), 1);
  constexpr int64_t kLine = 64 / sizeof(int64_t);  // one read per cache line
  std::atomic<int64_t> sink{0};
  at::parallel_for(0, static_cast<int64_t>(buffer.size()) / kLine, 1 << 14,
                   [&](int64_t begin, int64_t end) {
                     int64_t sum = 0;
                     for (int64_t i = begin; i < end; ++i) sum += buffer[i * kLine];
                     sink += sum;
                   });
  static std::atomic<int64_t> keep{0};  // the reads have an effect the compiler must keep
  keep += sink.load();
}

// Best time of each candidate over rounds that visit every candidate in turn, after a warm-up of
// each: a burst of noise from elsewhere on the machine then hits all candidates alike. `cold`:
// the caches are emptied before each timed run (the model's weights outgrow them).
// NOTE: layers whose candidates take long together get fewer rounds, so that the first run of a
// big model at a big batch stays a few times a normal run.
std::vector<double> time_round_robin(const std::vector<KernelCandidate>& cands, bool gpu,
                                     bool cold) {
  // On a GPU a run only queues work: wait for it, or the times say nothing.
  auto run = [gpu](const KernelCandidate& k) {
    k.run();
    if (gpu) kernels::cuda::need_library().synchronize();
  };
  auto start = std::chrono::steady_clock::now();
  for (const auto& k : cands) run(k);  // first-touch allocations, primitive creation
  const double warm_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  // NOTE: a small layer's best of five was no better than the machine's bursts: RegNet's seven
  // identical 14x14 grouped layers timed 0.097-0.156 ms for one kernel, and three of them took the
  // other (slower in the model). Layers whose candidates take under 2 ms together get fifteen.
  const int rounds = warm_ms < 2 ? 15 : warm_ms < 20 ? 5 : warm_ms < 200 ? 3 : 1;
  std::vector<double> best(cands.size(), 1e30);
  for (int round = 0; round < rounds; ++round)
    for (size_t i = 0; i < cands.size(); ++i) {
      if (cold) evict_caches();
      auto t0 = std::chrono::steady_clock::now();
      run(cands[i]);
      best[i] = std::min(
          best[i],
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  return best;
}

}  // namespace

double probe_ms(int threads) {
  auto once = [threads] {
    std::atomic<int64_t> sink{0};
    const auto t0 = std::chrono::steady_clock::now();
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float a[16];
        for (int k = 0; k < 16; ++k) a[k] = float(k + t);
        for (int i = 0; i < 25000; ++i)
          for (int k = 0; k < 16; ++k) a[k] = a[k] * 0.999f + 0.5f;
        int64_t sum = 0;
        for (float v : a) sum += static_cast<int64_t>(v);
        sink += sum;
      }
    };
    if (threads <= 1)
      work(0, 1);
    else
      at::parallel_for(0, threads, 1, work);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    static std::atomic<int64_t> keep{0};  // the arithmetic has an effect the compiler must keep
    keep += sink.load();
    return ms;
  };
  return std::min({once(), once(), once()});
}

namespace {

// How much slower than the fastest probe this machine has run a choice's probes may be and still
// be kept in the cache: a choice timed in a slow spell (a kernel whose threads wait on a stolen
// core loses more than one that does not) is used for this run only, and timed again next time.
constexpr double kBusyFactor = 1.3;

// LOPPER_FORCE_KERNEL=name[,name...]: the first listed candidate a layer has runs it, untimed (for
// tests and for comparing kernels end to end).
size_t forced(const std::vector<KernelCandidate>& cands) {
  const char* env = std::getenv("LOPPER_FORCE_KERNEL");
  if (!env || !*env) return cands.size();
  std::string list = env;
  for (size_t pos = 0; pos <= list.size();) {
    size_t comma = std::min(list.find(',', pos), list.size());
    std::string name = list.substr(pos, comma - pos);
    for (size_t i = 0; i < cands.size(); ++i)
      if (cands[i].name == name) return i;
    pos = comma + 1;
  }
  return cands.size();
}

}  // namespace

// NOTE: timed alone, a layer's candidates run on a warm input; in the model, between a producer
// that just wrote the input and the next layer, oneDNN's convolutions ran slower than their lone
// times said while lopper's direct kernels did not: MobileNetV2's first layer 0.36 vs 0.27 ms and
// its 16->96 pointwise layer 0.36 vs 0.26 ms in the model, after lone times 3-7% apart the
// other way.
constexpr double kOwnMargin = 1.10;

bool library_kernel(const std::string& name) {
  return name == "aten" || name.rfind("onednn", 0) == 0;
}

size_t keep_of(const std::vector<std::string>& names, const std::vector<double>& t, bool gpu,
               bool prefer_own) {
  size_t best = 0;
  for (size_t i = 0; i < names.size(); ++i)
    if (t[i] < t[best]) best = i;
  auto own = [&](size_t i) { return !library_kernel(names[i]); };
  if (gpu || !prefer_own || own(best)) return best;
  size_t own_best = names.size();
  for (size_t i = 0; i < names.size(); ++i)
    if (own(i) && (own_best == names.size() || t[i] < t[own_best])) own_best = i;
  return own_best < names.size() && t[own_best] <= t[best] * kOwnMargin ? own_best : best;
}

void flush_kernel_choices() { ChoiceCache::get().flush(); }

std::optional<bool> kernel_forced(const std::string& name) {
  const char* env = std::getenv("LOPPER_FORCE_KERNEL");
  if (!env || !*env) return std::nullopt;
  return forced({{name, {}}}) == 0;
}

namespace {

// choose_kernel's work: the choice, its cache entry, its decision record, and each candidate's
// lone time where known (timed now or cached; empty otherwise), and whether a trial in the model
// already settled a cached choice.
struct Chosen {
  KernelChoice choice;
  std::vector<double> ms;
  bool settled = false;
};

Chosen choose(OpContext& c, const std::vector<KernelCandidate>& cands, const at::Tensor& weight,
              const at::Tensor& input, std::vector<std::string> refused, bool prefer_own) {
  Chosen out;
  auto report = [&](KernelDecision& d, size_t best) {
    out.choice.best = best;
    if (c.decisions_) {
      out.choice.decision = c.decisions_->size();
      c.decisions_->push_back(std::move(d));
    }
    return out;
  };
  KernelDecision d;
  d.refused = std::move(refused);
  for (const auto& k : cands)
    if (!k.implementation.empty()) d.implementations.emplace_back(k.name, k.implementation);
  d.node = c.node().label();
  d.op = c.node().op_type;
  if (weight.defined()) d.weight_shape = weight.sizes().vec();
  d.cold = !input.is_cuda() && c.weights_exceed_cache();
  d.input_shape = input.sizes().vec();
  // hashed below (an op without a weight: an empty one)
  at::Tensor w = weight.defined() ? weight.to(at::kCPU).contiguous() : at::empty({0});
  const int64_t numel = w.numel();
  d.sparsity = numel ? 1.0 - double(kernels::cpu::count_nonzero(w)) / double(numel) : 0.0;

  if (cands.size() == 1) {  // nothing to choose: no timing, no cache entry
    d.chosen = cands[0].name;
    return report(d, 0);
  }
  size_t best = forced(cands);
  if (best < cands.size()) {
    d.chosen = cands[best].name + " (forced)";
    return report(d, best);
  }
  // NOTE: the kernels' generation is part of the machine: choices timed with older kernels are
  // not reused after an upgrade that changed them.
  static const std::string cpu_machine = cpu_model() + " | " +
                                         kernels::cpu::isa_name(kernels::cpu::active_isa()) +
                                         " | kernels " + std::to_string(kKernelGeneration);
  const std::string machine =
      input.is_cuda() ? kernels::cuda::need_library().device_name(input.device().index()) +
                            " | kernels " + std::to_string(kKernelGeneration)
                      : cpu_machine;
  std::string names;
  for (const auto& k : cands) names += k.name + ",";
  const std::string key = d.node + "|" + shape_key(w.sizes()) + "|" +
                          std::to_string(hash_bytes(w.data_ptr(), w.nbytes())) + "|" +
                          shape_key(input.sizes()) + "|" + c10::toString(input.scalar_type()) +
                          "|t" + std::to_string(at::get_num_threads()) + "|" + names +
                          (d.cold ? "|cold" : "");
  if (const std::optional<nlohmann::json> hit = ChoiceCache::get().find(machine, key)) {
    const auto kernel = hit->find("kernel");
    const std::string chosen =
        kernel != hit->end() && kernel->is_string() ? kernel->get<std::string>() : "";
    for (size_t i = 0; i < cands.size(); ++i)
      if (cands[i].name == chosen) best = i;
    d.cached = best < cands.size();
    if (d.cached && hit->contains("ms") && (*hit)["ms"].is_object()) {
      const nlohmann::json& ms = (*hit)["ms"];
      out.ms.assign(cands.size(), 0.0);
      for (size_t i = 0; i < cands.size(); ++i)
        if (ms.contains(cands[i].name) && ms[cands[i].name].is_number()) {
          out.ms[i] = ms[cands[i].name].get<double>();
          d.timings.emplace_back(cands[i].name, out.ms[i]);
        }
    }
    if (d.cached && hit->contains("in_model") && (*hit)["in_model"].is_object()) {
      out.settled = true;
      for (const auto& [name, ms] : (*hit)["in_model"].items())
        if (ms.is_number()) d.in_model.emplace_back(name, ms.get<double>());
    }
  }
  if (best == cands.size()) {
    // NOTE: the machine's speed probed before and after the timing, against the best probe this
    // machine has run (kept in the cache); LOPPER_CHOICE_BUSY=1 / 0 says busy / idle instead (for
    // tests).
    const bool gpu = input.is_cuda();
    const char* busy_env = std::getenv("LOPPER_CHOICE_BUSY");
    const bool probe = !gpu && !(busy_env && *busy_env);
    const double before = probe ? probe_ms(at::get_num_threads()) : 0;
    std::vector<double> t = time_round_robin(cands, input.is_cuda(), d.cold);
    const double after = probe ? probe_ms(at::get_num_threads()) : 0;
    if (busy_env && *busy_env) {
      d.busy = std::string(busy_env) == "1";
    } else if (probe) {
      const std::optional<nlohmann::json> known = ChoiceCache::get().find(machine, "probe");
      double fastest = 0;
      if (known)
        if (const auto ms = known->find("ms"); ms != known->end() && ms->is_number())
          fastest = ms->get<double>();
      d.busy = fastest > 0 && std::max(before, after) > kBusyFactor * fastest;
      if (fastest == 0 || std::min(before, after) < fastest)
        ChoiceCache::get().put(machine, "probe", {{"ms", std::min(before, after)}});
    }
    nlohmann::json ms = nlohmann::json::object();
    for (size_t i = 0; i < cands.size(); ++i) {
      d.timings.emplace_back(cands[i].name, t[i]);
      ms[cands[i].name] = t[i];
    }
    std::vector<std::string> names;
    for (const auto& cand : cands) names.push_back(cand.name);
    best = keep_of(names, t, input.is_cuda(), prefer_own);
    out.ms = t;
    if (!d.busy) {
      ChoiceCache::get().put(machine, key, {{"kernel", cands[best].name}, {"ms", ms}});
      out.choice.machine = machine, out.choice.key = key;
    }
  } else {
    out.choice.machine = machine, out.choice.key = key;
  }
  d.chosen = cands[best].name;
  return report(d, best);
}

}  // namespace

size_t choose_kernel(OpContext& c, const std::vector<KernelCandidate>& cands,
                     const at::Tensor& weight, const at::Tensor& input,
                     std::vector<std::string> refused, bool prefer_own) {
  return choose(c, cands, weight, input, std::move(refused), prefer_own).choice.best;
}

KernelChoice choose_kernel_in_model(OpContext& c, const std::vector<KernelCandidate>& cands,
                                    const at::Tensor& weight, const at::Tensor& input,
                                    const std::function<bool(size_t)>& triable,
                                    std::vector<std::string> refused) {
  Chosen out = choose(c, cands, weight, input, std::move(refused), true);
  KernelChoice& ch = out.choice;
  // LOPPER_KERNEL_TRIAL=off: no trials; =all: every runner-up is tried, whatever its lone time
  // (tests, and comparing the choices end to end).
  const char* env = std::getenv("LOPPER_KERNEL_TRIAL");
  const std::string mode = env ? env : "";
  if (mode == "off" || out.settled || out.ms.size() != cands.size() || !triable(ch.best)) return ch;
  size_t rival = KernelChoice::kNone;
  for (size_t i = 0; i < cands.size(); ++i)
    if (i != ch.best && out.ms[i] > 0 &&
        (rival == KernelChoice::kNone || out.ms[i] < out.ms[rival]))
      rival = i;
  if (rival != KernelChoice::kNone && triable(rival) && out.ms[ch.best] > 0 &&
      (mode == "all" || out.ms[rival] <= kTrialMargin * out.ms[ch.best])) {
    ch.rival = rival;
    if (c.decisions_ && ch.decision < c.decisions_->size())
      (*c.decisions_)[ch.decision].in_trial = true;
  }
  return ch;
}

InModelTrial::InModelTrial(KernelChoice choice, std::string best, std::string rival)
    : choice_(std::move(choice)),
      best_name_(std::move(best)),
      rival_name_(std::move(rival)),
      active_(choice_.rival != KernelChoice::kNone) {}

std::optional<bool> InModelTrial::record(OpContext& c, double ms) {
  if (!active_) return std::nullopt;
  (turn_++ % 2 == 1 ? rival_ : best_).push_back(ms);
  if (static_cast<int>(rival_.size()) < kTrialCalls) return std::nullopt;
  active_ = false;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  const double b = median(best_), r = median(rival_);
  const bool rival_won = r < b;
  const std::string& winner = rival_won ? rival_name_ : best_name_;
  if (c.decisions_ && choice_.decision < c.decisions_->size()) {
    KernelDecision& d = (*c.decisions_)[choice_.decision];
    d.in_model = {{best_name_, b}, {rival_name_, r}};
    d.chosen = winner;
    d.in_trial = false;
  }
  if (!choice_.key.empty()) {
    std::optional<nlohmann::json> entry = ChoiceCache::get().find(choice_.machine, choice_.key);
    nlohmann::json value = entry ? *entry : nlohmann::json::object();
    value["kernel"] = winner;
    value["in_model"] = {{best_name_, b}, {rival_name_, r}};
    ChoiceCache::get().put(choice_.machine, choice_.key, value);
  }
  return rival_won;
}

}  // namespace lopper::ops
