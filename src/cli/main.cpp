#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <csignal>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "common.h"
#include "lopper/error.h"
#include "lopper/memory.h"
#include "report.h"

int main(int argc, char** argv) {
  // NOTE: a write past the file-size limit (ulimit -f) then fails with EFBIG on the ordinary error
  // path (one line, temporaries removed) instead of SIGXFSZ killing the process mid-write.
  std::signal(SIGXFSZ, SIG_IGN);
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
    for (auto& [sub, action] : commands) {
      if (!sub->parsed()) continue;
      lopper::cli::load_cuda_if_asked(*sub);
      return action();
    }
  } catch (const lopper::Error& e) {
    // One line, whatever the message holds: its lines (a name with a newline in it, a message
    // wrapped from a library) are joined.
    std::string msg, line;
    std::istringstream lines(e.render(lopper::cli::flag_of));  // options as their flags
    while (std::getline(lines, line))
      if (!(line = lopper::first_line(line)).empty()) msg += (msg.empty() ? "" : " ") + line;
    std::cerr << "lopper: " << msg << "\n";
    return dynamic_cast<const lopper::UsageError*>(&e) ? 2 : 1;
  } catch (const lopper::OutOfMemory& e) {
    std::cerr << "lopper: [memory] out of memory allocating " << lopper::human_bytes(e.bytes())
              << " (this machine has " << lopper::human_bytes(lopper::memory_bytes()) << ")\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "lopper: [memory] out of memory (this machine has "
              << lopper::human_bytes(lopper::memory_bytes()) << ")\n";
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // "filesystem error: cannot create directories: Not a directory [out]" ->
    // "[io] cannot create directories 'out': Not a directory"
    std::string what = e.what(), reason = e.code().message();
    const std::string prefix = "filesystem error: ";
    if (what.rfind(prefix, 0) == 0) what = what.substr(prefix.size());
    size_t cut = what.find(": " + reason);
    std::string op = lopper::first_line(cut == std::string::npos ? what : what.substr(0, cut));
    std::cerr << "lopper: [io] " << op;
    if (!e.path1().empty()) std::cerr << " '" << lopper::first_line(e.path1().string()) << "'";
    if (!e.path2().empty()) std::cerr << " -> '" << lopper::first_line(e.path2().string()) << "'";
    std::cerr << ": " << reason << "\n";
    return 1;
  } catch (const lopper::InternalError& e) {
    std::cerr << "lopper: " << lopper::first_line(e.what())
              << " (please report it with the command that led here)\n";
    return 3;
  } catch (const c10::Error& e) {
    std::cerr << "lopper: " << lopper::first_line(e.what_without_backtrace()) << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "lopper: " << lopper::first_line(e.what()) << "\n";
    return 1;
  }
  return 0;
}
