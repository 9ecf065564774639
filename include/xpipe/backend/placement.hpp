// Where one stage's compute runs: what a backend needs to make that stage's context (threads
// on the host; a device and a stream on a GPU).
#pragma once

namespace xpipe {

//! Placement of one pipeline stage. Usage: `Host::ContextOwner owner(Placement{.stage = 1});`
struct Placement {
  int stage = 0;    // pipeline stage number (a GPU backend maps it to a device)
  int threads = 1;  // host threads one compute call may use
  //! GPU backends: the device this stage runs on; -1 (the default) places stage k on device
  //! k % (number of devices), so several stages may share one GPU.
  int device = -1;
};

}  // namespace xpipe
