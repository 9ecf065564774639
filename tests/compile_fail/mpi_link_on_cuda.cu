// Must not compile: MpiLink hands its slots' addresses to MPI and tests the requests on the host,
// so a queue policy that names it for a backend whose buffers live on a GPU is refused; the
// message names what to use instead (MpiChannel names StagedMpiLink there), rather than pass
// device pointers to a host MPI at run time.
#include <xpipe/exec/mpi.hpp>
#include <xpipe/xpipe_cuda.cuh>

using namespace xpipe;

using Front = Stage<Linear<8, 4>, ReLU>;
using Back = Stage<Linear<4, 3>>;

struct HostSlotsOnly {  // MpiLink for every backend, the device's included
  template <class B>
  using queue = MpiLink<B>;
  static constexpr const char* name = "host-slots-only";
};

void train(const Schedule& s, EpochData data) {
  Pipeline<Front, Back, Latest, Adam, HostSlotsOnly, Cuda> p(Adam{}, {.batch = 16});
  MpiExecutor e;
  p.train(s, data, e);
}
