// The deep MLP's Pipelines (the sweep's model): xpipe-train's runs over 2, 4 and 8 stages, each
// split compiled here only. xpipe-plan does not run it.
#include "train_run.hpp"

namespace xpipe::tools::train {

RunRecord run_deep2(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<deep::In4, deep::Out4>(c, data, check);
}
RunRecord run_deep4(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<deep::In2, deep::Mid2, deep::Mid2, deep::Out2>(c, data, check);
}
RunRecord run_deep8(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<deep::In, deep::Mid, deep::Mid, deep::Mid, deep::Mid, deep::Mid, deep::Mid,
                    deep::Out>(c, data, check);
}

}  // namespace xpipe::tools::train
