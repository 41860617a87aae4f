// ARM path: sdot (the dot-product extension, Armv8.2 and later; every phone SoC since about 2018)
// sums four int8 x int8 products into int32 exactly. Codes 0..15 are valid int8, so the same packed
// chunk feeds it: 16 bytes are 4 columns x 4 k, against 4 activation bytes taken by lane. Tiles of up to
// 6 rows, as on x86 (their 12 accumulators fit ARM's 32 vector registers beside the unpacked chunk).
#if defined(__aarch64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif

#include <arm_neon.h>

#include "int4_matmul.h"

namespace specedge {
namespace {

template <int R>
void tile(const Int4Weights& w, const QuantizedRows& x, int64_t g, int64_t r0, float* y) {
  const int64_t k = w.k, blocks = k / w.block;
  const uint8x16_t low = vdupq_n_u8(0x0F);
  const uint8_t* p = group_chunks(w, g);
  float32x4_t acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    int32x4_t d[R][2];
    for (int r = 0; r < R; ++r) d[r][0] = d[r][1] = vdupq_n_s32(0);
    for (int64_t kk = b * w.block; kk < (b + 1) * w.block; kk += 8, p += chunk_stride(w)) {
      const uint8x16_t p0 = vld1q_u8(p), p1 = vld1q_u8(p + 16);
      const int8x16_t lo0 = vreinterpretq_s8_u8(vandq_u8(p0, low)), hi0 = vreinterpretq_s8_u8(vshrq_n_u8(p0, 4));
      const int8x16_t lo1 = vreinterpretq_s8_u8(vandq_u8(p1, low)), hi1 = vreinterpretq_s8_u8(vshrq_n_u8(p1, 4));
      for (int r = 0; r < R; ++r) {
        const int8x8_t xk = vld1_s8(x.q + (r0 + r) * k + kk);
        d[r][0] = vdotq_lane_s32(vdotq_lane_s32(d[r][0], lo0, xk, 0), hi0, xk, 1);
        d[r][1] = vdotq_lane_s32(vdotq_lane_s32(d[r][1], lo1, xk, 0), hi1, xk, 1);
      }
    }
    const int64_t at = group_block(w, g, b);
    const uint16x8_t z16 = vmovl_u8(vld1_u8(w.zeros + at));
    const int32x4_t z[2] = {vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(z16))),
                            vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(z16)))};
    const float32x4_t scale[2] = {vld1q_f32(w.scales + at), vld1q_f32(w.scales + at + 4)};
    for (int r = 0; r < R; ++r) {
      const int64_t xb = (r0 + r) * blocks + b;
      const float32x4_t xs = vdupq_n_f32(x.scale[xb]);
      const int32x4_t xsum = vdupq_n_s32(x.sum[xb]);
      for (int h = 0; h < 2; ++h) {
        const float32x4_t t = vcvtq_f32_s32(vsubq_s32(d[r][h], vmulq_s32(z[h], xsum)));
        acc[r][h] = vaddq_f32(acc[r][h], vmulq_f32(t, vmulq_f32(scale[h], xs)));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    vst1q_f32(y + (r0 + r) * w.n + g * 8, acc[r][0]);
    vst1q_f32(y + (r0 + r) * w.n + g * 8 + 4, acc[r][1]);
  }
}

}  // namespace

void panels_neon_dot(const Int4Weights& w, const QuantizedRows& x, int64_t p0, int64_t p1, float* y) {
  each_tile(w, p0, p1, x.m, [&](auto rows, int64_t g, int64_t r0) { tile<decltype(rows)::value>(w, x, g, r0, y); });
}

}  // namespace specedge

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
