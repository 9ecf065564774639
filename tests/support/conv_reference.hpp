// A 2-D convolution in double over channels-last images and OIHW weights, the tests' oracle for
// every backend's convolution (the im2col passes, oneDNN's direct and Winograd kernels).
#pragma once

#include <cmath>
#include <vector>

#include "xpipe/core/conv_geometry.hpp"

namespace xpipe::test {

//! The direct convolution of g in double, one 7-loop nest (image, output channel, output pixel,
//! input channel, kernel offset) for the forward and all three gradients of dy; beside each
//! output the sum of its terms' magnitudes (what float rounding in any summation order scales
//! with). b is read only where g.bias.
//! Usage: `const DirectConv ref = direct_conv(g, x, w, b, dy); ref.y[i], ref.y_abs[i]`.
struct DirectConv {
  std::vector<double> y, dx, dw, db;
  std::vector<double> y_abs, dx_abs, dw_abs, db_abs;
};
inline DirectConv direct_conv(const ConvGeometry& g, const std::vector<float>& x,
                              const std::vector<float>& w, const std::vector<float>& b,
                              const std::vector<float>& dy) {
  DirectConv d;
  d.y.assign(static_cast<std::size_t>(g.rows * g.out_floats()), 0.0);
  d.dx.assign(x.size(), 0.0);
  d.dw.assign(w.size(), 0.0);
  d.db.assign(static_cast<std::size_t>(g.oc), 0.0);
  d.y_abs = d.y, d.dx_abs = d.dx, d.dw_abs = d.dw, d.db_abs = d.db;
  // x and y channels-last (channel fastest), w OIHW.
  auto xi = [&](index_t n, int c, int iy, int ix) { return ((n * g.h + iy) * g.w + ix) * g.c + c; };
  auto wi = [&](int o, int c, int ky, int kx) {
    return ((index_t{o} * g.c + c) * g.k + ky) * g.k + kx;
  };
  auto yi = [&](index_t n, int o, int oy, int ox) {
    return ((n * g.oh + oy) * g.ow + ox) * g.oc + o;
  };
  for (index_t n = 0; n < g.rows; ++n)
    for (int o = 0; o < g.oc; ++o)
      for (int oy = 0; oy < g.oh; ++oy)
        for (int ox = 0; ox < g.ow; ++ox) {
          double acc = g.bias ? b[o] : 0.0, acc_abs = std::fabs(acc);
          const double grad = dy[yi(n, o, oy, ox)];
          if (g.bias) d.db[o] += grad, d.db_abs[o] += std::fabs(grad);
          for (int c = 0; c < g.c; ++c)
            for (int ky = 0; ky < g.k; ++ky)
              for (int kx = 0; kx < g.k; ++kx) {
                const int iy = oy * g.stride - g.pad + ky, ix = ox * g.stride - g.pad + kx;
                if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                const double wx = double{w[wi(o, c, ky, kx)]} * x[xi(n, c, iy, ix)],
                             wg = double{w[wi(o, c, ky, kx)]} * grad,
                             xg = double{x[xi(n, c, iy, ix)]} * grad;
                acc += wx, acc_abs += std::fabs(wx);
                d.dx[xi(n, c, iy, ix)] += wg, d.dx_abs[xi(n, c, iy, ix)] += std::fabs(wg);
                d.dw[wi(o, c, ky, kx)] += xg, d.dw_abs[wi(o, c, ky, kx)] += std::fabs(xg);
              }
          d.y[yi(n, o, oy, ox)] = acc, d.y_abs[yi(n, o, oy, ox)] = acc_abs;
        }
  return d;
}

}  // namespace xpipe::test
