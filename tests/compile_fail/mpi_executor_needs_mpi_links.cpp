// A Pipeline whose links are in-process rings handed to the MPI executor: it must fail to
// compile with a message naming the QueuePolicy to use.
#include "xpipe/exec/mpi.hpp"
#include "xpipe/xpipe.hpp"

int main() {
  using namespace xpipe;
  Pipeline<Stage<Linear<4, 4>>, Stage<Linear<4, 2>>> pipe;  // InProcessRing links
  MpiExecutor exec;
  pipe.train(gpipe(2, 1, 1), EpochData{}, exec);
}
