// xpipe-train's model table, part 3: the VGG-style convolutional network over 1, 2 and 4 stages
// (include/xpipe/models/vgg.hpp), each with every built-in predictor (train_run.hpp).
#include "train_run.hpp"

namespace xpipe::tools::train {

RunRecord run_vgg1(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<vgg::K1>(c, data, check);
}
RunRecord run_vgg2(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<vgg::K2a, vgg::K2b>(c, data, check);
}
RunRecord run_vgg4(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<vgg::A, vgg::B, vgg::C, vgg::D>(c, data, check);
}

}  // namespace xpipe::tools::train
