// xpipe-train's model table, part 5: the GPT (include/xpipe/models/gpt.hpp, at tools::Gpt's
// size) over 1, 2, 4 and 8 stages, each with every built-in predictor (train_run.hpp).
#include "train_run.hpp"

namespace xpipe::tools::train {

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

}  // namespace xpipe::tools::train
