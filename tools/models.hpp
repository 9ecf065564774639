// The models xpipe-train and xpipe-plan run: the library's (include/xpipe/models/), under the
// tools' short names.
#pragma once

#include "xpipe/models/deep.hpp"
#include "xpipe/models/gpt.hpp"
#include "xpipe/models/mlp.hpp"
#include "xpipe/models/resnet.hpp"
#include "xpipe/models/vgg.hpp"

namespace xpipe::tools {
namespace mlp = models::mlp;
namespace deep = models::deep;
namespace vgg = models::vgg;
namespace resnet = models::resnet;
//! xpipe-train's GPT (--model gpt): width 64, sequences of 128 bytes, 4 heads, 8 blocks.
using Gpt = models::gpt::Gpt<64, 4, 128>;
//! Its sequence length: rows per sequence, and the context load_text_corpus cuts the text to.
inline constexpr int gpt_context = 128;
}  // namespace xpipe::tools
