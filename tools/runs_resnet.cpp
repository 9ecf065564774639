// The ResNet's Pipelines for both tools: xpipe-train's runs (1, 2, 4, 8 stages) and xpipe-plan's
// validation cells (2, 4) and profile of its eleven pieces; each split compiled here only.
#include "plan/runs.hpp"
#include "train_run.hpp"

namespace xpipe::tools {
namespace train {

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

}  // namespace train

namespace plan {
namespace {
namespace p = resnet::pieces;
static_assert(
    made_of<resnet::K2a, p::Stem, p::Block16, p::Block16, p::Block16, p::Down32> &&
        made_of<resnet::K2b, p::Block32, p::Block32, p::Down64, p::Block64, p::Block64, p::Head>,
    "tools/runs_resnet.cpp: the 2-stage split in models/resnet.hpp is no longer pieces "
    "{0, 5}");
static_assert(made_of<resnet::A, p::Stem, p::Block16, p::Block16> &&
                  made_of<resnet::B, p::Block16, p::Down32> &&
                  made_of<resnet::C, p::Block32, p::Block32> &&
                  made_of<resnet::D, p::Down64, p::Block64, p::Block64, p::Head>,
              "tools/runs_resnet.cpp: the 4-stage split in models/resnet.hpp is no longer pieces "
              "{0, 3, 5, 7}");
static_assert(made_of<resnet::E0, p::Stem, p::Block16> && made_of<resnet::E1, p::Block16> &&
                  made_of<resnet::E2, p::Down32> && made_of<resnet::E3, p::Block32> &&
                  made_of<resnet::E4, p::Down64, p::Block64> &&
                  made_of<resnet::E5, p::Block64, p::Head>,
              "tools/runs_resnet.cpp: the 8-stage split in models/resnet.hpp is no longer pieces "
              "{0, 2, 3, 4, 5, 6, 7, 9}");
}  // namespace

Cell resnet_validation_cell(int K, const std::string& schedule, int M, index_t batch, int N,
                            int repeats, int cores, double hop, bool pin) {
  return validation_cell_of<ModelPipeline<resnet::K2a, resnet::K2b>,
                            ModelPipeline<resnet::A, resnet::B, resnet::C, resnet::D>>(
      K, schedule, M, batch, N, repeats, cores, hop, pin);
}

ModelPieces resnet_pieces(index_t small, index_t large, int N, int repeats) {
  using P = ModelPipeline<p::Stem, p::Block16, p::Block16, p::Block16, p::Down32, p::Block32,
                          p::Block32, p::Down64, p::Block64, p::Block64, p::Head>;
  return {
      "resnet (models/resnet.hpp)",
      profile_stages<P>({"stem: conv 1->16 3x3 + bn + relu, 28x28", "basic block 16ch 28x28 + relu",
                         "basic block 16ch 28x28 + relu", "basic block 16ch 28x28 + relu",
                         "strided block 16->32ch 28->14 + relu", "basic block 32ch 14x14 + relu",
                         "basic block 32ch 14x14 + relu", "strided block 32->64ch 14->7 + relu",
                         "basic block 64ch 7x7 + relu", "basic block 64ch 7x7 + relu",
                         "global avg pool + linear 64x10"},
                        small, large, N, repeats),
      {{0, 5}, {0, 3, 5, 7}, {0, 2, 3, 4, 5, 6, 7, 9}}};
}

}  // namespace plan
}  // namespace xpipe::tools
