// Which kernel runs a layer (internal): the candidates are timed on the layer's real input at the
// first inference run and the fastest is kept. Choices are cached per machine in a JSON file, so a
// model loads without timing the second time:
//   $LOPPER_CACHE_DIR, else $XDG_CACHE_HOME/lopper, else $HOME/.cache/lopper: kernels.json
// LOPPER_KERNEL_CACHE=off turns the cache off (every load times its candidates);
// LOPPER_FORCE_KERNEL=name[,name...] runs the first listed kernel a layer has, untimed;
// LOPPER_KERNEL_TRIAL=off turns the trials in the model off (InModelTrial), =all tries every
// runner-up. A choice
// timed while the machine ran slow (a fixed probe before or after the timing more than 1.3x the
// fastest this machine has run) is used for that run and not cached; LOPPER_CHOICE_BUSY=1 / 0
// takes every timing as busy / idle instead of probing (tests).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ops/op.h"

namespace lopper::ops {

/// The generation of lopper's kernels, part of every cached choice's key: bump it when a change
/// makes a kernel materially faster or slower, so that choices timed before are timed again.
inline constexpr int kKernelGeneration = 30;

struct KernelCandidate {
  std::string name;
  std::function<void()> run;
  /// A library's own name for what the candidate runs (oneDNN's primitives: "brg:avx512_core_amx"),
  /// reported with the decision; empty where there is none.
  std::string implementation = {};
};

/// Returns the index of the fastest of `cands` (at least one) on the current input: a warm-up
/// run of each, then the best of up to fifteen rounds over all of them (five, three or one as
/// they take longer; a single candidate is taken untimed). When the model's weights outgrow the
/// last-level cache (OpContext::weights_exceed_cache), the caches are emptied before each timed
/// run: a layer's weights then come from memory at every run of the model, and a kernel that wins
/// on a weight in cache (a dense one, twice the bytes of a 50% sparse one) can lose from memory.
/// The cache key is the machine (CPU model, ISA, threads), the node, the weight's shape and values
/// (hashed; `weight` undefined for an op without one), the input's shape and type, the candidates'
/// names and whether the timing was cold. The decision is reported to the executor
/// (Executor::kernel_decisions). `refused` names the kernels that were considered but could not run
/// here, each with why (they are reported with the decision). `prefer_own`: keep a kernel of
/// lopper's own within 10% of a faster library kernel (see keep_of); off where the candidates are
/// whole sequences of layers timed alike.
size_t choose_kernel(OpContext& c, const std::vector<KernelCandidate>& cands,
                     const at::Tensor& weight, const at::Tensor& input,
                     std::vector<std::string> refused = {}, bool prefer_own = true);

/// choose_kernel's choice, and the runner-up to try in the model where it timed alone within
/// kTrialMargin of the chosen one (InModelTrial).
struct KernelChoice {
  static constexpr size_t kNone = static_cast<size_t>(-1);
  size_t best = 0;
  size_t rival = kNone;
  std::string machine, key;  // the choice's cache entry (empty: not cached)
  size_t decision = kNone;   // its record in the executor's decisions
};

/// choose_kernel, with a trial in the model: where `triable(i)` for the chosen candidate and the
/// fastest other one, and that one's lone time is within kTrialMargin of the chosen one's, the
/// result names it as `rival`. A choice from the cache that a trial already settled has none.
KernelChoice choose_kernel_in_model(OpContext& c, const std::vector<KernelCandidate>& cands,
                                    const at::Tensor& weight, const at::Tensor& input,
                                    const std::function<bool(size_t)>& triable,
                                    std::vector<std::string> refused = {});
inline constexpr double kTrialMargin = 1.35;

/// The chosen kernel and its rival taking turns on a layer's calls in the model, each call timed
/// where it runs: timed alone, on a warm input with its weight in cache, a kernel can win a layer
/// it loses in the model, where its input was just written by the layer before and its weights
/// and scratch come from further out (a bf16 DenseNet's 28x28 3x3 layers: Winograd 0.10 ms
/// alone against the direct kernel's 0.13, 0.16-0.17 against 0.14-0.15 in the model).
class InModelTrial {
 public:
  InModelTrial() = default;
  /// A trial of choice.best against choice.rival (named `best` and `rival`), or none where the
  /// choice has no rival.
  InModelTrial(KernelChoice choice, std::string best, std::string rival);
  bool active() const { return active_; }
  /// Whether the layer's next call runs the rival (the two alternate, the chosen one first).
  bool rival_next() const { return turn_ % 2 == 1; }
  /// Records the time of the call just run (ms). After kTrialCalls calls of each, ends the trial:
  /// reports the medians in the layer's decision (KernelDecision::in_model, `chosen`), caches the
  /// winner, and returns whether the rival won; until then nothing.
  std::optional<bool> record(OpContext& c, double ms);
  static constexpr int kTrialCalls = 4;
  /// A layer's call during its trial: run(k) on the chosen kernel or the rival in turn, timed and
  /// recorded; at the trial's end `kernel` becomes the rival where it won, `rival` becomes `none`
  /// and release() frees what the kept kernel does not run. Returns run(k)'s result.
  template <class K, class Run, class Release>
  auto run_next(OpContext& c, K& kernel, K& rival, K none, Run&& run, Release&& release) {
    const K k = rival_next() ? rival : kernel;
    const auto t0 = std::chrono::steady_clock::now();
    auto y = run(k);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (const std::optional<bool> rival_won = record(c, ms)) {
      if (*rival_won) kernel = rival;
      rival = none;
      release();
    }
    return y;
  }

 private:
  KernelChoice choice_;
  std::string best_name_, rival_name_;
  std::vector<double> best_, rival_;
  int turn_ = 0;
  bool active_ = false;
};

/// Whether a kernel is a library's (ATen's, oneDNN's), not one of lopper's own: its name.
bool library_kernel(const std::string& name);
/// Of candidates `names` timed `t`, the one to keep: the fastest, except that on the CPU
/// (`gpu` false, `prefer_own`) a kernel of lopper's own (its direct, Winograd, chain and GEMV
/// kernels, its sparse formats) within 10% of a faster library kernel is kept instead.
size_t keep_of(const std::vector<std::string>& names, const std::vector<double>& t, bool gpu,
               bool prefer_own);

/// Writes the choices timed since the last call to the cache file (Executor::run calls it after
/// each run, and the process at its exit): a model's first run writes the file once, not once a
/// layer. The file keeps the current kernel generation's choices only, at most kMaxChoices a
/// machine (the newest).
void flush_kernel_choices();

/// The machine's speed now: a fixed piece of arithmetic on each of `threads` threads (1: on the
/// calling thread), in ms, best of three. A busy machine (another process on a core, a VM whose
/// host takes its cycles) runs it slower.
double probe_ms(int threads);
inline constexpr size_t kMaxChoices = 4096;

/// Whether LOPPER_FORCE_KERNEL names `name` when it names kernels (tests and end-to-end
/// comparisons of kernels); nothing when it does not.
std::optional<bool> kernel_forced(const std::string& name);

}  // namespace lopper::ops
