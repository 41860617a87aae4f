// The attention's float16 conversions, its write phase, the portable path, and the choice of
// instruction set by CPUID (the arithmetic is told in attention.h).
#include "attention.h"
#include "attention_rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu_features.h"

namespace specedge {

uint16_t half_of(float x) {
  uint32_t f;
  std::memcpy(&f, &x, 4);
  const uint32_t sign = (f >> 16) & 0x8000u;
  f &= 0x7FFFFFFFu;
  if (f >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u | (f > 0x7F800000u ? 0x200u : 0u));
  if (f >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to 65536 or more: infinity
  if (f < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), rounded to nearest even
    if (f < 0x33000000u) return static_cast<uint16_t>(sign);  // at most 2^-25: zero
    const uint32_t exponent = f >> 23, mantissa = (f & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // 14..24: mantissa * 2^(exponent-150) in units of 2^-24
    const uint32_t kept = mantissa >> shift, rest = mantissa & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    const uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | rounded);
  }
  const uint32_t rebased = f - 0x38000000u;  // exponent 127 -> 15, mantissa 23 bits
  const uint32_t kept = rebased >> 13, rest = rebased & 0x1FFFu;
  const uint32_t rounded = kept + ((rest > 0x1000u || (rest == 0x1000u && (kept & 1u))) ? 1u : 0u);
  return static_cast<uint16_t>(sign | rounded);
}

float float_of(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu, f;
  if (exponent == 0x1Fu) {
    f = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    f = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    f = sign;
  } else {  // subnormal half: normalize
    int e = -1;
    do {
      mantissa <<= 1;
      ++e;
    } while (!(mantissa & 0x400u));
    f = sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float x;
  std::memcpy(&x, &f, 4);
  return x;
}

float exp_rows(float x) {
  const float t = x * 1.44269504f;
  const float n = std::nearbyint(t);  // ties to even, the default rounding
  float r = __builtin_fmaf(n, -0.693359375f, x);
  r = __builtin_fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = __builtin_fmaf(p, r, 1.3981999507e-3f);
  p = __builtin_fmaf(p, r, 8.3334519073e-3f);
  p = __builtin_fmaf(p, r, 4.1665795894e-2f);
  p = __builtin_fmaf(p, r, 1.6666665459e-1f);
  p = __builtin_fmaf(p, r, 5.0000001201e-1f);
  const float r2 = r * r;
  float y = __builtin_fmaf(p, r2, r);
  y = y + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-58, 0]
  float scale;
  std::memcpy(&scale, &bits, 4);
  return y * scale;
}

void attention_write(const AttentionPass& p) { write_rows(p); }

void prepare_queries(const AttentionPass& p, int64_t kv, float* q, int64_t* limit, int64_t* start) {
  prepare_rows(p, kv, q, limit, start);
}

void common_gap(const AttentionPass& p, const int64_t* start, int64_t count, int64_t* gap0, int64_t* gap1) {
  int64_t least = count > 0 ? start[0] : p.sink;
  for (int64_t r = 1; r < count; ++r) least = std::min(least, start[r]);
  *gap0 = p.sink;
  *gap1 = least;  // window_start is never below the sink
}

float query_softmax(const AttentionIsa& isa, const AttentionPass& p, const Queries& q, int64_t r, float* e) {
  const float sum = isa.softmax(e, q.limit[r], p.sink, q.start[r]);
  for (int64_t j = q.gap1; j < q.start[r]; ++j) e[j] = 0.0f;  // unseen, though the weigh step reads them
  return sum;
}

// The probabilities of a row's n scores outside [skip0, skip1), unnormalized and in place (exp(x -
// max), exp below the floor 0); their sum, added in kSlotBlock lanes folded in halves, as every path
// adds it.
static float softmax_portable(float* e, int64_t n, int64_t skip0, int64_t skip1) {
  const auto seen = [&](int64_t j) { return j < skip0 || j >= skip1; };
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    if (seen(j)) m = std::fmax(m, e[j]);
  }
  float lanes[kSlotBlock] = {};
  for (int64_t j = 0; j < n; ++j) {
    if (!seen(j)) continue;
    const float x = e[j] - m;
    e[j] = x < kExpFloor ? 0.0f : exp_rows(x);
    lanes[j % kSlotBlock] = lanes[j % kSlotBlock] + e[j];
  }
  for (int64_t w = kSlotBlock / 2; w >= 1; w /= 2) {
    for (int64_t l = 0; l < w; ++l) lanes[l] = lanes[l] + lanes[l + w];
  }
  return lanes[0];
}

void head_reference(const AttentionPass& p, int64_t row, int64_t head, float* scratch) {
  const int64_t d = p.head_dim, half = d / 2, width = (p.heads + 2 * p.kv_heads) * d;
  const int64_t pos = p.pos[row], g = head / (p.heads / p.kv_heads), n = pos + 1;
  const float* q = p.qkv + row * width + head * d;
  const float* c = p.cos + pos * half;
  const float* sn = p.sin + pos * half;
  float qs[512];
  for (int64_t i = 0; i < half; ++i) {
    qs[i] = rope_lo(q[i], q[i + half], c[i], sn[i]) * p.scale;
    qs[i + half] = rope_hi(q[i], q[i + half], c[i], sn[i]) * p.scale;
  }
  const int64_t start = window_start(p, pos);  // slots [sink, start) unseen: e = 0
  const uint16_t* keys = p.keys + g * (p.slots / kSlotBlock) * d * kSlotBlock;
  for (int64_t j = 0; j < n; ++j) {
    if (j >= p.sink && j < start) {
      scratch[j] = 0.0f;
      continue;
    }
    const uint16_t* kj = keys + (j / kSlotBlock) * d * kSlotBlock + j % kSlotBlock;
    float acc = 0.0f;
    for (int64_t i = 0; i < d; ++i) acc = __builtin_fmaf(qs[i], float_of(kj[i * kSlotBlock]), acc);
    scratch[j] = acc;
  }
  const float sum = softmax_portable(scratch, n, p.sink, start);
  const uint16_t* values = p.values + g * p.slots * d;
  float* out = p.out + row * p.heads * d + head * d;
  for (int64_t i = 0; i < d; ++i) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc = __builtin_fmaf(scratch[j], float_of(values[j * d + i]), acc);
    out[i] = acc / sum;
  }
}

namespace {

void scores_portable(const AttentionPass& p, const Queries& q, int64_t b0, int64_t b1, float* scores) {
  const int64_t d = p.head_dim;
  const uint16_t* keys = p.keys + q.kv * (p.slots / kSlotBlock) * d * kSlotBlock;
  for (int64_t r = 0; r < q.count; ++r) {
    for (int64_t j = b0 * kSlotBlock; j < b1 * kSlotBlock; ++j) {
      const uint16_t* kj = keys + (j / kSlotBlock) * d * kSlotBlock + j % kSlotBlock;
      float acc = 0.0f;
      for (int64_t i = 0; i < d; ++i) acc = __builtin_fmaf(q.q[r * d + i], float_of(kj[i * kSlotBlock]), acc);
      scores[r * p.stride + j] = acc;
    }
  }
}

void weigh_portable(const AttentionPass& p, const Queries& q, const float* e, const float* sums, int64_t r0,
                    int64_t r1, int64_t i0, int64_t i1) {
  const int64_t d = p.head_dim;
  const uint16_t* values = p.values + q.kv * p.slots * d;
  for (int64_t r = r0; r < r1; ++r) {
    float* out = query_out(p, q.kv, r);
    for (int64_t i = i0; i < i1; ++i) {
      float acc = 0.0f;
      for (int64_t j = 0; j < q.limit[r]; ++j) {
        if (j == q.gap0 && q.gap1 > q.gap0) j = q.gap1;
        if (j >= q.limit[r]) break;
        acc = __builtin_fmaf(e[r * p.stride + j], float_of(values[j * d + i]), acc);
      }
      out[i] = acc / sums[r];
    }
  }
}

}  // namespace

int available_attention_isas(AttentionIsa* out, int capacity) {
  int n = 0;
  auto add = [&](const AttentionIsa& isa) {
    if (n < capacity) out[n++] = isa;
  };
#if defined(__x86_64__) || defined(_M_X64)
  const CpuFeatures& cpu = cpu_features();
  if (cpu.avx2 && cpu.fma && cpu.avx512f) add(avx512_attention());
  if (cpu.avx2 && cpu.fma) add(avx2_attention());
#endif
  add(AttentionIsa{"portable", scores_portable, softmax_portable, weigh_portable, 16, 0, attention_write,
                    prepare_queries});
  return n;
}

const AttentionIsa* pick_attention_isa(const char* forced) {
  static AttentionIsa isas[3];
  static int count = available_attention_isas(isas, 3);
  for (int i = 0; i < count; ++i) {
    if (forced == nullptr || forced[0] == '\0' || std::strcmp(isas[i].name, forced) == 0) return &isas[i];
  }
  return nullptr;
}

}  // namespace specedge
