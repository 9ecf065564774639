// xpipe-train's model table, part 1: the reference MLP over 1, 2 and 4 stages, each with every
// built-in predictor (train_run.hpp). Its own translation unit so that it compiles in parallel.
#include "train_run.hpp"

namespace xpipe::tools::train {

RunRecord run_mlp1(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<mlp::K1>(c, data, check);
}
RunRecord run_mlp2(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<mlp::K2a, mlp::K2b>(c, data, check);
}
RunRecord run_mlp4(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<mlp::A, mlp::B, mlp::C, mlp::D>(c, data, check);
}

}  // namespace xpipe::tools::train
