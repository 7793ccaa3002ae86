// What the requests' rules share (src/command, internal).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lopper/command.h"
#include "lopper/error.h"
#include "lopper/prune.h"

namespace lopper::command {

/// `name` marked as an option (LOPPER_OPTION) in a message.
inline std::string opt(const std::string& name) { return "\x1e" + name + "\x1f"; }

/// Runs `f`: what the library's checks of the options throw is the user's mistake (UsageError).
template <typename F>
auto as_usage(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.render(opt));
  }
}

/// Refuses an `exclude` that is not a valid regex (regex_error), in `op`'s words ("prune").
inline void check_exclude(const char* op, const std::string& exclude) {
  if (const std::string e = regex_error(exclude); !e.empty())
    throw UsageError(std::string("[") + op + "] " + opt("exclude") + " '" + exclude +
                     "' is not a valid regex: " + e);
}

/// Says what load_warnings finds in `m` (read from `path`) to `warn`, one line each.
void say_warnings(const ir::Model& m, const std::string& path, const Warn& warn);

/// A sweep's or a target's `structured`: "channel", "block" or "channel,block" (either order) ->
/// (channel groups, residual blocks); anything else is refused, the message starting "[op]".
std::pair<bool, bool> structured_units(const char* op, const std::string& structured);

/// local (the default) | global; anything else is refused.
PruneScope scope_of(const std::optional<std::string>& scope);

/// Refuses each of the data options given (library names) when nothing reads data: the
/// `criteria` that rank by data do. A report that reads the data (`report`) keeps them, but for
/// the calibration's batch count.
void refuse_data_options(const std::vector<std::string>& given, bool report, bool offers_report,
                         const std::vector<CriterionInfo>& criteria);

/// Refuses each option of pruning to a target given without a target (library names):
/// `sensitivity`, and `eval_batches` unless a report reads them (`report`).
void refuse_target_options(const std::vector<std::string>& given, bool report);

/// The one-shot options of a sweep or a target (`whose`: "a target with " or ""): `batches` for
/// the criteria that read the layers' inputs (at least 1), `block_size` and `dampening` for
/// sparsegpt; `op` names the place ("prune").
void check_one_shot(const char* op, const std::string& whose, const std::string& criterion,
                    bool reads_inputs, const std::optional<int64_t>& batches, bool block_size,
                    bool dampening);

}  // namespace lopper::command
