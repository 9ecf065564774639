// What both kinds of MPI link share (comm/mpi_link.hpp: slots in host memory; comm/
// mpi_staged_link.hpp: device slots staged through pinned host memory): MPI's errors, which end
// of a link a rank holds, how it is wired, the tags of its messages, and whether the library is
// CUDA-aware. Needs <mpi.h>.
#pragma once

#include <mpi.h>
#if defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

#include <string>
#include <vector>

#include "xpipe/core/error.hpp"

namespace xpipe {

//! An MPI call that failed (communicators use MPI_ERRORS_RETURN), with MPI's own text.
class MpiError : public Error {
 public:
  using Error::Error;
};

namespace detail {
inline void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, text, &n);
  throw MpiError(std::string("xpipe: ") + call + " failed: " + std::string(text, n));
}
}  // namespace detail

//! Checks an MPI call's return code; throws MpiError naming the call and MPI's reason.
#define XPIPE_MPI_CHECK(call) ::xpipe::detail::mpi_check((call), #call)

//! Whether the MPI library says it sends and receives CUDA device memory itself (CUDA-aware):
//! Open MPI built with CUDA (MPIX_CUDA_AWARE_SUPPORT) asked at run time
//! (MPIX_Query_cuda_support); false for any other library, and for Open MPI as Debian builds it.
inline bool mpi_cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

//! Which end of a link this rank holds: it sends (Producer), receives (Consumer), both (the
//! two stages are its own: a ring in memory, no MPI), or neither.
enum class LinkRole : unsigned char { None, Producer, Consumer, Both };

//! The tag of micro-batch g's message in `direction` on `lane` of `lanes`: 2 (lanes g + lane) +
//! direction, g wrapped below tag_ub (the receives in flight on one link are a few apart, never
//! 2^20 / lanes, so a wrapped tag is never ambiguous). One lane: 2g + direction.
inline int mpi_link_tag(int g, int direction, int tag_ub, int lane = 0, int lanes = 1) {
  const int per_g = 2 * lanes;
  const int wrap = tag_ub < (1 << 21) ? (tag_ub + 1) / per_g : (1 << 20) / lanes;
  return per_g * (g % wrap) + 2 * lane + direction;
}

//! The largest tag MPI allows on `comm` (MPI_TAG_UB; 32767, the least the standard promises,
//! when the attribute is missing).
inline int mpi_tag_upper_bound(MPI_Comm comm) {
  int* ub = nullptr;
  int flag = 0;
  XPIPE_MPI_CHECK(MPI_Comm_get_attr(comm, MPI_TAG_UB, &ub, &flag));
  return flag && ub ? *ub : 32767;
}

//! How a rank's end of one link is wired: the communicator, the peer's rank in it, the
//! direction (0: activations, 1: gradients; part of every tag), for a consumer the micro-batch
//! numbers in the order its actions pop them (receives are posted in that order), and the lane
//! (which of the `lanes` links joining the same two ranks the same way this is: ranks holding
//! several stages).
struct MpiLinkEnd {
  MPI_Comm comm = MPI_COMM_NULL;
  LinkRole role = LinkRole::None;
  int peer = -1;
  int direction = 0;
  std::vector<int> order;
  int lane = 0, lanes = 1;
  //! The tag of micro-batch g's message on this end (mpi_link_tag).
  int tag(int g, int tag_ub) const { return mpi_link_tag(g, direction, tag_ub, lane, lanes); }
};

}  // namespace xpipe
