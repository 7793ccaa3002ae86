// Subcommands of the lopper CLI: each adds itself to the app and returns the action to run.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace lopper::cli {

using Action = std::function<int()>;

Action add_inspect(CLI::App& app);
Action add_run(CLI::App& app);
Action add_bench(CLI::App& app);
Action add_convert(CLI::App& app);
Action add_prune(CLI::App& app);
Action add_train(CLI::App& app);
Action add_finetune(CLI::App& app);
Action add_eval(CLI::App& app);
Action add_compare(CLI::App& app);
Action add_sensitivity(CLI::App& app);

}  // namespace lopper::cli
