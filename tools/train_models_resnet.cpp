// xpipe-train's model table, part 4: the ResNet-20-style network over 1, 2, 4 and 8 stages
// (include/xpipe/models/resnet.hpp), each with every built-in predictor (train_run.hpp).
#include "train_run.hpp"

namespace xpipe::tools::train {

RunRecord run_resnet1(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<resnet::K1>(c, data, check);
}
RunRecord run_resnet2(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<resnet::K2a, resnet::K2b>(c, data, check);
}
RunRecord run_resnet4(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<resnet::A, resnet::B, resnet::C, resnet::D>(c, data, check);
}
RunRecord run_resnet8(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  using namespace resnet;
  return run_stages<E0, E1, E1, E2, E3, E3, E4, E5>(c, data, check);
}

}  // namespace xpipe::tools::train
