// The VGG's runs for xpipe-plan (runs.hpp): its validation cells over 2 and 4 stages and the
// profile of its five pieces, the only translation unit that compiles its Pipelines.
#include "plan/runs.hpp"
#include "sim_profile.hpp"

namespace xpipe::tools::plan {
namespace {
namespace p = vgg::pieces;
static_assert(made_of<vgg::K2a, p::Conv1, p::Conv2> &&
                  made_of<vgg::K2b, p::Conv3, p::Conv4, p::Classifier>,
              "runs_vgg.cpp: the 2-stage split in models/vgg.hpp is no longer pieces {0, 2}");
static_assert(made_of<vgg::A, p::Conv1> && made_of<vgg::B, p::Conv2> && made_of<vgg::C, p::Conv3> &&
                  made_of<vgg::D, p::Conv4, p::Classifier>,
              "runs_vgg.cpp: the 4-stage split in models/vgg.hpp is no longer pieces {0, 1, 2, 3}");
}  // namespace

Cell vgg_validation_cell(int K, const std::string& schedule, int M, index_t batch, int N,
                         int repeats, int cores, double hop, bool pin) {
  return validation_cell_of<Pipeline<vgg::K2a, vgg::K2b, AnyPredictor, AnyOptimizer>,
                            Pipeline<vgg::A, vgg::B, vgg::C, vgg::D, AnyPredictor, AnyOptimizer>>(
      K, schedule, M, batch, N, repeats, cores, hop, pin);
}

ModelPieces vgg_pieces(index_t small, index_t large, int N, int repeats) {
  using P =
      Pipeline<p::Conv1, p::Conv2, p::Conv3, p::Conv4, p::Classifier, AnyPredictor, AnyOptimizer>;
  return {"vgg (models/vgg.hpp)",
          profile_stages<P>(
              {"conv 1->16 3x3 at 28x28 + relu", "conv 16->16 3x3 at 28x28 + maxpool 2 + relu",
               "conv 16->32 3x3 at 14x14 + relu", "conv 32->32 3x3 at 14x14 + maxpool 2 + relu",
               "flatten + linear 1568x128 + relu + linear 128x10"},
              small, large, N, repeats),
          {{0, 2}, {0, 1, 2, 3}}};
}

}  // namespace xpipe::tools::plan
