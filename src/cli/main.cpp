#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <iostream>

#include "cli/commands.h"
#include "cli/report.h"
#include "lopper/error.h"

int main(int argc, char** argv) {
  lopper::cli::set_command_line(argc, argv);
  CLI::App app{"lopper: prune trained neural networks (ONNX) and prove the gain"};
  app.set_version_flag("--version", std::string("lopper ") + LOPPER_VERSION);
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, lopper::cli::Action>> commands;
  auto add = [&](lopper::cli::Action (*f)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    auto action = f(app);
    commands.emplace_back(app.get_subcommands({})[before], action);
  };
  add(lopper::cli::add_inspect);
  add(lopper::cli::add_run);
  add(lopper::cli::add_bench);
  add(lopper::cli::add_convert);
  add(lopper::cli::add_prune);
  add(lopper::cli::add_train);
  add(lopper::cli::add_finetune);
  add(lopper::cli::add_eval);
  add(lopper::cli::add_compare);
  add(lopper::cli::add_sensitivity);
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (auto& [sub, action] : commands) {
      known |= sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::cerr << "lopper: unknown command '" << argv[1] << "' (commands: " << names << ")\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "lopper: " << e.what() << " (see lopper --help)\n";
    return 2;
  }
  try {
    for (auto& [sub, action] : commands)
      if (sub->parsed()) return action();
  } catch (const lopper::UsageError& e) {
    std::cerr << "lopper: " << e.what() << "\n";
    return 2;
  } catch (const lopper::Error& e) {
    std::cerr << "lopper: " << e.what() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    std::cerr << "lopper: " << msg.substr(0, msg.find('\n')) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "lopper: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
