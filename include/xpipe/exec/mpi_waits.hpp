// What the ranks of an MPI job wait on, told to each other (MpiWaitBoard), and a watch on this
// process's own clock (ClockWatch): how a rank that gives up tells the stuck rank from the ranks
// that only wait on it, and a stopped process from a slow neighbour. Used by exec/mpi.hpp.
#pragma once

#include <mpi.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "xpipe/comm/mpi_link.hpp"

namespace xpipe::detail {

//! CLOCK_MONOTONIC in nanoseconds (what std::chrono::steady_clock reads on Linux), callable from
//! a signal handler.
inline std::int64_t monotonic_ns() noexcept {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

//! One rank's word on what it waits on, sent as bytes (the ranks run one build). A wait on one
//! rank names it in `waits_on`; a collective names its ranks (first, first + stride, ...,
//! `count` of them) instead. An empty `text` says the rank no longer waits.
struct MpiWaitReport {
  int waits_on = -1;
  int first = 0, stride = 1, count = 0;
  int period_ms = 0;    // it says so again at least this often while the wait lasts
  char text[236] = {};  // "at F6 for the input of F6 from rank 1 (stage 1)"

  bool same_group(const MpiWaitReport& o) const {
    return count > 0 && first == o.first && stride == o.stride && count == o.count;
  }
};

//! The latest MpiWaitReport of every rank, and this rank's own sent to all: a rank reports a
//! wait once it has lasted a while, again every `period_ms` while it lasts, and once more when it
//! ends. A report is current while its repeat is due; one that is not renewed is from a rank that
//! stopped (SIGSTOP, a suspended machine) or hung in the middle of its wait. Sends are
//! non-blocking and receives are polled (drain), both from the waits only: nothing on the path of
//! a wait that ends quickly. Usage: `board.connect(control, tag); board.drain();`
class MpiWaitBoard {
 public:
  using clock = std::chrono::steady_clock;
  struct Entry {
    MpiWaitReport report;
    clock::time_point heard{};  // when it arrived here
  };

  MpiWaitBoard() = default;
  MpiWaitBoard(const MpiWaitBoard&) = delete;
  MpiWaitBoard& operator=(const MpiWaitBoard&) = delete;
  ~MpiWaitBoard() { release(); }

  //! Reports travel on `comm` (one no other traffic uses `tag` on) among all its ranks.
  void connect(MPI_Comm comm, int tag) {
    comm_ = comm;
    tag_ = tag;
    int size = 0;
    XPIPE_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
    XPIPE_MPI_CHECK(MPI_Comm_size(comm, &size));
    entries_.assign(static_cast<std::size_t>(size), {});
  }

  //! Sends `r` to every other rank. Its buffer lives until the sends complete (tested on the next
  //! publish); too many still in flight (no rank receiving) and it is dropped: a report is only
  //! ever a help to name the right rank.
  void publish(const MpiWaitReport& r) {
    reap();
    if (outgoing_.size() >= 64) return;
    Outgoing out{std::make_unique<MpiWaitReport>(r), {}};
    for (int to = 0; to < static_cast<int>(entries_.size()); ++to) {
      if (to == rank_) continue;
      out.requests.push_back(MPI_REQUEST_NULL);
      XPIPE_MPI_CHECK(MPI_Isend(out.report.get(), static_cast<int>(sizeof(MpiWaitReport)), MPI_BYTE,
                                to, tag_, comm_, &out.requests.back()));
    }
    outgoing_.push_back(std::move(out));
  }

  //! Receives every report that has arrived: each rank's latest is kept.
  void drain() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      XPIPE_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, tag_, comm_, &flag, &st));
      if (!flag) return;
      MpiWaitReport r;
      XPIPE_MPI_CHECK(MPI_Recv(&r, static_cast<int>(sizeof r), MPI_BYTE, st.MPI_SOURCE, tag_, comm_,
                               MPI_STATUS_IGNORE));
      r.text[sizeof r.text - 1] = '\0';
      entries_[static_cast<std::size_t>(st.MPI_SOURCE)] = {r, clock::now()};
    }
  }

  const Entry& at(int rank) const { return entries_[static_cast<std::size_t>(rank)]; }

  //! Whether `rank` said it waits and its word is current: it arrived within three periods.
  bool waiting(int rank, clock::time_point now) const {
    const Entry& e = at(rank);
    return e.report.text[0] != '\0' &&
           now - e.heard <= 3 * std::chrono::milliseconds(e.report.period_ms);
  }

  //! Frees what is in flight (before the communicator goes). A send that has not completed keeps
  //! its buffer for good: MPI may still read it, and only a rank that never received holds it.
  void release() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    for (Outgoing& out : outgoing_)
      for (MPI_Request& req : out.requests) {
        int done = 1;
        if (!finalized && req != MPI_REQUEST_NULL &&
            MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) {
          MPI_Request_free(&req);
          (void)out.report.release();
        }
      }
    outgoing_.clear();
  }

 private:
  struct Outgoing {
    std::unique_ptr<MpiWaitReport> report;
    std::vector<MPI_Request> requests;
  };

  void reap() {
    std::erase_if(outgoing_, [](Outgoing& out) {
      int done = 0;
      XPIPE_MPI_CHECK(MPI_Testall(static_cast<int>(out.requests.size()), out.requests.data(), &done,
                                  MPI_STATUSES_IGNORE));
      return done != 0;
    });
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int tag_ = 0, rank_ = 0;
  std::vector<Entry> entries_;
  std::vector<Outgoing> outgoing_;
};

// This process's clock, for the executor and its signal handler: the watch thread's last reading
// (0 while none runs) and the largest jump the watch or a wait saw since the run began (ns).
inline std::atomic<std::int64_t> clock_watch_last_ns{0}, clock_jump_ns{0};
inline constexpr std::int64_t clock_watch_period_ns = 50000000;

//! The shortest jump reported as "this process was stopped": on a loaded host (more ranks than
//! cores) a healthy process may wait a few hundred milliseconds for a core, which the waits
//! count capped but which is not worth a claim that the process was stopped.
inline constexpr std::int64_t clock_jump_reported_ns = 1'000'000'000;

//! Keeps `gap` in clock_jump_ns if it is the largest yet (the watch and a wait may both see one).
inline void note_clock_jump(std::int64_t gap) noexcept {
  std::int64_t seen = clock_jump_ns.load(std::memory_order_relaxed);
  while (gap > seen && !clock_jump_ns.compare_exchange_weak(seen, gap, std::memory_order_relaxed)) {
  }
}

//! While it lives, a thread reads the clock every clock_watch_period_ns and keeps the largest gap
//! between two readings that exceeds that period + `slack` (in clock_jump_ns): a jump, the whole
//! process stopped (SIGSTOP, a debugger, a suspended machine) for about that long. A wait sees a
//! jump that falls inside it on its own; this sees one that falls inside an action, which by its
//! length alone is not told from a slow one. Usage: `ClockWatch watch(max_clock_step);`
class ClockWatch {
 public:
  explicit ClockWatch(std::chrono::nanoseconds slack) : slack_(slack) {
    clock_jump_ns.store(0, std::memory_order_relaxed);
    clock_watch_last_ns.store(monotonic_ns(), std::memory_order_relaxed);
    thread_ = std::thread([this] { watch(); });
  }
  ClockWatch(const ClockWatch&) = delete;
  ClockWatch& operator=(const ClockWatch&) = delete;
  ~ClockWatch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
    clock_watch_last_ns.store(0, std::memory_order_relaxed);  // no watch: nothing to compare
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, period_, [this] { return stop_; })) {
      const std::int64_t now = monotonic_ns();
      const std::int64_t gap = now - clock_watch_last_ns.load(std::memory_order_relaxed);
      if (gap > (period_ + slack_).count()) note_clock_jump(gap);
      clock_watch_last_ns.store(now, std::memory_order_relaxed);
    }
  }

  const std::chrono::nanoseconds period_{clock_watch_period_ns};
  std::chrono::nanoseconds slack_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace xpipe::detail
