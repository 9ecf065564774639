// The models xpipe-train and xpipe-plan run: the library's (include/xpipe/models/), under the
// tools' short names.
#pragma once

#include "xpipe/models/deep.hpp"
#include "xpipe/models/mlp.hpp"

namespace xpipe::tools {
namespace mlp = models::mlp;
namespace deep = models::deep;
}  // namespace xpipe::tools
