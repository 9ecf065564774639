// The models xpipe-train and xpipe-plan run: the library's (include/xpipe/models/), under the
// tools' short names.
#pragma once

#include "xpipe/models/deep.hpp"
#include "xpipe/models/mlp.hpp"
#include "xpipe/models/resnet.hpp"
#include "xpipe/models/vgg.hpp"

namespace xpipe::tools {
namespace mlp = models::mlp;
namespace deep = models::deep;
namespace vgg = models::vgg;
namespace resnet = models::resnet;
}  // namespace xpipe::tools
