// The attention's AVX2 path (with FMA and F16C): 16 slots two ymm for the scores (one lane a slot,
// the dimensions in order), 8 dimensions a ymm for the weighted values; the arithmetic of
// attention.h, lane for lane.
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>

#include <cmath>

#include "attention.h"

namespace specedge {
namespace {

inline __m256 exp8(__m256 x) {
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  __m256 y = _mm256_fmadd_ps(p, r2, r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
  return _mm256_and_ps(e, _mm256_cmp_ps(x, _mm256_set1_ps(kExpFloor), _CMP_GE_OQ));
}

inline __m256 load_half8(const uint16_t* h) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}

// Lanes l + w into l for w = 8, 4, 2, 1 of the 16 lanes lo (0..7) and hi (8..15): lane 0.
inline float lane_sum(__m256 lo, __m256 hi) {
  const __m256 a = _mm256_add_ps(lo, hi);
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 e = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(e);
}

// Scores of slot blocks [b0, b0 + R) into scratch: 2R accumulators, the dimensions in order.
template <int R>
inline void score_blocks(const float* qs, const uint16_t* keys, int64_t d, int64_t b0, float* scratch) {
  __m256 acc[2 * R];
  for (int r = 0; r < 2 * R; ++r) acc[r] = _mm256_setzero_ps();
  const uint16_t* kb = keys + b0 * d * kSlotBlock;
  for (int64_t i = 0; i < d; ++i) {
    const __m256 q = _mm256_set1_ps(qs[i]);
    for (int r = 0; r < R; ++r) {
      const uint16_t* k = kb + (r * d + i) * kSlotBlock;
      acc[2 * r] = _mm256_fmadd_ps(q, load_half8(k), acc[2 * r]);
      acc[2 * r + 1] = _mm256_fmadd_ps(q, load_half8(k + 8), acc[2 * r + 1]);
    }
  }
  for (int r = 0; r < 2 * R; ++r) _mm256_storeu_ps(scratch + b0 * kSlotBlock + 8 * r, acc[r]);
}

// out[i0 .. i0 + 8 C) = sum over slots of e[j] * v_j, slots in order.
template <int C>
inline void weigh_values(const float* e, const uint16_t* values, int64_t d, int64_t n, int64_t i0, float sum,
                         float* out) {
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const __m256 w = _mm256_set1_ps(e[j]);
    const uint16_t* vj = values + j * d + i0;
    for (int c = 0; c < C; ++c) acc[c] = _mm256_fmadd_ps(w, load_half8(vj + 8 * c), acc[c]);
  }
  const __m256 total = _mm256_set1_ps(sum);
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + i0 + 8 * c, _mm256_div_ps(acc[c], total));
}

inline __m256 lane_mask(int64_t lanes) {  // the first `lanes` (0..8) lanes all ones
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lanes)), index));
}

}  // namespace

void head_avx2(const AttentionPass& p, int64_t row, int64_t head, float* scratch) {
  const int64_t d = p.head_dim, half = d / 2, width = (p.heads + 2 * p.kv_heads) * d;
  const int64_t pos = p.pos[row], g = head / (p.heads / p.kv_heads), n = pos + 1;
  const int64_t blocks = (n + kSlotBlock - 1) / kSlotBlock;
  const float* q = p.qkv + row * width + head * d;
  const float* c = p.cos + pos * half;
  const float* sn = p.sin + pos * half;
  alignas(32) float qs[512];
  for (int64_t i = 0; i < half; ++i) {  // d numbers: the scalar rope, as every path
    qs[i] = rope_low(q[i], q[i + half], c[i], sn[i]) * p.scale;
    qs[i + half] = rope_high(q[i], q[i + half], c[i], sn[i]) * p.scale;
  }
  const uint16_t* keys = p.keys + g * (p.slots / kSlotBlock) * d * kSlotBlock;
  int64_t b = 0;
  for (; b + 4 <= blocks; b += 4) score_blocks<4>(qs, keys, d, b, scratch);
  for (; b < blocks; ++b) score_blocks<1>(qs, keys, d, b, scratch);

  const int64_t tail = n - (blocks - 1) * kSlotBlock;  // 1..16 slots of the last block
  const __m256 last_lo = lane_mask(tail), last_hi = lane_mask(tail - 8);
  const __m256 low = _mm256_set1_ps(-INFINITY);
  __m256 m_lo = low, m_hi = low;
  for (b = 0; b < blocks; ++b) {
    __m256 lo = _mm256_loadu_ps(scratch + b * kSlotBlock), hi = _mm256_loadu_ps(scratch + b * kSlotBlock + 8);
    if (b + 1 == blocks) {
      lo = _mm256_blendv_ps(low, lo, last_lo);
      hi = _mm256_blendv_ps(low, hi, last_hi);
    }
    m_lo = _mm256_max_ps(m_lo, lo);
    m_hi = _mm256_max_ps(m_hi, hi);
  }
  alignas(32) float maxes[16];
  _mm256_store_ps(maxes, m_lo);
  _mm256_store_ps(maxes + 8, m_hi);
  float top = -INFINITY;
  for (float v : maxes) top = std::fmax(top, v);
  const __m256 m = _mm256_set1_ps(top);
  __m256 lanes_lo = _mm256_setzero_ps(), lanes_hi = _mm256_setzero_ps();
  for (b = 0; b < blocks; ++b) {
    __m256 lo = exp8(_mm256_sub_ps(_mm256_loadu_ps(scratch + b * kSlotBlock), m));
    __m256 hi = exp8(_mm256_sub_ps(_mm256_loadu_ps(scratch + b * kSlotBlock + 8), m));
    if (b + 1 == blocks) {
      lo = _mm256_and_ps(lo, last_lo);
      hi = _mm256_and_ps(hi, last_hi);
    }
    _mm256_storeu_ps(scratch + b * kSlotBlock, lo);
    _mm256_storeu_ps(scratch + b * kSlotBlock + 8, hi);
    lanes_lo = _mm256_add_ps(lanes_lo, lo);
    lanes_hi = _mm256_add_ps(lanes_hi, hi);
  }
  const float sum = lane_sum(lanes_lo, lanes_hi);

  const uint16_t* values = p.values + g * p.slots * d;
  float* out = p.out + row * p.heads * d + head * d;
  int64_t i0 = 0;
  for (; i0 + 64 <= d; i0 += 64) weigh_values<8>(scratch, values, d, n, i0, sum, out);
  for (; i0 + 32 <= d; i0 += 32) weigh_values<4>(scratch, values, d, n, i0, sum, out);
  for (; i0 < d; i0 += 8) weigh_values<1>(scratch, values, d, n, i0, sum, out);
}

}  // namespace specedge

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
