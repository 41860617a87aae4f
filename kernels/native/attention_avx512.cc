// The attention's AVX-512 path: scores 16 slots a zmm (one lane a slot, the dimensions in order),
// one key block converted once for up to 12 queries; the weighted values 32 dimensions a query
// (two zmm), one value row converted once for up to 12 queries; the arithmetic of attention.h,
// lane for lane.
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
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 e = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(e);
}

// Scores of queries [r0, r0 + C) over one key block.
template <int C>
inline void score_block(const float* q, int64_t d, const uint16_t* block, float* scores, int64_t stride) {
  __m512 acc[C];
  for (int k = 0; k < C; ++k) acc[k] = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; ++i) {
    const __m512 kv = load_half16(block + i * kSlotBlock);
    for (int k = 0; k < C; ++k) acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(q[k * d + i]), kv, acc[k]);
  }
  for (int k = 0; k < C; ++k) _mm512_storeu_ps(scores + k * stride, acc[k]);
}

template <int C>
void score_chunk(const AttentionPass& p, const Queries& q, int64_t r0, int64_t b0, int64_t b1, float* scores) {
  const int64_t d = p.head_dim;
  const uint16_t* keys = p.keys + q.kv * (p.slots / kSlotBlock) * d * kSlotBlock;
  for (int64_t b = b0; b < b1; ++b) {
    score_block<C>(q.q + r0 * d, d, keys + b * d * kSlotBlock, scores + r0 * p.slots + b * kSlotBlock, p.slots);
  }
}

void scores_avx512(const AttentionPass& p, const Queries& q, int64_t b0, int64_t b1, float* scores) {
  int64_t r = 0;
  for (; r + 12 <= q.count; r += 12) score_chunk<12>(p, q, r, b0, b1, scores);
  for (; r + 4 <= q.count; r += 4) score_chunk<4>(p, q, r, b0, b1, scores);
  for (; r < q.count; ++r) score_chunk<1>(p, q, r, b0, b1, scores);
}

float softmax_avx512(float* e, int64_t n) {
  const int64_t blocks = (n + kSlotBlock - 1) / kSlotBlock;
  const __mmask16 last = static_cast<__mmask16>((1u << (n - (blocks - 1) * kSlotBlock)) - 1u);
  __m512 mv = _mm512_set1_ps(-INFINITY);
  for (int64_t b = 0; b < blocks; ++b) {
    const __mmask16 keep = b + 1 < blocks ? static_cast<__mmask16>(0xFFFF) : last;
    mv = _mm512_mask_max_ps(mv, keep, mv, _mm512_loadu_ps(e + b * kSlotBlock));
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 lanes = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __mmask16 keep = b + 1 < blocks ? static_cast<__mmask16>(0xFFFF) : last;
    const __m512 x = _mm512_maskz_mov_ps(keep, exp16(_mm512_sub_ps(_mm512_loadu_ps(e + b * kSlotBlock), m)));
    _mm512_storeu_ps(e + b * kSlotBlock, x);
    lanes = _mm512_add_ps(lanes, x);
  }
  return lane_sum(lanes);
}

// Outputs [i, i + 16 Z) of queries [r0, r0 + C): the value rows in order, each converted once.
template <int C, int Z>
void weigh_chunk(const AttentionPass& p, const Queries& q, const float* e, const float* sums, int64_t r0, int64_t i) {
  const int64_t d = p.head_dim;
  const uint16_t* values = p.values + q.kv * p.slots * d + i;
  __m512 acc[C][Z];
  for (int k = 0; k < C; ++k) {
    for (int z = 0; z < Z; ++z) acc[k][z] = _mm512_setzero_ps();
  }
  const int64_t all = q.limit[r0], most = q.limit[r0 + C - 1];  // limits never fall from one query to the next
  int64_t j = 0;
  for (; j < all; ++j) {
    __m512 v[Z];
    for (int z = 0; z < Z; ++z) v[z] = load_half16(values + j * d + 16 * z);
    for (int k = 0; k < C; ++k) {
      const __m512 w = _mm512_set1_ps(e[(r0 + k) * p.slots + j]);
      for (int z = 0; z < Z; ++z) acc[k][z] = _mm512_fmadd_ps(w, v[z], acc[k][z]);
    }
  }
  for (; j < most; ++j) {  // slots past the first queries' positions: the later rows' only
    __m512 v[Z];
    for (int z = 0; z < Z; ++z) v[z] = load_half16(values + j * d + 16 * z);
    for (int k = 0; k < C; ++k) {
      if (q.limit[r0 + k] <= j) continue;
      const __m512 w = _mm512_set1_ps(e[(r0 + k) * p.slots + j]);
      for (int z = 0; z < Z; ++z) acc[k][z] = _mm512_fmadd_ps(w, v[z], acc[k][z]);
    }
  }
  for (int k = 0; k < C; ++k) {
    float* out = query_out(p, q.kv, r0 + k) + i;
    const __m512 total = _mm512_set1_ps(sums[r0 + k]);
    for (int z = 0; z < Z; ++z) _mm512_storeu_ps(out + 16 * z, _mm512_div_ps(acc[k][z], total));
  }
}

template <int Z>
void weigh_dims(const AttentionPass& p, const Queries& q, const float* e, const float* sums, int64_t i) {
  int64_t r = 0;
  for (; r + 12 <= q.count; r += 12) weigh_chunk<12, Z>(p, q, e, sums, r, i);
  for (; r + 4 <= q.count; r += 4) weigh_chunk<4, Z>(p, q, e, sums, r, i);
  for (; r < q.count; ++r) weigh_chunk<1, Z>(p, q, e, sums, r, i);
}

void weigh_avx512(const AttentionPass& p, const Queries& q, const float* e, const float* sums, int64_t i0,
                  int64_t i1) {
  int64_t i = i0;
  for (; i + 32 <= i1; i += 32) weigh_dims<2>(p, q, e, sums, i);
  for (; i < i1; i += 16) weigh_dims<1>(p, q, e, sums, i);
}

}  // namespace

AttentionIsa avx512_attention() { return AttentionIsa{"avx512", scores_avx512, softmax_avx512, weigh_avx512, 32}; }

}  // namespace specedge

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
