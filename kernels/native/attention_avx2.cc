// The attention's AVX2 path (with FMA and F16C): scores 16 slots two ymm (one lane a slot, the
// dimensions in order), one key block converted once for up to 6 queries; the weighted values 16
// dimensions a query (two ymm), one value row converted once for up to 6 queries; the arithmetic of
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
#include "attention_rope.h"
#include "exp_avx2.h"

namespace specedge {
namespace {

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

inline __m256 lane_mask(int64_t lanes) {  // the first `lanes` (0..8) lanes all ones
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lanes)), index));
}

// Scores of queries [r0, r0 + C) over one key block.
template <int C>
inline void score_block(const float* q, int64_t d, const uint16_t* block, float* scores, int64_t stride) {
  __m256 lo[C], hi[C];
  for (int k = 0; k < C; ++k) lo[k] = hi[k] = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; ++i) {
    const __m256 k0 = load_half8(block + i * kSlotBlock), k1 = load_half8(block + i * kSlotBlock + 8);
    for (int k = 0; k < C; ++k) {
      const __m256 w = _mm256_set1_ps(q[k * d + i]);
      lo[k] = _mm256_fmadd_ps(w, k0, lo[k]);
      hi[k] = _mm256_fmadd_ps(w, k1, hi[k]);
    }
  }
  for (int k = 0; k < C; ++k) {
    _mm256_storeu_ps(scores + k * stride, lo[k]);
    _mm256_storeu_ps(scores + k * stride + 8, hi[k]);
  }
}

template <int C>
void score_chunk(const AttentionPass& p, const Queries& q, int64_t r0, int64_t b0, int64_t b1, float* scores) {
  const int64_t d = p.head_dim;
  const uint16_t* keys = p.keys + q.kv * (p.slots / kSlotBlock) * d * kSlotBlock;
  for (int64_t b = b0; b < b1; ++b) {
    score_block<C>(q.q + r0 * d, d, keys + b * d * kSlotBlock, scores + r0 * p.stride + b * kSlotBlock, p.stride);
  }
}

void scores_avx2(const AttentionPass& p, const Queries& q, int64_t b0, int64_t b1, float* scores) {
  int64_t r = 0;
  for (; r + 6 <= q.count; r += 6) score_chunk<6>(p, q, r, b0, b1, scores);
  for (; r + 2 <= q.count; r += 2) score_chunk<2>(p, q, r, b0, b1, scores);
  for (; r < q.count; ++r) score_chunk<1>(p, q, r, b0, b1, scores);
}

float softmax_avx2(float* e, int64_t n, int64_t skip0, int64_t skip1) {
  const int64_t blocks = (n + kSlotBlock - 1) / kSlotBlock, tail = n - (blocks - 1) * kSlotBlock;
  const int64_t b0 = skip0 / kSlotBlock, b1 = skip1 / kSlotBlock;  // blocks the row does not see
  const __m256 last_lo = lane_mask(tail), last_hi = lane_mask(tail - 8), low = _mm256_set1_ps(-INFINITY);
  __m256 m_lo = low, m_hi = low;
  for (int64_t b = 0; b < blocks; ++b) {
    if (b >= b0 && b < b1) b = b1;
    if (b >= blocks) break;
    __m256 lo = _mm256_loadu_ps(e + b * kSlotBlock), hi = _mm256_loadu_ps(e + b * kSlotBlock + 8);
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
  for (int64_t b = 0; b < blocks; ++b) {
    if (b >= b0 && b < b1) b = b1;
    if (b >= blocks) break;
    __m256 lo = exp8(_mm256_sub_ps(_mm256_loadu_ps(e + b * kSlotBlock), m));
    __m256 hi = exp8(_mm256_sub_ps(_mm256_loadu_ps(e + b * kSlotBlock + 8), m));
    if (b + 1 == blocks) {
      lo = _mm256_and_ps(lo, last_lo);
      hi = _mm256_and_ps(hi, last_hi);
    }
    _mm256_storeu_ps(e + b * kSlotBlock, lo);
    _mm256_storeu_ps(e + b * kSlotBlock + 8, hi);
    lanes_lo = _mm256_add_ps(lanes_lo, lo);
    lanes_hi = _mm256_add_ps(lanes_hi, hi);
  }
  return lane_sum(lanes_lo, lanes_hi);
}

// Outputs [i, i + 16) of queries [r0, r0 + C): the value rows in order, each converted once.
template <int C>
void weigh_chunk(const AttentionPass& p, const Queries& q, const float* e, const float* sums, int64_t r0, int64_t i) {
  const int64_t d = p.head_dim;
  const uint16_t* values = p.values + q.kv * p.slots * d + i;
  __m256 lo[C], hi[C];
  for (int k = 0; k < C; ++k) lo[k] = hi[k] = _mm256_setzero_ps();
  const int64_t first = q.limit[r0], most = q.limit[r0 + C - 1];  // limits never fall from one query to the next
  const int64_t spans[2][2] = {{0, std::min(most, q.gap0)}, {q.gap1, most}};  // around the slots none sees
  for (const auto& span : spans) {
    const int64_t all = std::min(first, span[1]);
    int64_t j = span[0];
    for (; j < all; ++j) {
      const __m256 v0 = load_half8(values + j * d), v1 = load_half8(values + j * d + 8);
      for (int k = 0; k < C; ++k) {
        const __m256 w = _mm256_set1_ps(e[(r0 + k) * p.stride + j]);
        lo[k] = _mm256_fmadd_ps(w, v0, lo[k]);
        hi[k] = _mm256_fmadd_ps(w, v1, hi[k]);
      }
    }
    for (; j < span[1]; ++j) {  // slots past the first queries' positions: the later rows' only
      const __m256 v0 = load_half8(values + j * d), v1 = load_half8(values + j * d + 8);
      for (int k = 0; k < C; ++k) {
        if (q.limit[r0 + k] <= j) continue;
        const __m256 w = _mm256_set1_ps(e[(r0 + k) * p.stride + j]);
        lo[k] = _mm256_fmadd_ps(w, v0, lo[k]);
        hi[k] = _mm256_fmadd_ps(w, v1, hi[k]);
      }
    }
  }
  for (int k = 0; k < C; ++k) {
    float* out = query_out(p, q.kv, r0 + k) + i;
    const __m256 total = _mm256_set1_ps(sums[r0 + k]);
    _mm256_storeu_ps(out, _mm256_div_ps(lo[k], total));
    _mm256_storeu_ps(out + 8, _mm256_div_ps(hi[k], total));
  }
}

void weigh_avx2(const AttentionPass& p, const Queries& q, const float* e, const float* sums, int64_t r0, int64_t r1,
                int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; i += 16) {
    int64_t r = r0;
    for (; r + 6 <= r1; r += 6) weigh_chunk<6>(p, q, e, sums, r, i);
    for (; r + 2 <= r1; r += 2) weigh_chunk<2>(p, q, e, sums, r, i);
    for (; r < r1; ++r) weigh_chunk<1>(p, q, e, sums, r, i);
  }
}

}  // namespace

AttentionIsa avx2_attention() {
  return AttentionIsa{"avx2", scores_avx2, softmax_avx2, weigh_avx2, 16, 0, write_rows, prepare_rows};
}

}  // namespace specedge

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
