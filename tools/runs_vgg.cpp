// The VGG's Pipelines for both tools: xpipe-train's runs (1, 2, 4 stages) and xpipe-plan's
// validation cells (2, 4) and profile of its five pieces; each split compiled here only.
#include "plan/runs.hpp"
#include "train_run.hpp"

namespace xpipe::tools {
namespace train {

RunRecord run_vgg1(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<vgg::K1>(c, data, check);
}
RunRecord run_vgg2(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<vgg::K2a, vgg::K2b>(c, data, check);
}
RunRecord run_vgg4(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<vgg::A, vgg::B, vgg::C, vgg::D>(c, data, check);
}

}  // namespace train

namespace plan {
namespace {
namespace p = vgg::pieces;
static_assert(made_of<vgg::K2a, p::Conv1, p::Conv2> &&
                  made_of<vgg::K2b, p::Conv3, p::Conv4, p::Classifier>,
              "tools/runs_vgg.cpp: the 2-stage split in models/vgg.hpp is no longer pieces {0, 2}");
static_assert(
    made_of<vgg::A, p::Conv1> && made_of<vgg::B, p::Conv2> && made_of<vgg::C, p::Conv3> &&
        made_of<vgg::D, p::Conv4, p::Classifier>,
    "tools/runs_vgg.cpp: the 4-stage split in models/vgg.hpp is no longer pieces {0, 1, 2, 3}");
}  // namespace

Cell vgg_validation_cell(int K, const std::string& schedule, int M, index_t batch, int N,
                         int repeats, int cores, double hop, bool pin) {
  return validation_cell_of<ModelPipeline<vgg::K2a, vgg::K2b>,
                            ModelPipeline<vgg::A, vgg::B, vgg::C, vgg::D>>(
      K, schedule, M, batch, N, repeats, cores, hop, pin);
}

ModelPieces vgg_pieces(index_t small, index_t large, int N, int repeats) {
  using P = ModelPipeline<p::Conv1, p::Conv2, p::Conv3, p::Conv4, p::Classifier>;
  return {"vgg (models/vgg.hpp)",
          profile_stages<P>(
              {"conv 1->16 3x3 at 28x28 + relu", "conv 16->16 3x3 at 28x28 + maxpool 2 + relu",
               "conv 16->32 3x3 at 14x14 + relu", "conv 32->32 3x3 at 14x14 + maxpool 2 + relu",
               "flatten + linear 1568x128 + relu + linear 128x10"},
              small, large, N, repeats),
          {{0, 2}, {0, 1, 2, 3}}};
}

}  // namespace plan
}  // namespace xpipe::tools
