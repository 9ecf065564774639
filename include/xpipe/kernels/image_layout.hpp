// Images between xpipe's channels-last rows and planar order (channel, then row, then column:
// PyTorch's NCHW flattening), as Flatten hands a CNN's features to its Linear layers: the element
// passes and their launchers, written once for the host loop and the CUDA kernels.
#pragma once

#include "xpipe/core/config.hpp"
#include "xpipe/core/shape.hpp"
#include "xpipe/core/tensor.hpp"

namespace xpipe {

namespace ops {

//! Element (r, j) of planar rows: planar(r, j) = the channels-last element of the same channel
//! and pixel, channel j / plane, pixel j % plane. A gather: each call writes its own element.
struct PlanarFromChannelsLast {
  ConstMatrix channels_last;
  Matrix planar;
  int channels, plane;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t j) const {
    const index_t ch = j / plane, pixel = j - ch * plane;
    planar(r, j) = channels_last(r, pixel * channels + ch);
  }
};

//! Element (r, i) of channels-last rows from planar ones: channel i % channels of pixel
//! i / channels.
struct ChannelsLastFromPlanar {
  ConstMatrix planar;
  Matrix channels_last;
  int channels, plane;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t i) const {
    const index_t pixel = i / channels, ch = i - pixel * channels;
    channels_last(r, i) = planar(r, ch * plane + pixel);
  }
};

}  // namespace ops

//! Each row of `from` (a channels-last image of shape d) into `to` in planar order (channel,
//! row, column). The views must be rows x d.size(); they may not overlap.
//! Usage: `planar_rows(ctx, Dims{32, 7, 7}, x, y);`
template <class Ctx>
void planar_rows(const Ctx& ctx, Dims d, ConstMatrix from, Matrix to) {
  for_each_element(ctx, to.rows, to.cols, ops::PlanarFromChannelsLast{from, to, d.c, d.h * d.w});
}

//! Each row of `from` (an image of shape d in planar order) into `to`, channels-last: the inverse
//! of planar_rows. Usage: `channels_last_rows(ctx, Dims{32, 7, 7}, dy, dx);`
template <class Ctx>
void channels_last_rows(const Ctx& ctx, Dims d, ConstMatrix from, Matrix to) {
  for_each_element(ctx, to.rows, to.cols, ops::ChannelsLastFromPlanar{from, to, d.c, d.h * d.w});
}

}  // namespace xpipe
