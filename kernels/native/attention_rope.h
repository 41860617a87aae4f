// The rope and the cache write of attention.h, for each path to compile for its own instruction set:
// where the target has FMA (a target pragma before the include), __builtin_fmaf is one instruction
// rather than a call to libm's fmaf per element - one rounding either way, so the same bits. In an
// unnamed namespace: a translation unit's copy, compiled for its target, is never the one another
// translation unit links to.
#pragma once

#include "attention.h"

namespace specedge {
namespace {

inline float rope_lo(float a, float b, float c, float s) { return __builtin_fmaf(a, c, -(b * s)); }
inline float rope_hi(float a, float b, float c, float s) { return __builtin_fmaf(b, c, a * s); }

inline void write_rows(const AttentionPass& p) {
  const int64_t d = p.head_dim, half = d / 2, width = (p.heads + 2 * p.kv_heads) * d;
  for (int64_t s = 0; s < p.rows; ++s) {
    const int64_t pos = p.pos[s];
    const float* c = p.cos + pos * half;
    const float* sn = p.sin + pos * half;
    for (int64_t g = 0; g < p.kv_heads; ++g) {
      const float* k = p.qkv + s * width + (p.heads + g) * d;
      const float* v = p.qkv + s * width + (p.heads + p.kv_heads + g) * d;
      uint16_t* kb = p.keys + (g * (p.slots / kSlotBlock) + pos / kSlotBlock) * d * kSlotBlock + pos % kSlotBlock;
      for (int64_t i = 0; i < half; ++i) {
        kb[i * kSlotBlock] = half_of(rope_lo(k[i], k[i + half], c[i], sn[i]));
        kb[(i + half) * kSlotBlock] = half_of(rope_hi(k[i], k[i + half], c[i], sn[i]));
      }
      uint16_t* vb = p.values + (g * p.slots + pos) * d;
      for (int64_t i = 0; i < d; ++i) vb[i] = half_of(v[i]);
    }
  }
}

inline void prepare_rows(const AttentionPass& p, int64_t kv, float* q, int64_t* limit, int64_t* start) {
  const int64_t d = p.head_dim, half = d / 2, width = (p.heads + 2 * p.kv_heads) * d, group = p.heads / p.kv_heads;
  for (int64_t r = 0; r < p.rows * group; ++r) {
    const int64_t row = r / group, head = kv * group + r % group, pos = p.pos[row];
    const float* x = p.qkv + row * width + head * d;
    const float* c = p.cos + pos * half;
    const float* sn = p.sin + pos * half;
    float* out = q + r * d;
    for (int64_t i = 0; i < half; ++i) {
      out[i] = rope_lo(x[i], x[i + half], c[i], sn[i]) * p.scale;
      out[i + half] = rope_hi(x[i], x[i + half], c[i], sn[i]) * p.scale;
    }
    limit[r] = pos + 1;
    start[r] = window_start(p, pos);
  }
}

}  // namespace
}  // namespace specedge
