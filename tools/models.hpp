// The models xpipe-train and xpipe-plan run: the library's (include/xpipe/models/), under the
// tools' short names, and the Pipeline type the tools train a split of them as.
#pragma once

#if defined(XPIPE_WITH_MPI)
#include "xpipe/comm/mpi_link.hpp"
#endif
#include "xpipe/comm/spsc_ring.hpp"
#include "xpipe/models/deep.hpp"
#include "xpipe/models/gpt.hpp"
#include "xpipe/models/mlp.hpp"
#include "xpipe/models/resnet.hpp"
#include "xpipe/models/vgg.hpp"
#include "xpipe/optim/any.hpp"
#include "xpipe/pipeline/pipeline.hpp"
#include "xpipe/predict/any.hpp"

namespace xpipe::tools {
namespace mlp = models::mlp;
namespace deep = models::deep;
namespace vgg = models::vgg;
namespace resnet = models::resnet;
//! xpipe-train's GPT (--model gpt): width 64, sequences of 128 bytes, 4 heads, 8 blocks.
using Gpt = models::gpt::Gpt<64, 4, 128>;
//! Its sequence length: rows per sequence, and the context load_text_corpus cuts the text to.
inline constexpr int gpt_context = 128;

//! The links of the tools' host Pipelines: MpiChannel's where the tools link MPI (in one process
//! they are in-process rings, so every executor trains them), the in-process ring otherwise.
#if defined(XPIPE_WITH_MPI)
using ModelLinks = MpiChannel;
#else
using ModelLinks = InProcessRing;
#endif
//! The one host Pipeline type of a model split, the predictor and optimizer chosen at run time:
//! xpipe-train's runs, xpipe-plan's validation cells and its check-mpi runs all train it, so each
//! split compiles once for both tools, in the model's runs_*.cpp.
template <class... Stages>
using ModelPipeline = Pipeline<Stages..., AnyPredictor, AnyOptimizer, ModelLinks>;
}  // namespace xpipe::tools
