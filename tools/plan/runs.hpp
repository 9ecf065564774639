// The reference MLP's training runs xpipe-plan makes, declared: runs.cpp is the one translation
// unit that calls the functions of sim_profile.hpp that build a Pipeline or a SequentialTrainer,
// so each of those types is compiled once (they dominate the build). The subcommands call these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xpipe/core/config.hpp"
#include "xpipe/data/dataset.hpp"
#include "xpipe/sim/cost_model.hpp"

namespace xpipe::tools {
struct Cell;  // sim_profile.hpp: validate reads its fields, the others need not include it
}

namespace xpipe::tools::plan {

//! tools::validation_cell: one validation cell of the reference MLP at K = 2 or 4.
Cell validation_cell(int K, const std::string& schedule, int M, index_t batch, int N, int repeats,
                     int cores, double hop = 0, bool pin = false);

//! tools::profile_mlp_layers: the reference MLP's four layers, measured.
std::vector<sim::LayerSpec> profile_mlp_layers(index_t small, index_t large, int N, int repeats);

//! tools::measure_sequential_step: seconds per step of `replicas` sequential trainers at batch b.
double measure_sequential_step(index_t b, int steps, int replicas);

//! Epochs one seeded sequential training at global batch B takes to reach `target` test
//! accuracy, checked `evals_per_epoch` times an epoch (negative: not reached in max_epochs).
//! One thread (the epoch counts do not depend on it, and a shared machine punishes OpenMP
//! barriers that wait for a descheduled second thread). `last` gets the last accuracy checked.
double epochs_to_target(const DatasetPair& data, int B, std::uint64_t seed, double target,
                        double max_epochs, int evals_per_epoch, float lr, double& last);

}  // namespace xpipe::tools::plan
