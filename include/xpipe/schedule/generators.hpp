// Schedule generators: GPipe (fill-drain), 1F1B with flush, asynchronous 1F1B (PipeDream /
// XPipe, no flush) and its PipeDream-2BW form. Each takes K stages, M micro-batches per
// mini-batch and N mini-batches. Users may write their own and pass the IR to an executor.
#pragma once

#include <algorithm>
#include <array>
#include <string>

#include "xpipe/schedule/ir.hpp"

namespace xpipe {

namespace detail {
inline Schedule empty_schedule(const char* name, int K, int M, int N) {
  check_schedule_shape(name, K, M, N);
  Schedule s;
  s.name = name;
  s.stages = K;
  s.micro_batches = M;
  s.mini_batches = N;
  s.actions.assign(static_cast<std::size_t>(K), {});
  return s;
}
}  // namespace detail

//! GPipe: per mini-batch, all M forwards, then all M backwards (in micro-batch order, so the
//! gradient sums in the order sequential training with M accumulation chunks uses), then a
//! step. Keeps M micro-batches of activations per stage; bubble (K-1)/(M+K-1).
inline Schedule gpipe(int K, int M, int N) {
  Schedule s = detail::empty_schedule("gpipe", K, M, N);
  for (auto& list : s.actions)
    for (int t = 0; t < N; ++t) {
      for (int j = 0; j < M; ++j) list.push_back(fwd(t * M + j));
      for (int j = 0; j < M; ++j) list.push_back(bwd(t * M + j));
      list.push_back(step(t));
    }
  return s;
}

//! 1F1B with a flush per mini-batch: stage k runs min(K-1-k, M) warm-up forwards, then
//! alternates one forward and one backward, drains, and steps. At most K micro-batches of
//! activations in flight; same bubble as GPipe.
inline Schedule one_f_one_b_flush(int K, int M, int N) {
  Schedule s = detail::empty_schedule("1f1b-flush", K, M, N);
  for (int k = 0; k < K; ++k) {
    auto& list = s.actions[static_cast<std::size_t>(k)];
    const int warm = std::min(K - 1 - k, M);
    for (int t = 0; t < N; ++t) {
      const int base = t * M;
      int f = 0, b = 0;
      for (; f < warm; ++f) list.push_back(fwd(base + f));
      while (f < M) {
        list.push_back(fwd(base + f++));
        list.push_back(bwd(base + b++));
      }
      while (b < M) list.push_back(bwd(base + b++));
      list.push_back(step(t));
    }
  }
  return s;
}

//! Asynchronous 1F1B without flush (PipeDream, XPipe): micro-batches of all mini-batches form
//! one stream; stage k runs K-1-k warm-up forwards, then alternates one forward and one
//! backward, and steps right after the backward of each mini-batch's last micro-batch, while
//! micro-batches of the next mini-batch are already in flight. No bubble in the steady state.
inline Schedule async_1f1b(int K, int M, int N, const char* name = "async-1f1b") {
  Schedule s = detail::empty_schedule(name, K, M, N);
  const int total = M * N;
  for (int k = 0; k < K; ++k) {
    auto& list = s.actions[static_cast<std::size_t>(k)];
    const int warm = std::min(K - 1 - k, total);
    int f = 0, b = 0;
    auto backward = [&] {
      list.push_back(bwd(b));
      if (s.is_last_of_mini_batch(b)) list.push_back(step(s.mini_batch_of(b)));
      ++b;
    };
    for (; f < warm; ++f) list.push_back(fwd(f));
    while (f < total) {
      list.push_back(fwd(f++));
      backward();
    }
    while (b < total) backward();
  }
  return s;
}

//! PipeDream-2BW: the action order of asynchronous 1F1B, run with the DoubleBuffered predictor
//! (forward and backward of a micro-batch on the same one of two weight versions, gradients
//! applied with delay 1). Two versions suffice only when M >= K, which is checked here.
inline Schedule pipedream_2bw(int K, int M, int N) {
  if (M < K)
    throw ConfigError(
        "xpipe: pipedream_2bw: needs micro_batches >= stages so that two weight "
        "versions suffice (got M=" +
        std::to_string(M) + ", K=" + std::to_string(K) + ")");
  return async_1f1b(K, M, N, "2bw");
}

//! The names make_schedule knows, in the order tools list them.
inline constexpr std::array<const char*, 4> schedule_names{"gpipe", "1f1b-flush", "async-1f1b",
                                                           "2bw"};

//! The generators by name (schedule_names); ConfigError naming the choices otherwise.
inline Schedule make_schedule(const std::string& name, int K, int M, int N) {
  if (name == schedule_names[0]) return gpipe(K, M, N);
  if (name == schedule_names[1]) return one_f_one_b_flush(K, M, N);
  if (name == schedule_names[2]) return async_1f1b(K, M, N);
  if (name == schedule_names[3]) return pipedream_2bw(K, M, N);
  throw ConfigError("xpipe: unknown schedule '" + name +
                    "' (available: " + join_names(schedule_names) + ")");
}

}  // namespace xpipe
