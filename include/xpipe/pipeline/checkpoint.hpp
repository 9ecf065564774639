// Checkpoints of a Pipeline: each stage's weights, optimizer moments and step count (and its
// layers' non-trainable state, BatchNorm's running statistics, where it has any), with the
// pipeline's shape and the caller's run fields, in the crash-safe folder format of
// checkpoint/files.hpp. Taken between train() calls, which is a drained point: a train() call
// runs its whole schedule, so no micro-batch is in flight, every predictor copy (stashed
// versions, XPipe's predicted weights) has been released, and the next train() rebuilds the
// predictor from the schedule. The optimizer state is therefore the whole trained state, and a
// run resumed from a checkpoint continues bit for bit as the uninterrupted run does (tested for
// every schedule x predictor).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "xpipe/checkpoint/files.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/pipeline/pipeline.hpp"

namespace xpipe {

namespace detail {
// A policy's name in a checkpoint: the chosen one of a run-time choice (AnyOptimizer,
// AnyPredictor), else the type's own.
template <class T>
std::string policy_label(const T& t) {
  if constexpr (requires { t.chosen_name(); })
    return t.chosen_name();
  else
    return T::name;
}

template <class P>
constexpr void check_checkpointable() {
  static_assert(
      requires { requires P::backend::host_memory; } || P::on_device,
      "xpipe: checkpoints read and write the optimizer state in host memory, or copy it from a "
      "device backend; this pipeline's backend is neither (declare `static constexpr bool "
      "host_memory = true` only if its buffers are host memory)");
}

// n floats of a stage's state to `dst` (host bytes): memcpy on a host backend, a synchronised
// copy from the device on a device backend (its context is current: for_each_optimizer_state_on).
template <class P, class Ctx>
void state_to_host(const Ctx& ctx, const float* src, char* dst, std::size_t bytes) {
  if constexpr (P::on_device)
    copy_to_host(ctx, src, reinterpret_cast<float*>(dst), static_cast<index_t>(bytes / 4));
  else
    std::memcpy(dst, src, bytes);
}
template <class P, class Ctx>
void state_from_host(const Ctx& ctx, const char* src, float* dst, std::size_t bytes) {
  if constexpr (P::on_device)
    copy_from_host(ctx, reinterpret_cast<const float*>(src), dst, static_cast<index_t>(bytes / 4));
  else
    std::memcpy(dst, src, bytes);
}

// The fields that say which pipeline a checkpoint belongs to; load refuses any difference.
template <class P>
std::map<std::string, std::string> pipeline_fields(const P& pipe) {
  std::map<std::string, std::string> f;
  const PipelineOptions& o = pipe.options();
  f["pipeline.stages"] = std::to_string(P::stage_count);
  f["pipeline.batch"] = std::to_string(o.batch);
  f["pipeline.micro_batches"] = std::to_string(o.micro_batches);
  f["pipeline.seed"] = std::to_string(o.seed);
  f["pipeline.predictor"] = policy_label(pipe.predictor_policy());
  f["pipeline.byte_order"] = std::endian::native == std::endian::little ? "little" : "big";
  pipe.for_each_optimizer_state([&](int k, const auto& st) {
    f["pipeline.optimizer"] = policy_label(st.optimizer());
    f["pipeline.stage-" + std::to_string(k) + ".params"] = std::to_string(st.size());
  });
  // Only stages with state (BatchNorm) name it, so checkpoints of other models read as before.
  pipe.for_each_running_state_on([&](int k, const float*, index_t n, const auto&) {
    f["pipeline.stage-" + std::to_string(k) + ".state"] = std::to_string(n);
  });
  return f;
}

inline std::string stage_file(int k) {
  return "stage-" + std::to_string(k) + ".bin";
}
// A stage's non-trainable state (BatchNorm running statistics), where it has any.
inline std::string stage_state_file(int k) {
  return "stage-" + std::to_string(k) + ".state.bin";
}
}  // namespace detail

//! Saves `pipe`'s trained state as checkpoint `name` (e.g. "ckpt-000003") under `root`, with
//! the caller's `fields` (its configuration and position: epoch, flags) and `files` (name to
//! contents: e.g. a tool's per-epoch records), by the crash-safe protocol of
//! checkpoint/files.hpp. Call between train() calls. Returns the checkpoint folder;
//! CheckpointError naming the file on any failed write. Read the files back from the
//! CheckpointContents (`contents.file(name)`).
//! Usage: `save_checkpoint(pipe, "ckpts", "ckpt-000003", {{"epoch", "3"}});`
template <class P>
std::filesystem::path save_checkpoint(const P& pipe, const std::filesystem::path& root,
                                      const std::string& name,
                                      const std::map<std::string, std::string>& fields = {},
                                      const std::map<std::string, std::string>& files = {}) {
  detail::check_checkpointable<P>();
  CheckpointWriter w(root, name);
  for (const auto& [file, contents] : files) {
    if (file.rfind("stage-", 0) == 0)
      throw CheckpointError("xpipe: save_checkpoint: file '" + file +
                            "': the 'stage-' names are the library's");
    w.add_file(file, contents);
  }
  for (const auto& [key, value] : fields) {
    if (key.rfind("pipeline.", 0) == 0)
      throw CheckpointError("xpipe: save_checkpoint: field '" + key +
                            "': the 'pipeline.' names are the library's");
    w.set_field(key, value);
  }
  for (const auto& [key, value] : detail::pipeline_fields(pipe)) w.set_field(key, value);
  std::vector<char> bytes;
  pipe.for_each_optimizer_state_on([&](int k, const auto& st, const auto& ctx) {
    using State = std::remove_cvref_t<decltype(st)>;
    constexpr int moments = State::moment_buffers;
    const std::size_t n = static_cast<std::size_t>(st.size()) * sizeof(float);
    const std::int64_t steps = st.steps_taken();
    bytes.resize(n * (1 + moments) + sizeof steps);
    detail::state_to_host<P>(ctx, st.weights(), bytes.data(), n);
    for (int i = 0; i < moments; ++i)
      detail::state_to_host<P>(ctx, st.moment(i), bytes.data() + n * (1 + i), n);
    std::memcpy(bytes.data() + n * (1 + moments), &steps, sizeof steps);
    w.add_file(detail::stage_file(k), bytes);
  });
  pipe.for_each_running_state_on([&](int k, const float* state, index_t n, const auto& ctx) {
    bytes.resize(static_cast<std::size_t>(n) * sizeof(float));
    detail::state_to_host<P>(ctx, state, bytes.data(), bytes.size());
    w.add_file(detail::stage_state_file(k), bytes);
  });
  return w.commit();
}

//! Restores `pipe` from a verified checkpoint (read_checkpoint or find_latest_checkpoint).
//! Refuses, naming the field or file, a checkpoint of another pipeline: a different stage count,
//! parameter count, optimizer, predictor, batch, micro-batch count, seed or byte order.
//! Returns the caller's fields.
template <class P>
std::map<std::string, std::string> load_checkpoint(P& pipe, const CheckpointContents& c) {
  detail::check_checkpointable<P>();
  const auto want = detail::pipeline_fields(pipe);
  auto compare = [&](const std::string& key) {
    const std::string& got = c.field(key);
    if (got != want.at(key))
      throw CheckpointError("xpipe: checkpoint " + c.folder.string() + ": field '" + key +
                            "' is '" + got + "', this pipeline has '" + want.at(key) +
                            "' (a checkpoint of another run)");
  };
  compare("pipeline.stages");  // first: with another stage count the rest cannot match
  for (const auto& [key, value] : want) compare(key);
  pipe.for_each_optimizer_state_on([&](int k, auto& st, const auto& ctx) {
    using State = std::remove_cvref_t<decltype(st)>;
    constexpr int moments = State::moment_buffers;
    const std::vector<char>& bytes = c.file(detail::stage_file(k));
    const std::size_t n = static_cast<std::size_t>(st.size()) * sizeof(float);
    std::int64_t steps = 0;
    if (bytes.size() != n * (1 + moments) + sizeof steps)
      throw CheckpointError("xpipe: checkpoint " + (c.folder / detail::stage_file(k)).string() +
                            " has " + std::to_string(bytes.size()) + " bytes; stage " +
                            std::to_string(k) + " needs " +
                            std::to_string(n * (1 + moments) + sizeof steps));
    std::memcpy(&steps, bytes.data() + n * (1 + moments), sizeof steps);
    if (steps < 0)
      throw CheckpointError("xpipe: checkpoint " + (c.folder / detail::stage_file(k)).string() +
                            ": negative step count");
    detail::state_from_host<P>(ctx, bytes.data(), st.weights(), n);
    for (int i = 0; i < moments; ++i)
      detail::state_from_host<P>(ctx, bytes.data() + n * (1 + i), st.moment(i), n);
    st.set_steps_taken(static_cast<long>(steps));
  });
  pipe.for_each_running_state_on([&](int k, float* state, index_t n, const auto& ctx) {
    const std::vector<char>& bytes = c.file(detail::stage_state_file(k));
    if (bytes.size() != static_cast<std::size_t>(n) * sizeof(float))
      throw CheckpointError("xpipe: checkpoint " +
                            (c.folder / detail::stage_state_file(k)).string() + " has " +
                            std::to_string(bytes.size()) + " bytes; stage " + std::to_string(k) +
                            "'s state needs " + std::to_string(n * sizeof(float)));
    detail::state_from_host<P>(ctx, bytes.data(), state, bytes.size());
  });
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : c.fields)
    if (key.rfind("pipeline.", 0) != 0) out.emplace(key, value);
  return out;
}

}  // namespace xpipe
