// Which kernel runs a layer (internal): the candidates are timed on the layer's real input at the
// first inference run and the fastest is kept. Choices are cached per machine in a JSON file, so a
// model loads without timing the second time:
//   $LOPPER_CACHE_DIR, else $XDG_CACHE_HOME/lopper, else $HOME/.cache/lopper: kernels.json
// LOPPER_KERNEL_CACHE=off turns the cache off (every load times its candidates);
// LOPPER_FORCE_KERNEL=name[,name...] runs the first listed kernel a layer has, untimed. A choice
// timed while the machine ran slow (a fixed probe before or after the timing more than 1.3x the
// fastest this machine has run) is used for that run and not cached; LOPPER_CHOICE_BUSY=1 / 0
// takes every timing as busy / idle instead of probing (tests).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ops/op.h"

namespace lopper::ops {

/// The generation of lopper's kernels, part of every cached choice's key: bump it when a change
/// makes a kernel materially faster or slower, so that choices timed before are timed again.
inline constexpr int kKernelGeneration = 27;

struct KernelCandidate {
  std::string name;
  std::function<void()> run;
};

/// Returns the index of the fastest of `cands` (at least one) on the current input: a warm-up
/// run of each, then the best of up to fifteen rounds over all of them (five, three or one as
/// they take longer; a single candidate is taken untimed). When the model's weights outgrow the
/// last-level cache (OpContext::weights_exceed_cache), the caches are emptied before each timed
/// run: a layer's weights then come from memory at every run of the model, and a kernel that wins
/// on a weight in cache (a dense one, twice the bytes of a 50% sparse one) can lose from memory.
/// The cache key is the machine (CPU model, ISA, threads), the node, the weight's shape and values
/// (hashed), the input's shape and type, the candidates' names and whether the timing was cold. The
/// decision is reported to the executor (Executor::kernel_decisions).
/// `refused` names the kernels that were considered but could not run here, each with why (they
/// are reported with the decision). `prefer_own`: keep a kernel of lopper's own within 10% of a
/// faster library kernel (see keep_of); off where the candidates are whole sequences of layers
/// timed alike.
size_t choose_kernel(OpContext& c, const std::vector<KernelCandidate>& cands,
                     const at::Tensor& weight, const at::Tensor& input,
                     std::vector<std::string> refused = {}, bool prefer_own = true);

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
