// The GPT's Pipelines (tools::Gpt) for both tools: xpipe-train's runs (1, 2, 4, 8 stages) and
// xpipe-plan's validation cells (2, 4) and profile of its ten pieces (a row is a token).
#include "plan/runs.hpp"
#include "train_run.hpp"

namespace xpipe::tools {
namespace train {

RunRecord run_gpt1(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<Gpt::K1>(c, data, check);
}
RunRecord run_gpt2(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<Gpt::K2a, Gpt::K2b>(c, data, check);
}
RunRecord run_gpt4(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<Gpt::A, Gpt::B, Gpt::B, Gpt::C>(c, data, check);
}
RunRecord run_gpt8(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  using G = Gpt;
  return run_stages<G::E0, G::E1, G::E1, G::E1, G::E1, G::E1, G::E1, G::E2>(c, data, check);
}

}  // namespace train

namespace plan {
namespace {
using G = tools::Gpt;
using Embed = Stage<G::Embed>;
using Block = Stage<G::Blk>;
using Head = Stage<G::Norm, G::Head>;
static_assert(made_of<G::K2a, Embed, Block, Block, Block, Block> &&
                  made_of<G::K2b, Block, Block, Block, Block, Head>,
              "tools/runs_gpt.cpp: the 2-stage split in models/gpt.hpp is no longer pieces {0, 5}");
static_assert(
    made_of<G::A, Embed, Block, Block> && made_of<G::B, Block, Block> &&
        made_of<G::C, Block, Block, Head>,
    "tools/runs_gpt.cpp: the 4-stage split in models/gpt.hpp is no longer pieces {0, 3, 5, 7}");
static_assert(made_of<G::E0, Embed, Block> && made_of<G::E1, Block> && made_of<G::E2, Block, Head>,
              "tools/runs_gpt.cpp: the 8-stage split in models/gpt.hpp is no longer pieces "
              "{0, 2, 3, 4, 5, 6, 7, 8}");
}  // namespace

Cell gpt_validation_cell(int K, const std::string& schedule, int M, index_t batch, int N,
                         int repeats, int cores, double hop, bool pin) {
  return validation_cell_of<ModelPipeline<G::K2a, G::K2b>, ModelPipeline<G::A, G::B, G::B, G::C>>(
      K, schedule, M, batch, N, repeats, cores, hop, pin);
}

ModelPieces gpt_pieces(index_t small, index_t large, int N, int repeats) {
  using P = ModelPipeline<Embed, Block, Block, Block, Block, Block, Block, Block, Block, Head>;
  const std::string block = "block: LN, attention (4 heads, T 128), LN, MLP 64-256-64";
  return {"gpt (models/gpt.hpp, Gpt<64, 4, 128>; a sample is a token)",
          profile_stages<P>({"embedding 256 tokens + 128 positions -> 64", block, block, block,
                             block, block, block, block, block, "layer norm + linear 64x256"},
                            small, large, N, repeats),
          {{0, 5}, {0, 3, 5, 7}, {0, 2, 3, 4, 5, 6, 7, 8}}};
}

}  // namespace plan
}  // namespace xpipe::tools
