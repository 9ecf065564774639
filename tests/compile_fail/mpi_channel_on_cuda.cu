// Must not compile: MpiChannel hands its slots' addresses to MPI and tests the requests on the
// host, so a pipeline whose buffers live on a GPU cannot use it; the message names what to
// use instead, rather than pass device pointers to a host MPI at run time.
#include <xpipe/exec/mpi.hpp>
#include <xpipe/xpipe_cuda.cuh>

using namespace xpipe;

using Front = Stage<Linear<8, 4>, ReLU>;
using Back = Stage<Linear<4, 3>>;

void train(const Schedule& s, EpochData data) {
  Pipeline<Front, Back, Latest, Adam, MpiChannel, Cuda> p(Adam{}, {.batch = 16});
  MpiExecutor e;
  p.train(s, data, e);
}
