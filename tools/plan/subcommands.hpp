// xpipe-plan's subcommands, a file each in tools/plan/: each adds itself to the CLI11 app and
// returns how to run it; main (tools/xpipe_plan.cpp) parses and runs the one named.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace xpipe::tools::plan {

//! A subcommand added to the app. `cli` is true once the command line named it; `run` does it
//! and returns the exit code (0, or 3 where a check's error exceeds --max-error); bad input
//! throws UsageError (exit 2), any other failure another exception (exit 1).
//! Usage: `const Subcommand s = add_simulate(app); app.parse(argc, argv); if (*s.cli) s.run();`
struct Subcommand {
  CLI::App* cli;
  std::function<int()> run;
};

Subcommand add_profile(CLI::App& app);             // profile.cpp
Subcommand add_validate(CLI::App& app);            // validate.cpp
Subcommand add_plan(CLI::App& app);                // plan.cpp
Subcommand add_measure_efficiency(CLI::App& app);  // measure_efficiency.cpp
Subcommand add_simulate(CLI::App& app);            // simulate.cpp
Subcommand add_check_plan(CLI::App& app);          // check_plan.cpp
Subcommand add_check_mpi(CLI::App& app);           // check_mpi.cpp

}  // namespace xpipe::tools::plan
