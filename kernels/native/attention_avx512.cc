// The attention's AVX-512 path: scores 16 slots a zmm (one lane a slot, the dimensions in order),
// one key block converted once for up to 12 queries, and up to 8 blocks at once where the queries
// are few (a row's 6 or 7 heads of a KV head), so the FMAs never wait on each other's results, the
// next blocks prefetched (a block is a 4 KB page, where the hardware's prefetchers stop); the
// weighted values 32 dimensions a query (two zmm), one value row converted once for up to 12
// queries, the rows read whole in blocks of 64 (a weigh task takes every dimension of its 12
// queries) rather than a strip of every row; the arithmetic of attention.h, lane for lane.
#if defined(__x86_64__) || defined(_M_X64)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "attention.h"
#include "attention_rope.h"
#include "exp_avx512.h"

namespace specedge {
namespace {

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

// Key blocks scored at once for C queries: enough independent sums to keep the FMA units busy (a
// score is a chain of d dependent FMAs), C * NB + NB + 1 within the 32 zmm registers.
constexpr int blocks_at_once(int c) { return c <= 2 ? 8 : c <= 6 ? 4 : 2; }

// Scores of queries [r0, r0 + C) over key blocks [b, b + NB): each key row converted once for all C.
template <int C, int NB>
inline void score_blocks(const float* q, int64_t d, const uint16_t* blocks, float* scores, int64_t stride) {
  __m512 acc[C][NB];
#pragma GCC unroll 16
  for (int k = 0; k < C; ++k) {
#pragma GCC unroll 16
    for (int n = 0; n < NB; ++n) acc[k][n] = _mm512_setzero_ps();
  }
  // The next NB blocks, prefetched while these are scored: a block is one 4 KB page, where the
  // hardware's prefetchers stop, so they would start cold at every block.
  const char* next = reinterpret_cast<const char*>(blocks + NB * d * kSlotBlock);
  for (int64_t i = 0; i < d; ++i) {
#pragma GCC unroll 16
    for (int n = 0; n < NB; n += 2) _mm_prefetch(next + (i * NB + n) * kSlotBlock * 2, _MM_HINT_T0);
    __m512 kv[NB];
#pragma GCC unroll 16
    for (int n = 0; n < NB; ++n) kv[n] = load_half16(blocks + (n * d + i) * kSlotBlock);
#pragma GCC unroll 16
    for (int k = 0; k < C; ++k) {
      const __m512 w = _mm512_set1_ps(q[k * d + i]);
#pragma GCC unroll 16
      for (int n = 0; n < NB; ++n) acc[k][n] = _mm512_fmadd_ps(w, kv[n], acc[k][n]);
    }
  }
#pragma GCC unroll 16
  for (int k = 0; k < C; ++k) {
#pragma GCC unroll 16
    for (int n = 0; n < NB; ++n) _mm512_storeu_ps(scores + k * stride + n * kSlotBlock, acc[k][n]);
  }
}

template <int C>
void score_chunk(const AttentionPass& p, const Queries& q, int64_t r0, int64_t b0, int64_t b1, float* scores) {
  constexpr int NB = blocks_at_once(C);
  const int64_t d = p.head_dim;
  const uint16_t* keys = p.keys + q.kv * (p.slots / kSlotBlock) * d * kSlotBlock;
  const float* qs = q.q + r0 * d;
  float* out = scores + r0 * p.stride;
  int64_t b = b0;
  for (; b + NB <= b1; b += NB) score_blocks<C, NB>(qs, d, keys + b * d * kSlotBlock, out + b * kSlotBlock, p.stride);
  for (; b < b1; ++b) score_blocks<C, 1>(qs, d, keys + b * d * kSlotBlock, out + b * kSlotBlock, p.stride);
}

using ScoreChunk = void (*)(const AttentionPass&, const Queries&, int64_t, int64_t, int64_t, float*);
constexpr ScoreChunk kScoreChunks[] = {nullptr,          score_chunk<1>,  score_chunk<2>, score_chunk<3>,
                                       score_chunk<4>,   score_chunk<5>,  score_chunk<6>, score_chunk<7>,
                                       score_chunk<8>,   score_chunk<9>,  score_chunk<10>, score_chunk<11>,
                                       score_chunk<12>};
constexpr int64_t kMostQueries = 12;  // queries a chunk takes at most

// Queries 12 at a time, then the rest (1..11) as one chunk.
void scores_avx512(const AttentionPass& p, const Queries& q, int64_t b0, int64_t b1, float* scores) {
  int64_t r = 0;
  for (; r + kMostQueries <= q.count; r += kMostQueries) score_chunk<kMostQueries>(p, q, r, b0, b1, scores);
  if (r < q.count) kScoreChunks[q.count - r](p, q, r, b0, b1, scores);
}

float softmax_avx512(float* e, int64_t n, int64_t skip0, int64_t skip1) {
  const int64_t blocks = (n + kSlotBlock - 1) / kSlotBlock, b0 = skip0 / kSlotBlock, b1 = skip1 / kSlotBlock;
  const __mmask16 last = static_cast<__mmask16>((1u << (n - (blocks - 1) * kSlotBlock)) - 1u);
  __m512 mv = _mm512_set1_ps(-INFINITY);
  for (int64_t b = 0; b < blocks; ++b) {
    if (b >= b0 && b < b1) b = b1;  // blocks the row does not see
    if (b >= blocks) break;
    const __mmask16 keep = b + 1 < blocks ? static_cast<__mmask16>(0xFFFF) : last;
    mv = _mm512_mask_max_ps(mv, keep, mv, _mm512_loadu_ps(e + b * kSlotBlock));
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 lanes = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    if (b >= b0 && b < b1) b = b1;
    if (b >= blocks) break;
    const __mmask16 keep = b + 1 < blocks ? static_cast<__mmask16>(0xFFFF) : last;
    const __m512 x = _mm512_maskz_mov_ps(keep, exp16(_mm512_sub_ps(_mm512_loadu_ps(e + b * kSlotBlock), m)));
    _mm512_storeu_ps(e + b * kSlotBlock, x);
    lanes = _mm512_add_ps(lanes, x);
  }
  return lane_sum(lanes);
}

constexpr int64_t kRowsAtOnce = 64;  // value rows a block: read whole, then each strip of dimensions from L1
constexpr int64_t kMostHeadDim = 512;

// The sums of outputs [i, i + 16 Z) of queries [r0, r0 + C) carried over value rows [j0, j1) (acc: [C][d]
// floats, zero before the first block), the rows in order; `ahead`: prefetch the block after this one.
template <int C, int Z>
void weigh_rows(const AttentionPass& p, const Queries& q, const float* e, int64_t r0, int64_t i, int64_t j0,
                int64_t j1, float* acc_mem, bool ahead) {
  const int64_t d = p.head_dim;
  const uint16_t* values = p.values + q.kv * p.slots * d;
  __m512 acc[C][Z];
#pragma GCC unroll 16
  for (int k = 0; k < C; ++k) {
#pragma GCC unroll 16
    for (int z = 0; z < Z; ++z) acc[k][z] = _mm512_loadu_ps(acc_mem + k * d + i + 16 * z);
  }
  const int64_t all = std::min(j1, q.limit[r0]), most = std::min(j1, q.limit[r0 + C - 1]);  // limits never fall
  const int64_t lines = (d * 2 + 63) / 64;  // cache lines a value row spans (at most)
  int64_t j = j0;
  for (; j < all; ++j) {
    if (ahead) {
      for (int64_t l = 0; l < lines; ++l) {
        _mm_prefetch(reinterpret_cast<const char*>(values + (j + kRowsAtOnce) * d) + 64 * l, _MM_HINT_T0);
      }
    }
    __m512 v[Z];
#pragma GCC unroll 16
    for (int z = 0; z < Z; ++z) v[z] = load_half16(values + j * d + i + 16 * z);
#pragma GCC unroll 16
    for (int k = 0; k < C; ++k) {
      const __m512 w = _mm512_set1_ps(e[(r0 + k) * p.stride + j]);
#pragma GCC unroll 16
      for (int z = 0; z < Z; ++z) acc[k][z] = _mm512_fmadd_ps(w, v[z], acc[k][z]);
    }
  }
  for (; j < most; ++j) {  // slots past the first queries' positions: the later rows' only
    __m512 v[Z];
#pragma GCC unroll 16
    for (int z = 0; z < Z; ++z) v[z] = load_half16(values + j * d + i + 16 * z);
#pragma GCC unroll 16
    for (int k = 0; k < C; ++k) {
      if (q.limit[r0 + k] <= j) continue;
      const __m512 w = _mm512_set1_ps(e[(r0 + k) * p.stride + j]);
#pragma GCC unroll 16
      for (int z = 0; z < Z; ++z) acc[k][z] = _mm512_fmadd_ps(w, v[z], acc[k][z]);
    }
  }
#pragma GCC unroll 16
  for (int k = 0; k < C; ++k) {
#pragma GCC unroll 16
    for (int z = 0; z < Z; ++z) _mm512_storeu_ps(acc_mem + k * d + i + 16 * z, acc[k][z]);
  }
}

// Outputs [i0, i1) of queries [r0, r0 + C): the value rows in blocks of kRowsAtOnce, each block's
// rows read whole (contiguous, prefetched a block ahead) and then weighed strip by strip (32
// dimensions, 2 zmm a query) from L1; each output is still its fma chain over the slots in order.
template <int C>
void weigh_chunk(const AttentionPass& p, const Queries& q, const float* e, const float* sums, int64_t r0, int64_t i0,
                 int64_t i1) {
  const int64_t d = p.head_dim, most = q.limit[r0 + C - 1];
  alignas(64) float acc[C * kMostHeadDim];
  for (int64_t k = 0; k < C; ++k) std::fill(acc + k * d + i0, acc + k * d + i1, 0.0f);
  const int64_t spans[2][2] = {{0, std::min(most, q.gap0)}, {q.gap1, most}};
  for (const auto& span : spans) {  // the slots before and after those no query sees
    for (int64_t j0 = span[0]; j0 < span[1]; j0 += kRowsAtOnce) {
      const int64_t j1 = std::min(span[1], j0 + kRowsAtOnce);
      int64_t i = i0;
      for (; i + 32 <= i1; i += 32) weigh_rows<C, 2>(p, q, e, r0, i, j0, j1, acc, i == i0);
      for (; i < i1; i += 16) weigh_rows<C, 1>(p, q, e, r0, i, j0, j1, acc, i == i0);
    }
  }
  for (int64_t k = 0; k < C; ++k) {
    float* out = query_out(p, q.kv, r0 + k);
    const __m512 total = _mm512_set1_ps(sums[r0 + k]);
    for (int64_t i = i0; i < i1; i += 16) {
      _mm512_storeu_ps(out + i, _mm512_div_ps(_mm512_loadu_ps(acc + k * d + i), total));
    }
  }
}

using WeighChunk = void (*)(const AttentionPass&, const Queries&, const float*, const float*, int64_t, int64_t,
                            int64_t);
constexpr WeighChunk kWeighChunks[] = {nullptr,         weigh_chunk<1>,  weigh_chunk<2>,  weigh_chunk<3>,
                                       weigh_chunk<4>,  weigh_chunk<5>,  weigh_chunk<6>,  weigh_chunk<7>,
                                       weigh_chunk<8>,  weigh_chunk<9>,  weigh_chunk<10>, weigh_chunk<11>,
                                       weigh_chunk<12>};

// Queries [r0, r1) 12 at a time, then the rest as one chunk.
void weigh_avx512(const AttentionPass& p, const Queries& q, const float* e, const float* sums, int64_t r0, int64_t r1,
                  int64_t i0, int64_t i1) {
  int64_t r = r0;
  for (; r + kMostQueries <= r1; r += kMostQueries) weigh_chunk<kMostQueries>(p, q, e, sums, r, i0, i1);
  if (r < r1) kWeighChunks[r1 - r](p, q, e, sums, r, i0, i1);
}

}  // namespace

AttentionIsa avx512_attention() {
  return AttentionIsa{"avx512", scores_avx512, softmax_avx512, weigh_avx512, 0, kMostQueries, write_rows,
                      prepare_rows};
}

}  // namespace specedge

#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif
