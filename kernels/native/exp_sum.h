// The weight of a row of logits beyond a cut: the sum, over the ids i < n with z[i] < below, of
// exp((z[i] - top) * scale) - a sampling law's tail total (kernels/laws.py) and a softmax's
// denominator (below = +inf, scale = 1). The runtime asks it of every row it samples from: in numpy
// it read the row four times and cost ~0.2 ms on a 151,936-id row; here one pass.
//
// Arithmetic, the same on every instruction set (kernels/exp_sum.py models it in numpy):
//   x = (z[i] - top) * scale (each rounded once, in float); e = x < -40 ? 0 : exp_rows(x) (attention.h;
//   top must be at least every z[i] summed, so x <= 0); lane l = i mod 16, a double, adds double(e)
//   in order of i from 0 (ids not summed add nothing); then lanes l + w into l for w = 8, 4, 2, 1;
//   the sum is lane 0. Ids with z[i] >= below or NaN are not summed (+inf never is).
#pragma once

#include <cstdint>

namespace specedge {

constexpr int64_t kSumLanes = 16;

using ExpSumFn = double (*)(const float* z, int64_t n, float top, float scale, float below);

struct ExpSumIsa {
  const char* name;
  ExpSumFn sum;
};

// The instruction sets this CPU runs the sum on, best first (the portable path last); returns how many.
int available_exp_sum_isas(ExpSumIsa* out, int capacity);

// The lanes' ids from `from` to n added into lanes, as every path adds its last ids; the fold of the lanes.
void add_exp_lanes(const float* z, int64_t from, int64_t n, float top, float scale, float below, double* lanes);
double fold_lanes(double* lanes);

#if defined(__x86_64__) || defined(_M_X64)
ExpSumIsa avx512_exp_sum();
ExpSumIsa avx2_exp_sum();
#endif

}  // namespace specedge
