// The attention's AVX-512 path: 16 slots a zmm for the scores (one lane a slot, the dimensions in
// order), 16 dimensions a zmm for the weighted values; the arithmetic of attention.h, lane for lane.
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif

#include <immintrin.h>

#include <cmath>

#include "attention.h"

namespace specedge {
namespace {

inline __m512 exp16(__m512 x) {
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  __m512 y = _mm512_fmadd_ps(p, r2, r);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 e = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpFloor), _CMP_GE_OQ), e);
}

inline __m512 load_half16(const uint16_t* h) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
}

// Lanes l + w into l for w = 8, 4, 2, 1: lane 0.
inline float lane_sum(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 e = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(e);
}

// Scores of slot blocks [b0, b0 + R) into scratch: R accumulators, the dimensions in order.
template <int R>
inline void score_blocks(const float* qs, const uint16_t* keys, int64_t d, int64_t b0, float* scratch) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const uint16_t* kb = keys + b0 * d * kSlotBlock;
  for (int64_t i = 0; i < d; ++i) {
    const __m512 q = _mm512_set1_ps(qs[i]);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(q, load_half16(kb + (r * d + i) * kSlotBlock), acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(scratch + (b0 + r) * kSlotBlock, acc[r]);
}

// out[i0 .. i0 + 16 C) = sum over slots of e[j] * v_j, slots in order.
template <int C>
inline void weigh_values(const float* e, const uint16_t* values, int64_t d, int64_t n, int64_t i0, float sum,
                         float* out) {
  __m512 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const __m512 w = _mm512_set1_ps(e[j]);
    const uint16_t* vj = values + j * d + i0;
    for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(w, load_half16(vj + 16 * c), acc[c]);
  }
  const __m512 total = _mm512_set1_ps(sum);
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + i0 + 16 * c, _mm512_div_ps(acc[c], total));
}

}  // namespace

void head_avx512(const AttentionPass& p, int64_t row, int64_t head, float* scratch) {
  const int64_t d = p.head_dim, half = d / 2, width = (p.heads + 2 * p.kv_heads) * d;
  const int64_t pos = p.pos[row], g = head / (p.heads / p.kv_heads), n = pos + 1;
  const int64_t blocks = (n + kSlotBlock - 1) / kSlotBlock;
  const float* q = p.qkv + row * width + head * d;
  const float* c = p.cos + pos * half;
  const float* sn = p.sin + pos * half;
  alignas(64) float qs[512];
  for (int64_t i = 0; i < half; ++i) {  // d numbers: the scalar rope, as every path
    qs[i] = rope_low(q[i], q[i + half], c[i], sn[i]) * p.scale;
    qs[i + half] = rope_high(q[i], q[i + half], c[i], sn[i]) * p.scale;
  }
  const uint16_t* keys = p.keys + g * (p.slots / kSlotBlock) * d * kSlotBlock;
  int64_t b = 0;
  for (; b + 4 <= blocks; b += 4) score_blocks<4>(qs, keys, d, b, scratch);
  for (; b < blocks; ++b) score_blocks<1>(qs, keys, d, b, scratch);

  const __mmask16 last = static_cast<__mmask16>((1u << (n - (blocks - 1) * kSlotBlock)) - 1u);
  __m512 mv = _mm512_set1_ps(-INFINITY);
  for (b = 0; b < blocks; ++b) {
    const __mmask16 keep = b + 1 < blocks ? static_cast<__mmask16>(0xFFFF) : last;
    mv = _mm512_mask_max_ps(mv, keep, mv, _mm512_loadu_ps(scratch + b * kSlotBlock));
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 lanes = _mm512_setzero_ps();
  for (b = 0; b < blocks; ++b) {
    const __mmask16 keep = b + 1 < blocks ? static_cast<__mmask16>(0xFFFF) : last;
    const __m512 e = _mm512_maskz_mov_ps(keep, exp16(_mm512_sub_ps(_mm512_loadu_ps(scratch + b * kSlotBlock), m)));
    _mm512_storeu_ps(scratch + b * kSlotBlock, e);
    lanes = _mm512_add_ps(lanes, e);
  }
  const float sum = lane_sum(lanes);

  const uint16_t* values = p.values + g * p.slots * d;
  float* out = p.out + row * p.heads * d + head * d;
  int64_t i0 = 0;
  for (; i0 + 128 <= d; i0 += 128) weigh_values<8>(scratch, values, d, n, i0, sum, out);
  for (; i0 + 64 <= d; i0 += 64) weigh_values<4>(scratch, values, d, n, i0, sum, out);
  for (; i0 < d; i0 += 16) weigh_values<1>(scratch, values, d, n, i0, sum, out);
}

}  // namespace specedge

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
