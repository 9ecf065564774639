// xpipe-plan: the simulator and planner from the command line.
//   xpipe-plan profile            measure the reference MLP's layers -> model JSON
//   xpipe-plan validate           simulated vs measured (threaded executor) time per mini-batch
//   xpipe-plan plan               rank dp x pp x M x schedule for a cluster by time to accuracy
//   xpipe-plan measure-efficiency epochs to a target accuracy vs global batch -> E(B) JSON
//   xpipe-plan simulate           one schedule under a cost model: traces, and bubble filling
//   xpipe-plan check-plan         the planner's step times against runs on this machine
//   xpipe-plan check-mpi          the same with the MPI executor, a rank per device (mpirun -np 2)
// Each is a file of tools/plan/. Bad input (flags, JSON fields) is exit 2 with a message naming
// the flag or field.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <vector>

#include "plan/common.hpp"
#include "plan/subcommands.hpp"

using namespace xpipe::tools::plan;

int main(int argc, char** argv) {
  CLI::App app{
      "xpipe-plan: simulate pipeline schedules, validate the simulator against the "
      "threaded executor, and plan dp x pp x M x schedule by time to accuracy and cost"};
  app.require_subcommand(1);
  // In the order --help lists them (a braced list is evaluated left to right).
  const std::vector<Subcommand> subcommands{
      add_profile(app),  add_validate(app),   add_plan(app),     add_measure_efficiency(app),
      add_simulate(app), add_check_plan(app), add_check_mpi(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return e.get_exit_code() == 0 ? code : 2;  // --help is 0; every bad flag is 2
  }
  try {
    for (const Subcommand& s : subcommands)
      if (*s.cli) return s.run();
    return 2;  // not reached: require_subcommand(1) made the parse fail without one
  } catch (const UsageError& e) {
    std::fprintf(stderr, "xpipe-plan: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xpipe-plan: %s\n", e.what());
    return 1;
  }
}
