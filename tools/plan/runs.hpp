// The training runs xpipe-plan makes, declared: each model's beside xpipe-train's in the tools'
// model table (tools/runs_*.cpp), the choice by name and the sequential trainer's in runs.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xpipe/core/config.hpp"
#include "xpipe/data/dataset.hpp"
#include "xpipe/sim/cost_model.hpp"

namespace xpipe::tools {
struct Cell;  // sim_profile.hpp: validate reads its fields, the others need not include it
}

namespace xpipe::tools::plan {

//! The models profile and validate take: the reference MLP, the CNNs and the GPT of models/.
inline const std::vector<std::string> plan_models{"mlp", "vgg", "resnet", "gpt"};

//! The mini-batch `model` is validated and weighed at, in rows: 128 samples, or for the gpt
//! (a row is a token) 16 sequences of 128 tokens.
inline index_t plan_batch(const std::string& model) {
  return model == "gpt" ? 2048 : 128;
}
//! The micro-batch rows profile_pieces measures at (fixed cost + rows x per-sample): whole
//! sequences for the gpt.
inline std::pair<index_t, index_t> profile_rows(const std::string& model) {
  return model == "gpt" ? std::pair<index_t, index_t>{128, 512}
                        : std::pair<index_t, index_t>{16, 128};
}

//! One validation cell of `model` (plan_models) split as models/ splits it over K = 2 or 4.
Cell validation_cell(const std::string& model, int K, const std::string& schedule, int M,
                     index_t batch, int N, int repeats, int cores, double hop = 0,
                     bool pin = false);
Cell mlp_validation_cell(int K, const std::string& schedule, int M, index_t batch, int N,
                         int repeats, int cores, double hop, bool pin);  // runs_mlp.cpp
Cell vgg_validation_cell(int K, const std::string& schedule, int M, index_t batch, int N,
                         int repeats, int cores, double hop, bool pin);  // runs_vgg.cpp
Cell resnet_validation_cell(int K, const std::string& schedule, int M, index_t batch, int N,
                            int repeats, int cores, double hop, bool pin);  // runs_resnet.cpp
Cell gpt_validation_cell(int K, const std::string& schedule, int M, index_t batch, int N,
                         int repeats, int cores, double hop, bool pin);  // runs_gpt.cpp

//! A model cut into its smallest pieces (the MLP's layers, a CNN's blocks), each measured as a
//! layer of the planner (tools::profile_stages), and the splits models/ compiles, each as the
//! first piece of every stage (the pieces of one stage, concatenated, are that stage's type:
//! runs*.cpp check it at compile time by parameters and multiply-adds).
struct ModelPieces {
  std::string name;
  std::vector<sim::LayerSpec> pieces;
  std::vector<std::vector<std::size_t>> splits;
};
ModelPieces profile_pieces(const std::string& model, index_t small, index_t large, int N,
                           int repeats);
ModelPieces mlp_pieces(index_t small, index_t large, int N, int repeats);     // runs_mlp.cpp
ModelPieces vgg_pieces(index_t small, index_t large, int N, int repeats);     // runs_vgg.cpp
ModelPieces resnet_pieces(index_t small, index_t large, int N, int repeats);  // runs_resnet.cpp
ModelPieces gpt_pieces(index_t small, index_t large, int N, int repeats);     // runs_gpt.cpp

//! Throws UsageError unless `layers` (of the model JSON `model_file`) are the reference MLP's
//! four (784-1024-1024-1024-10): what `command` (check-plan, check-mpi) runs and measures.
void require_reference_mlp(const std::vector<sim::LayerSpec>& layers, const std::string& model_file,
                           const std::string& command);

//! tools::measure_sequential_step: seconds per step of `replicas` sequential trainers at batch b.
double measure_sequential_step(index_t b, int steps, int replicas);

//! Epochs one seeded sequential training at global batch B takes to reach `target` test
//! accuracy, checked `evals_per_epoch` times an epoch (negative: not reached in max_epochs).
//! One thread (the epoch counts do not depend on it, and a shared machine punishes OpenMP
//! barriers that wait for a descheduled second thread). `last` gets the last accuracy checked.
double epochs_to_target(const DatasetPair& data, int B, std::uint64_t seed, double target,
                        double max_epochs, int evals_per_epoch, float lr, double& last);

}  // namespace xpipe::tools::plan
