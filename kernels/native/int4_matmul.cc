// Activation quantization, the portable path, and the choice of instruction set by CPUID.
#include "int4_matmul.h"

#include <cmath>
#include <cstring>

#include "cpu_features.h"

namespace specedge {

void quantize_rows(const float* x, int64_t m, int64_t k, int64_t block, int8_t* q, float* scale, int32_t* sum) {
  const int64_t blocks = k / block;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + r * k + b * block;
      int8_t* qb = q + r * k + b * block;
      float amax = 0.0f;
      for (int64_t i = 0; i < block; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t s = 0;
      for (int64_t i = 0; i < block; ++i) {
        float v = xb[i] * inv;
        v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
        if (v != v) v = 0.0f;  // NaN input
        // round half to even without a libm call: adding and taking away 1.5 * 2^23 leaves the nearest
        // integer for |v| < 2^22 in round-to-nearest-even mode (the default); the clamp keeps |v| <= 127
        const volatile float magic = 12582912.0f;
        v = (v + magic) - magic;
        qb[i] = static_cast<int8_t>(v);
        s += qb[i];
      }
      scale[r * blocks + b] = amax / 127.0f;
      sum[r * blocks + b] = s;
    }
  }
}

void panels_portable(const Int4Weights& w, const QuantizedRows& x, int64_t p0, int64_t p1, float* y) {
  const int64_t k = w.k, blocks = k / w.block;
  for (int64_t g = p0 * groups_per_panel(w); g < p1 * groups_per_panel(w); ++g) {
    const uint8_t* pg = group_chunks(w, g);
    for (int64_t r = 0; r < x.m; ++r) {
      const int8_t* xr = x.q + r * k;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t d[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t kk = b * w.block; kk < (b + 1) * w.block; kk += 8) {
          const uint8_t* p = pg + (kk / 8) * chunk_stride(w);
          for (int c = 0; c < 8; ++c) {
            for (int i = 0; i < 4; ++i) {
              d[c] += (p[4 * c + i] & 0x0F) * xr[kk + i] + (p[4 * c + i] >> 4) * xr[kk + 4 + i];
            }
          }
        }
        const float* sc = w.scales + group_block(w, g, b);
        const uint8_t* zp = w.zeros + group_block(w, g, b);
        const float xs = x.scale[r * blocks + b];
        const int32_t xsum = x.sum[r * blocks + b];
        for (int c = 0; c < 8; ++c) {
          const float t = static_cast<float>(d[c] - static_cast<int32_t>(zp[c]) * xsum);
          const float s = sc[c] * xs;
          acc[c] = acc[c] + t * s;
        }
      }
      std::memcpy(y + r * w.n + g * 8, acc, sizeof acc);
    }
  }
}

int available_isas(Isa* out, int capacity) {
  int n = 0;
  auto add = [&](const char* name, PanelsFn fn, QuantizeFn quantize, int64_t panel) {
    if (n < capacity) out[n++] = Isa{name, fn, quantize, panel};
  };
  const CpuFeatures& cpu = cpu_features();
#if defined(__x86_64__) || defined(_M_X64)
  if (cpu.avx2 && cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512_vnni) {
    add("avx512-vnni", panels_avx512_vnni, quantize_rows_avx2, 32);
  }
  if (cpu.avx2) add("avx2", panels_avx2, quantize_rows_avx2, 0);
#endif
#if defined(__aarch64__)
  if (cpu.asimddp) add("neon-dot", panels_neon_dot, quantize_rows, 0);
#endif
  add("portable", panels_portable, quantize_rows, 0);
  return n;
}

const Isa* pick_isa(const char* forced, int64_t panel) {
  static Isa isas[4];
  static int count = available_isas(isas, 4);
  for (int i = 0; i < count; ++i) {
    const bool named = forced == nullptr || forced[0] == '\0' || std::strcmp(isas[i].name, forced) == 0;
    if (named && (panel == 0 || isas[i].panel == 0 || isas[i].panel == panel)) return &isas[i];
  }
  return nullptr;
}

}  // namespace specedge
