// Schedule generators: GPipe (fill-drain), 1F1B with flush, asynchronous 1F1B (PipeDream /
// XPipe, no flush) and its PipeDream-2BW form, and their zero-bubble forms with the backward
// split into input and weight gradients (ZB-H1, ZB-H2, asynchronous ZB), each taking K stages, M
// micro-batches per mini-batch and N mini-batches; and the schedules of P workers holding
// several stages each (interleaved 1F1B, looped BFS, ZB-V, DualPipeV). Users may write their own
// and pass the IR to an executor.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xpipe/schedule/dry_run.hpp"
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

namespace detail {
// Splits every B of stage k's list into I and W and defers the W: W(g) follows the I that is
// `lag` input gradients later (I(g + lag) in list order). `flush`: every W still pending runs
// before the next step (synchronous schedules); otherwise W's run on across mini-batches and
// each step moves to right after the last W of its mini-batch (asynchronous ones).
inline std::vector<Action> defer_weight_gradients(const Schedule& s,
                                                  const std::vector<Action>& list, int lag,
                                                  bool flush) {
  std::vector<Action> out;
  out.reserve(list.size() + static_cast<std::size_t>(s.total_micro_batches()));
  std::vector<int> pending;  // micro-batches in I order; those from next_w on await their W
  std::size_t next_w = 0;
  int steps_due = 0;  // asynchronous: steps reached in the list
  int steps_done = 0;
  std::vector<int> w_done(static_cast<std::size_t>(s.mini_batches), 0);
  // Asynchronous: a step reached in the list runs once every W of its mini-batch has.
  auto emit_due_steps = [&] {
    while (steps_done < steps_due &&
           w_done[static_cast<std::size_t>(steps_done)] == s.micro_batches)
      out.push_back(step(steps_done++));
  };
  auto emit_w = [&] {
    const int g = pending[next_w++];
    out.push_back(weight_grad(g));
    ++w_done[static_cast<std::size_t>(s.mini_batch_of(g))];
    if (!flush) emit_due_steps();
  };
  for (const Action& a : list) {
    if (a.kind == ActionKind::Step) {
      if (flush) {
        while (next_w < pending.size()) emit_w();
        out.push_back(a);
      } else {
        ++steps_due;
        emit_due_steps();
      }
      continue;
    }
    if (a.kind != ActionKind::Backward) {
      out.push_back(a);
      continue;
    }
    out.push_back(input_grad(a.index));
    pending.push_back(a.index);
    if (static_cast<int>(pending.size() - next_w) > lag) emit_w();
  }
  while (next_w < pending.size()) emit_w();
  return out;
}
// P workers of v stages each: P, v >= 1 and the K = P v stages within the IR's bounds, checked
// before P v or M v is computed (no int overflow on a wild argument).
inline void check_virtual_shape(const char* what, int P, int v, int M, int N) {
  if (P < 1 || v < 1)
    throw ConfigError(std::string("xpipe: ") + what + ": needs workers >= 1 and v >= 1 (got P=" +
                      std::to_string(P) + ", v=" + std::to_string(v) + ")");
  check_schedule_shape(what, std::int64_t{P} * v, M, N);
  if (std::int64_t{M} * v * N > max_schedule_micro_batches)
    throw ConfigError(std::string("xpipe: ") + what + ": M v N (" + std::to_string(M) + " x " +
                      std::to_string(v) + " x " + std::to_string(N) + ") exceeds " +
                      std::to_string(max_schedule_micro_batches) + " chunk passes");
}
}  // namespace detail

//! ZB-H1 (the zero-bubble schedule of Qi et al., ICLR 2024, at 1F1B's peak memory): 1F1B with a
//! flush, each backward split into its input gradient I, which stays where 1F1B runs its B (on
//! the critical path: the stage upstream waits for it), and its weight gradient W, which stage k
//! defers by k input gradients to fill the bubbles of the drain. Stage k holds at most
//! min(K - k, M) + k <= K micro-batches (1F1B's stage 0 holds K). With T_F, T_I, T_W per action
//! and M >= K the idle time per stage is (K - 1)(T_F + T_I - T_W) against 1F1B's
//! (K - 1)(T_F + T_I + T_W) (checked against the dry run in tests/test_schedule.cpp). The
//! gradients add up in micro-batch order: trains bitwise like 1F1B-flush and GPipe.
inline Schedule zb_h1(int K, int M, int N) {
  Schedule s = one_f_one_b_flush(K, M, N);
  s.name = "zb-h1";
  for (int k = 0; k < K; ++k)
    s.actions[static_cast<std::size_t>(k)] =
        detail::defer_weight_gradients(s, s.actions[static_cast<std::size_t>(k)], k, true);
  return s;
}

//! What zb_auto fits a schedule to: per stage k, the seconds one micro-batch's forward, input
//! gradient and weight gradient take there (measured, as xpipe-plan's profile does, or from the
//! simulator's cost model).
//! Usage: `SplitBackwardCosts c{.forward = {1, 2}, .input_grad = {1, 2}, .weight_grad = {.5, .5}};`
struct SplitBackwardCosts {
  std::vector<double> forward, input_grad, weight_grad;
  //! T_F = T_I = T_W = 1 on each of K stages: the setting of the hand-made ZB-H1 and ZB-H2.
  static SplitBackwardCosts unit(int K) {
    const std::vector<double> one(static_cast<std::size_t>(std::max(K, 0)), 1.0);
    return {.forward = one, .input_grad = one, .weight_grad = one};
  }
  //! Seconds of action `a` on stage k (a fused backward: I + W; a step: 0), for dry_run.
  double seconds(int k, const Action& a) const {
    const std::size_t u = static_cast<std::size_t>(k);
    // Indexed by ActionKind, in the kind table's order.
    static_assert(action_kinds.size() == 5, "SplitBackwardCosts: give the new kind its cost");
    const std::array<double, action_kinds.size()> by_kind{
        forward[u], input_grad[u] + weight_grad[u], 0, input_grad[u], weight_grad[u]};
    return by_kind[static_cast<std::size_t>(a.kind)];
  }
};

namespace detail {
// ConfigError naming the field and stage unless `c` gives each of K stages a finite time >= 0
// for each action.
inline void check_split_costs(const SplitBackwardCosts& c, int K) {
  auto check = [K](const std::vector<double>& v, const char* field) {
    if (v.size() != static_cast<std::size_t>(K))
      throw ConfigError(std::string("xpipe: zb_auto: costs.") + field + " has " +
                        std::to_string(v.size()) + " entries for " + std::to_string(K) + " stages");
    for (std::size_t k = 0; k < v.size(); ++k)
      if (!std::isfinite(v[k]) || v[k] < 0)
        throw ConfigError(std::string("xpipe: zb_auto: costs.") + field + "[" + std::to_string(k) +
                          "] = " + std::to_string(v[k]) + ": needs a finite time >= 0");
  };
  check(c.forward, "forward");
  check(c.input_grad, "input_grad");
  check(c.weight_grad, "weight_grad");
}

// One mini-batch's actions per stage (micro-batches 0..M-1, no step) under the list rule of
// zb_auto: a stage free at time t runs its next I if its gradient has arrived by t, else its
// next F if its input has arrived and fewer than `limit` micro-batches are in flight there,
// else its oldest pending W, else it waits for the next arrival. Stages free at the same
// instant decide in stage order, each on what has ended by then.
inline std::vector<std::vector<Action>> zero_bubble_list_order(int K, int M,
                                                               const SplitBackwardCosts& costs,
                                                               int limit) {
  constexpr double never = std::numeric_limits<double>::infinity();
  const auto u = [](int k) { return static_cast<std::size_t>(k); };
  // When stage k's forward / input gradient of micro-batch j ends; never: not run yet.
  std::vector<std::vector<double>> f_end(u(K), std::vector<double>(u(M), never));
  std::vector<std::vector<double>> i_end = f_end;
  std::vector<int> f(u(K), 0), i = f, w = f;  // next F, I, W of each stage
  std::vector<double> free_at(u(K), 0);       // a waiting stage: its next arrival
  std::vector<bool> waits(u(K), false);
  std::vector<std::vector<Action>> order(u(K));
  // When the input of stage k's next I / F arrives (never: unknown yet, or none due).
  const auto gradient_arrives = [&](int k) {
    const int j = i[u(k)];
    if (j >= f[u(k)]) return never;
    return k == K - 1 ? f_end[u(k)][u(j)] : i_end[u(k + 1)][u(j)];  // the loss: own forward
  };
  const auto input_arrives = [&](int k) {
    const int j = f[u(k)];
    if (j >= M || j - w[u(k)] >= limit) return never;
    return k == 0 ? 0 : f_end[u(k - 1)][u(j)];
  };
  for (int finished = 0; finished < K;) {
    double now = never;
    for (int k = 0; k < K; ++k)
      if (w[u(k)] < M) now = std::min(now, free_at[u(k)]);
    if (now == never) throw std::logic_error("xpipe: zb_auto: every stage waits");  // a bug
    for (int k = 0; k < K; ++k) {
      if (w[u(k)] == M || free_at[u(k)] != now) continue;
      waits[u(k)] = false;
      if (gradient_arrives(k) <= now) {
        order[u(k)].push_back(input_grad(i[u(k)]));
        free_at[u(k)] = i_end[u(k)][u(i[u(k)]++)] = now + costs.input_grad[u(k)];
      } else if (input_arrives(k) <= now) {
        order[u(k)].push_back(fwd(f[u(k)]));
        free_at[u(k)] = f_end[u(k)][u(f[u(k)]++)] = now + costs.forward[u(k)];
      } else if (w[u(k)] < i[u(k)]) {
        order[u(k)].push_back(weight_grad(w[u(k)]++));
        free_at[u(k)] = now + costs.weight_grad[u(k)];
        if (w[u(k)] == M) ++finished;
      } else {
        waits[u(k)] = true;
      }
    }
    // What this instant's actions end (after now) may wake a waiting stage sooner.
    for (int k = 0; k < K; ++k)
      if (waits[u(k)]) free_at[u(k)] = std::min(gradient_arrives(k), input_arrives(k));
  }
  return order;
}

// The schedule that runs one mini-batch's `order` per mini-batch, each followed by a step.
inline Schedule repeat_with_steps(const char* name, int K, int M, int N,
                                  const std::vector<std::vector<Action>>& order) {
  Schedule s = empty_schedule(name, K, M, N);
  for (int k = 0; k < K; ++k)
    for (int t = 0; t < N; ++t) {
      auto& list = s.actions[static_cast<std::size_t>(k)];
      for (Action a : order[static_cast<std::size_t>(k)]) {
        a.index += t * M;
        list.push_back(a);
      }
      list.push_back(step(t));
    }
  return s;
}
}  // namespace detail

//! ZB-H2 (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, section 2.2): ZB-H1's split
//! backward with up to 2K - 1 micro-batches in flight per stage (ZB-H1 holds K), which buys extra
//! warm-up forwards and moves the W's to fill the drain: each mini-batch is a parallelogram
//! instead of a trapezoid. The order of one mini-batch is what zb_auto's list rule gives on unit
//! costs (T_F = T_I = T_W): at each time step every stage runs its next input
//! gradient if that gradient has arrived, else its next forward if the input has arrived and
//! fewer than 2K - 1 micro-batches are in flight, else its oldest pending W; the same order
//! repeats for every mini-batch, with a step after the last W. Stage k warms up with
//! min(M, 2(K - 1 - k) + 1) forwards. With equal costs T a mini-batch occupies
//! max(3M, 2M + 2K - 1) T per stage: no bubble at all once M >= 2K - 1 (against ZB-H1's
//! (K - 1) T), and a single one takes (3M + K - 1) T there (dry run, tests/test_schedule.cpp).
//! Gradients add in micro-batch order: trains bitwise like GPipe. Each stage steps on its own, so
//! the paper's "optimizer post-validation" (which removes the all-reduce before a step) is not
//! needed, except with gradient clipping, which waits for every stage's norm as it does in any
//! schedule. zb_auto fits the order to measured, unequal costs.
inline Schedule zb_h2(int K, int M, int N) {
  check_schedule_shape("zb-h2", K, M, N);
  return detail::repeat_with_steps(
      "zb-h2", K, M, N,
      detail::zero_bubble_list_order(K, M, SplitBackwardCosts::unit(K), 2 * K - 1));
}

//! A zero-bubble schedule fitted to measured costs, after ZB's automatic scheduling (Qi et al.,
//! Zero Bubble Pipeline Parallelism, ICLR 2024, section 3: heuristics tried under the profiled
//! costs, the best kept; the paper's ILP refinement is not done). It plays one mini-batch out
//! under `costs` with a list rule: whenever a stage is free it runs its next input gradient I if
//! that gradient has arrived, else its next forward F if the input has arrived and fewer than L
//! micro-batches are in flight there (forwarded, W not yet run: what bounds the activations it
//! keeps), else its oldest pending W, else it waits. It does so for each L from max_in_flight
//! down to 1 (a smaller L runs the W's sooner), takes the hand-made ZB-H2 and ZB-H1 as two more
//! candidates where they fit in max_in_flight (2K - 1 and K), dry-runs each candidate under the
//! costs and keeps the one with the shortest period (seconds per mini-batch in the steady state;
//! the first of equals). So under the given costs it is never slower than ZB-H2 (or ZB-H1 when
//! max_in_flight < 2K - 1), and with unit costs and 2K - 1 it is ZB-H2. Each mini-batch's order
//! is followed by a step: gradients add in micro-batch order and it trains bitwise like GPipe.
//! max_in_flight = K bounds the activations to 1F1B's (the paper's ZB-1p), 2K - 1 to ZB-H2's.
//! Where stages or actions differ (a heavy last stage, a W cheaper than I as in attention), F's
//! wait less for slow neighbours and the W's fill the waits the costs leave.
//! ConfigError for bad costs (naming the field and stage) or max_in_flight < 1.
//! Usage: `Schedule s = zb_auto(4, 8, N, profiled, 2 * 4 - 1);`
inline Schedule zb_auto(int K, int M, int N, const SplitBackwardCosts& costs, int max_in_flight) {
  check_schedule_shape("zb-auto", K, M, N);
  detail::check_split_costs(costs, K);
  if (max_in_flight < 1)
    throw ConfigError("xpipe: zb_auto: max_in_flight must be >= 1 (got " +
                      std::to_string(max_in_flight) + ")");
  const ActionCost cost = [&costs](int k, const Action& a) { return costs.seconds(k, a); };
  std::vector<std::vector<std::vector<Action>>> candidates;
  for (int L = std::min(max_in_flight, M); L >= 1; --L)
    candidates.push_back(detail::zero_bubble_list_order(K, M, costs, L));
  auto one_mini_batch = [](const Schedule& s) {  // without its step
    std::vector<std::vector<Action>> order;
    for (const auto& list : s.actions) order.emplace_back(list.begin(), list.end() - 1);
    return order;
  };
  if (max_in_flight >= 2 * K - 1) candidates.push_back(one_mini_batch(zb_h2(K, M, 1)));
  if (max_in_flight >= K) candidates.push_back(one_mini_batch(zb_h1(K, M, 1)));
  std::size_t best = 0;
  double best_period = std::numeric_limits<double>::infinity();
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    const double period = steady_state_period(
        [&](int N) { return detail::repeat_with_steps("zb-auto", K, M, N, candidates[c]); }, cost);
    if (period < best_period) best = c, best_period = period;
  }
  return detail::repeat_with_steps("zb-auto", K, M, N, candidates[best]);
}

//! Asynchronous 1F1B with split backwards: the order of async_1f1b, each B split into I and a W
//! that stage k defers by k input gradients (as ZB-H1 does), each step right after the last W of
//! its mini-batch. Input gradients reach the stages upstream as early as in async 1F1B; the
//! steps come later, so the version differences (derived by the analysis) grow by up to k
//! micro-batches' worth.
inline Schedule async_zb(int K, int M, int N) {
  Schedule s = async_1f1b(K, M, N, "async-zb");
  for (int k = 0; k < K; ++k)
    s.actions[static_cast<std::size_t>(k)] =
        detail::defer_weight_gradients(s, s.actions[static_cast<std::size_t>(k)], k, false);
  return s;
}

//! Interleaved 1F1B (Megatron-LM's virtual pipeline, Narayanan et al., SC 2021): P workers, each
//! holding v of the model's K = P v stages, worker w stages w, w + P, ..., w + (v - 1) P (model
//! chunks round-robin). Per mini-batch each worker runs its M v chunk forwards in groups of P
//! micro-batches per chunk, chunk 0 first, and the backwards in the same groups, last chunk
//! first; (P - w - 1) 2 + (v - 1) P warm-up forwards, then one forward and one backward
//! alternately, then the drain and a step of each of its stages. Needs M a multiple of P
//! (ConfigError otherwise). With per-stage times T_F and T_B (a stage is 1/v of a worker's
//! share) the idle time per worker is (P - 1)(T_F + T_B), against (P - 1) v (T_F + T_B) for
//! 1F1B on stages v times larger: the bubble shrinks by v, for v times the messages. Gradients
//! add up in micro-batch order per stage: trains bitwise like 1F1B-flush on the same K stages.
inline Schedule interleaved_1f1b(int P, int v, int M, int N) {
  detail::check_virtual_shape("interleaved_1f1b", P, v, M, N);
  if (M % P != 0)
    throw ConfigError("xpipe: interleaved_1f1b: micro_batches (" + std::to_string(M) +
                      ") must be a multiple of the workers (" + std::to_string(P) +
                      "): chunks run in groups of one micro-batch per worker");
  Schedule s = detail::empty_schedule("interleaved-1f1b", P * v, M, N);
  s.worker_order.assign(static_cast<std::size_t>(P), {});
  const int total = M * v;  // chunk forwards (and backwards) per worker and mini-batch
  // The j-th forward or backward of a worker in a mini-batch: its chunk and micro-batch.
  auto chunk_of = [&](int j, bool forward) {
    const int c = (j / P) % v;
    return forward ? c : v - 1 - c;
  };
  auto micro_of = [&](int j) { return (j / (P * v)) * P + j % P; };
  for (int w = 0; w < P; ++w) {
    auto& order = s.worker_order[static_cast<std::size_t>(w)];
    auto emit = [&](int stage, Action a) {
      s.actions[static_cast<std::size_t>(stage)].push_back(a);
      order.push_back(stage);
    };
    const int warm = std::min((P - w - 1) * 2 + (v - 1) * P, total);
    for (int t = 0; t < N; ++t) {
      const int base = t * M;
      auto forward = [&](int j) { emit(chunk_of(j, true) * P + w, fwd(base + micro_of(j))); };
      auto backward = [&](int j) { emit(chunk_of(j, false) * P + w, bwd(base + micro_of(j))); };
      int f = 0, b = 0;
      for (; f < warm; ++f) forward(f);
      while (f < total) {
        forward(f++);
        backward(b++);
      }
      while (b < total) backward(b++);
      for (int c = 0; c < v; ++c) emit(c * P + w, step(t));
    }
  }
  return s;
}

//! Asynchronous interleaved 1F1B: the stages of interleaved_1f1b on its P workers, the micro-
//! batches of all mini-batches one stream without a flush (as async_1f1b is to 1F1B), in rounds
//! of P micro-batches per chunk (a last round of what is left runs breadth-first, so M N need
//! not be a multiple of P); each stage steps right after its backward of a mini-batch's last
//! micro-batch, while later ones are in flight. Its version differences are derived by the
//! analysis, like every schedule's; they are not async 1F1B's on the same K stages
//! (docs/design.md).
inline Schedule async_interleaved(int P, int v, int M, int N) {
  detail::check_virtual_shape("async_interleaved", P, v, M, N);
  Schedule s = detail::empty_schedule("async-interleaved", P * v, M, N);
  s.worker_order.assign(static_cast<std::size_t>(P), {});
  const int total = M * N;
  // The j-th chunk pass of a worker, forwards or backwards: rounds of (up to) P micro-batches,
  // within a round each chunk in turn (forwards chunk 0 first, backwards the last first).
  auto pass = [&](int j, bool forward) {
    const int round = j / (P * v), in_round = j % (P * v);
    const int size = std::min(P, total - round * P);  // the last round may be short
    const int c = in_round / size, micro = round * P + in_round % size;
    return std::pair{forward ? c : v - 1 - c, micro};
  };
  for (int w = 0; w < P; ++w) {
    auto& order = s.worker_order[static_cast<std::size_t>(w)];
    auto emit = [&](int stage, Action a) {
      s.actions[static_cast<std::size_t>(stage)].push_back(a);
      order.push_back(stage);
    };
    const int passes = total * v;
    const int warm = std::min((P - w - 1) * 2 + (v - 1) * P, passes);
    auto forward = [&](int j) {
      const auto [c, g] = pass(j, true);
      emit(c * P + w, fwd(g));
    };
    auto backward = [&](int j) {
      const auto [c, g] = pass(j, false);
      emit(c * P + w, bwd(g));
      if (s.is_last_of_mini_batch(g)) emit(c * P + w, step(s.mini_batch_of(g)));
    };
    // A short last round runs breadth-first after the others: all its forwards, then every
    // backward left (one forward and one backward alternately there can deadlock: P = 4, v = 3).
    const int full = total / P * P * v;
    int f = 0, b = 0;
    for (; f < std::min(warm, full); ++f) forward(f);
    while (f < full) {
      forward(f++);
      backward(b++);
    }
    while (f < passes) forward(f++);
    while (b < passes) backward(b++);
  }
  return s;
}

//! Looped BFS (breadth-first pipelining, Lamy-Poirier 2022; PyTorch's ScheduleLoopedBFS): the
//! stages of interleaved_1f1b on its P workers, but each worker runs the forwards of all M
//! micro-batches of its first stage, then of its next, ..., then all backwards, last stage
//! first, then a step of each stage. With M >= P its idle time per worker is interleaved 1F1B's
//! (P - 1)(T_F + T_B), but every stage holds all M micro-batches, as GPipe does. Gradients add
//! in micro-batch order per stage: bitwise GPipe on the same stages.
inline Schedule looped_bfs(int P, int v, int M, int N) {
  detail::check_virtual_shape("looped_bfs", P, v, M, N);
  Schedule s = detail::empty_schedule("looped-bfs", P * v, M, N);
  s.worker_order.assign(static_cast<std::size_t>(P), {});
  for (int w = 0; w < P; ++w) {
    auto& order = s.worker_order[static_cast<std::size_t>(w)];
    auto emit = [&](int stage, Action a) {
      s.actions[static_cast<std::size_t>(stage)].push_back(a);
      order.push_back(stage);
    };
    for (int t = 0; t < N; ++t) {
      for (int c = 0; c < v; ++c)
        for (int j = 0; j < M; ++j) emit(c * P + w, fwd(t * M + j));
      for (int c = v - 1; c >= 0; --c)
        for (int j = 0; j < M; ++j) emit(c * P + w, bwd(t * M + j));
      for (int c = 0; c < v; ++c) emit(c * P + w, step(t));
    }
  }
  return s;
}

namespace detail {
// The V placement of P workers over K = 2P stages: worker w runs stage w on the way down (chunk
// 0) and stage 2P - 1 - w on the way back (chunk 1), so worker P - 1 holds the two middle stages
// and worker 0 the first and the last. Emits one worker's actions of one mini-batch, each of
// the four streams (F and backward of each chunk) in micro-batch order; a split backward's W
// comes later, by weight(chunk), also in micro-batch order per stage.
class VWorker {
 public:
  VWorker(Schedule& s, int w, int base)
      : s_(s), w_(w), base_(base), stage_{w, 2 * s.workers() - 1 - w} {}
  void forward(int c) { emit(c, fwd(base_ + f_[c]++)); }
  void backward(int c) { emit(c, bwd(base_ + b_[c]++)); }
  void input_grad(int c) {  // its W queued (the queue holds at most a few per stage)
    pending_.push_back({c, b_[c]});
    emit(c, xpipe::input_grad(base_ + b_[c]++));
  }
  void weight() { weight_at(0); }  // the oldest queued W, of either chunk
  void weight(int c) {             // the oldest queued W of chunk c
    std::size_t i = 0;
    while (pending_[i].first != c) ++i;
    weight_at(i);
  }
  int forwards(int c) const { return f_[c]; }
  bool queued(int c) const {
    return std::any_of(pending_.begin(), pending_.end(), [c](auto e) { return e.first == c; });
  }
  bool queued() const { return !pending_.empty(); }
  void steps(int t) {
    emit(0, step(t));
    emit(1, step(t));
  }

 private:
  void emit(int c, Action a) {
    s_.actions[static_cast<std::size_t>(stage_[c])].push_back(a);
    s_.worker_order[static_cast<std::size_t>(w_)].push_back(stage_[c]);
  }
  void weight_at(std::size_t i) {
    const auto [c, g] = pending_[i];
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    emit(c, weight_grad(base_ + g));
  }
  Schedule& s_;
  int w_, base_;
  int stage_[2];
  int f_[2] = {0, 0}, b_[2] = {0, 0};
  std::vector<std::pair<int, int>> pending_;  // (chunk, micro-batch) of each W not yet run
};

// An empty schedule `name` of 2P stages on P workers; `what` (the generator) names errors.
inline Schedule v_schedule(const char* what, const char* name, int P, int M, int N) {
  check_virtual_shape(what, P, 2, M, N);
  if (M < 2 * P)
    throw ConfigError(std::string("xpipe: ") + what +
                      ": needs micro_batches >= 2 x workers (got M=" + std::to_string(M) + ", P=" +
                      std::to_string(P) + "): its warm-up runs 2P - 1 forwards on worker 0");
  Schedule s = empty_schedule(name, 2 * P, M, N);
  s.worker_order.assign(static_cast<std::size_t>(P), {});
  return s;
}
}  // namespace detail

//! ZB-V (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, section 6): P workers, the V
//! placement (worker w runs stages w and 2P - 1 - w), every backward split. Worker w warms up
//! with 2(P - w) - 1 forwards of its first stage, then w pairs F(second) F(first), then P - w
//! times F I W on its second stage; the steady state runs F I W on each stage in turn (I W on
//! the first stage once its forwards are done); the cool-down runs w pairs of input gradients, then
//! P - w times I W on the first stage, then the W's left, second stage first. Each worker holds at
//! most 2P micro-batches of its half-size stages, 1F1B's peak, and with T_F = T_I = T_W the steady
//! state has no bubble: mini-batches follow each other every M(T_F + T_I + T_W) per stage (dry run,
//! tests/test_schedule.cpp). Needs M >= 2P. Gradients add in micro-batch order per stage: trains
//! bitwise like GPipe.
inline Schedule zb_v(int P, int M, int N) {
  Schedule s = detail::v_schedule("zb_v", "zb-v", P, M, N);
  for (int w = 0; w < P; ++w)
    for (int t = 0; t < N; ++t) {
      detail::VWorker v(s, w, t * M);
      auto fiw = [&](int c) {
        v.forward(c);
        v.input_grad(c);
        v.weight(c);
      };
      for (int i = 0; i < 2 * (P - w) - 1; ++i) v.forward(0);
      for (int i = 0; i < w; ++i) {
        v.forward(1);
        v.forward(0);
      }
      for (int i = 0; i < P - w; ++i) fiw(1);
      while (v.forwards(1) < v.forwards(0) || v.forwards(0) < M) {
        if (v.forwards(0) < M) v.forward(0);
        v.input_grad(0);
        v.weight(0);
        fiw(1);
      }
      for (int i = 0; i < w; ++i) {
        v.input_grad(0);
        v.input_grad(1);
      }
      for (int i = 0; i < P - w; ++i) {
        v.input_grad(0);
        v.weight(0);
      }
      while (v.queued(1)) v.weight(1);
      while (v.queued(0)) v.weight(0);
      v.steps(t);
    }
  return s;
}

//! DualPipeV (DeepSeek-AI's DualPipe cut in half, after Sea AI Lab; deepseek-ai/DualPipe):
//! P workers on the V placement of zb_v. Worker w runs, per mini-batch: 2(P - w - 1) forwards
//! of its first stage; w + 1 pairs F(first) F(second); P - w - 1 times I W F on its second stage;
//! M - 2P + w + 1 times F(first) B(second) F(second) B(first), the pairs DualPipe overlaps; P -
//! w - 1 times B(second) F(second) B(first); w + 1 pairs of backwards (second, first), the later
//! half split into I with its W queued; P - w - 1 times a queued W and an I of its first stage;
//! the w + 1 W's left, oldest first. At most 2P + 1 micro-batches of its half-size stages per
//! worker (DualPipe's PP + 1). DeepSeek's bubble (P - 1)(F&B + B - 3W) counts each overlapped
//! pair F&B as one block that starts once both its inputs are in; a worker here runs the pair's
//! F and B one after the other, the F as soon as its own input is in, so its idle time is at
//! most that with F&B = F + B (dry run, tests/test_schedule.cpp). Needs M >= 2P. Gradients add
//! in micro-batch order per stage: trains bitwise like GPipe.
inline Schedule dualpipe_v(int P, int M, int N) {
  Schedule s = detail::v_schedule("dualpipe_v", "dualpipev", P, M, N);
  for (int w = 0; w < P; ++w)
    for (int t = 0; t < N; ++t) {
      detail::VWorker v(s, w, t * M);
      for (int i = 0; i < 2 * (P - w - 1); ++i) v.forward(0);
      for (int i = 0; i < w + 1; ++i) {
        v.forward(0);
        v.forward(1);
      }
      for (int i = 0; i < P - w - 1; ++i) {
        v.input_grad(1);
        v.weight();
        v.forward(1);
      }
      for (int i = 0; i < M - 2 * P + w + 1; ++i) {
        v.forward(0);
        v.backward(1);
        v.forward(1);
        v.backward(0);
      }
      for (int i = 0; i < P - w - 1; ++i) {
        v.backward(1);
        v.forward(1);
        v.backward(0);
      }
      // The later half of these backwards split: on odd workers from the pair's first
      // backward, on even ones from its second.
      const int half = (w + 1) / 2;
      for (int i = 0; i < w + 1; ++i) {
        const bool split_second = i > half || (i == half && w % 2 == 1);
        split_second ? v.input_grad(1) : v.backward(1);
        i >= half ? v.input_grad(0) : v.backward(0);
      }
      for (int i = 0; i < P - w - 1; ++i) {
        v.weight();
        v.input_grad(0);
      }
      while (v.queued()) v.weight();
      v.steps(t);
    }
  return s;
}

namespace detail {
// One row per schedule make_schedule knows: its name, the stages each worker runs (2: K = 2P
// stages on P workers), its generator over K stages and, for a schedule fitted to measured
// costs, its generator from them (`make` then fits it to unit costs).
struct NamedSchedule {
  const char* name;
  int stages_per_worker;
  Schedule (*make)(int K, int M, int N);
  Schedule (*fit)(int K, int M, int N, const SplitBackwardCosts& costs) = nullptr;
};
inline constexpr std::array<NamedSchedule, 13> named_schedules{{
    {"gpipe", 1, gpipe},
    {"1f1b-flush", 1, one_f_one_b_flush},
    {"async-1f1b", 1, [](int K, int M, int N) { return async_1f1b(K, M, N); }},
    {"2bw", 1, pipedream_2bw},
    {"zb-h1", 1, zb_h1},
    {"zb-h2", 1, zb_h2},
    {"zb-auto", 1,
     [](int K, int M, int N) {
       check_schedule_shape("zb-auto", K, M, N);  // before unit(K) sizes anything by K
       return zb_auto(K, M, N, SplitBackwardCosts::unit(K), 2 * K - 1);
     },
     [](int K, int M, int N, const SplitBackwardCosts& c) {
       return zb_auto(K, M, N, c, 2 * K - 1);
     }},
    {"async-zb", 1, async_zb},
    {"interleaved-1f1b", 2, [](int K, int M, int N) { return interleaved_1f1b(K / 2, 2, M, N); }},
    {"looped-bfs", 2, [](int K, int M, int N) { return looped_bfs(K / 2, 2, M, N); }},
    {"async-interleaved", 2, [](int K, int M, int N) { return async_interleaved(K / 2, 2, M, N); }},
    {"zb-v", 2, [](int K, int M, int N) { return zb_v(K / 2, M, N); }},
    {"dualpipev", 2, [](int K, int M, int N) { return dualpipe_v(K / 2, M, N); }},
}};
}  // namespace detail

//! The names make_schedule knows, in the order tools list them.
inline constexpr std::array<const char*, detail::named_schedules.size()> schedule_names = [] {
  std::array<const char*, detail::named_schedules.size()> names{};
  for (std::size_t i = 0; i < names.size(); ++i) names[i] = detail::named_schedules[i].name;
  return names;
}();

//! Stages per worker of the schedule of that name (make_schedule): 2 for the interleaved (both),
//! looped and V schedules (K = 2P stages on P workers), 1 for the others and unknown names.
//! Usage: a test that runs one stage per rank skips `stages_per_worker(name) > 1`.
inline int stages_per_worker(std::string_view name) {
  for (const detail::NamedSchedule& n : detail::named_schedules)
    if (name == n.name) return n.stages_per_worker;
  return 1;
}

//! Whether the schedule of that name is fitted to measured costs (zb-auto): a tool then measures
//! them (or takes its cost model's) and calls make_schedule with them.
inline bool fitted_to_costs(std::string_view name) {
  for (const detail::NamedSchedule& n : detail::named_schedules)
    if (name == n.name) return n.fit != nullptr;
  return false;
}

namespace detail {
// The row of `name` for K stages; ConfigError naming the choices, or the stage count needed.
inline const NamedSchedule& named_schedule(const std::string& name, int K) {
  for (const NamedSchedule& n : named_schedules) {
    if (name != n.name) continue;
    // By name: two stages per worker (v = 2), so K must be even and at least 4.
    if (n.stages_per_worker == 2 && (K < 4 || K % 2 != 0))
      throw ConfigError("xpipe: schedule '" + name +
                        "' runs two stages per worker: needs an even number of stages, at least "
                        "4 (got " +
                        std::to_string(K) + ")");
    return n;
  }
  throw ConfigError("xpipe: unknown schedule '" + name +
                    "' (available: " + join_names(schedule_names) + ")");
}
}  // namespace detail

//! The generators by name (schedule_names); ConfigError naming the choices otherwise. A schedule
//! fitted to costs (fitted_to_costs) is fitted here to unit costs: zb-auto gives ZB-H2's order.
inline Schedule make_schedule(const std::string& name, int K, int M, int N) {
  return detail::named_schedule(name, K).make(K, M, N);
}

//! The same, a schedule fitted to costs (zb-auto: zb_auto at ZB-H2's 2K - 1 in flight) fitted to
//! `costs`; the other schedules ignore them.
//! Usage: `make_schedule(name, K, M, N, cost_model.split_backward_costs())`.
inline Schedule make_schedule(const std::string& name, int K, int M, int N,
                              const SplitBackwardCosts& costs) {
  const detail::NamedSchedule& n = detail::named_schedule(name, K);
  return n.fit ? n.fit(K, M, N, costs) : n.make(K, M, N);
}

}  // namespace xpipe
