// A 4-bit block-quantized MatMul whose rows do not depend on each other: Y[M, N] = X[M, K] @ W[K, N].
//
// Weights (packed by the exporter, kernels/int4_layout.py): per panel of 32 output columns p and per 8
// consecutive k, 128 bytes; byte 4c+i holds W[k+i][32p+c] in its low nibble and W[k+4+i][32p+c] in its
// high nibble (codes 0..15). Per panel and block of `block` k: 32 float32 scales and 32 uint8 zero
// points. W[k][n] = scale * (code - zero point). The 8 columns 32p+8j.. of a panel (a group: what the
// AVX2, ARM and portable paths take at once) are bytes 32j..32j+31 of each 128.
// Arithmetic, the same on every instruction set: each row of X is quantized per block to int8
// (scale = absmax / 127, codes = round-half-even(x * (127 / absmax)), 0 where absmax is 0); per row,
// column and block the integer sum d = sum(code * xq) - zero * sum(xq) is exact in int32; then
// acc = acc + float(d) * (scale * xscale), blocks in order from acc = 0, no fused multiply-add.
// (For finite inputs: a NaN or infinity in a row makes that row's output unspecified.)
// So a row's result depends only on that row and the weights, never on M, the row's position,
// the thread count or the instruction set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace specedge {

constexpr int64_t kPanel = 32;       // output columns per panel
constexpr int64_t kPanelBytes = 128;  // bytes of a panel per 8 k
constexpr int64_t kGroup = 8;         // output columns per group

struct Int4Weights {
  const uint8_t* packed;  // [N/32][K/8][128]
  const float* scales;    // [N/32][K/block][32]
  const uint8_t* zeros;   // [N/32][K/block][32]
  int64_t k, n, block;    // n: a multiple of 32
};

// Group g (columns 8g..8g+7): its first 32 bytes (k 0..7); the next 8 k follow kPanelBytes later.
inline const uint8_t* group_chunks(const Int4Weights& w, int64_t g) {
  return w.packed + (g / 4) * (w.k / 8) * kPanelBytes + (g % 4) * 32;
}
// The index of group g's 8 scales (and zero points) of block b.
inline int64_t group_block(const Int4Weights& w, int64_t g, int64_t b) {
  return ((g / 4) * (w.k / w.block) + b) * kPanel + (g % 4) * kGroup;
}

struct QuantizedRows {
  const int8_t* q;      // [M][K]
  const float* scale;   // [M][K/block]
  const int32_t* sum;   // [M][K/block]
  int64_t m;
};

// Quantize rows of x [M][K] per block into q, scale and sum (sizes as in QuantizedRows): the portable
// path; every ISA's quantizer gives the same bytes (IEEE abs, max, division, product, round half to even).
void quantize_rows(const float* x, int64_t m, int64_t k, int64_t block, int8_t* q, float* scale, int32_t* sum);
using QuantizeFn = void (*)(const float* x, int64_t m, int64_t k, int64_t block, int8_t* q, float* scale,
                            int32_t* sum);
#if defined(__x86_64__) || defined(_M_X64)
void quantize_rows_avx2(const float* x, int64_t m, int64_t k, int64_t block, int8_t* q, float* scale, int32_t* sum);
#endif

// Y[:, 32*p0 : 32*p1] for every row; y has row stride n.
using PanelsFn = void (*)(const Int4Weights& w, const QuantizedRows& x, int64_t p0, int64_t p1, float* y);

void panels_portable(const Int4Weights& w, const QuantizedRows& x, int64_t p0, int64_t p1, float* y);
#if defined(__x86_64__) || defined(_M_X64)
void panels_avx2(const Int4Weights& w, const QuantizedRows& x, int64_t p0, int64_t p1, float* y);
void panels_avx512_vnni(const Int4Weights& w, const QuantizedRows& x, int64_t p0, int64_t p1, float* y);
#endif
#if defined(__aarch64__)
void panels_neon_dot(const Int4Weights& w, const QuantizedRows& x, int64_t p0, int64_t p1, float* y);
#endif

// Calls tile(std::integral_constant<int, R>{}, g, r0) for each group g of panels [p0, p1) and the row
// tiles of m rows: tiles of 6, then one of the 1..5 left (the AVX2 and ARM paths' register tiles; their
// unpacked chunk is reused across a tile's rows; the AVX-512 path tiles rows its own way).
template <class Tile>
inline void each_tile(int64_t p0, int64_t p1, int64_t m, Tile&& tile) {
  for (int64_t g = 4 * p0; g < 4 * p1; ++g) {
    int64_t r = 0;
    for (; r + 6 <= m; r += 6) tile(std::integral_constant<int, 6>{}, g, r);
    switch (m - r) {
      case 5: tile(std::integral_constant<int, 5>{}, g, r); break;
      case 4: tile(std::integral_constant<int, 4>{}, g, r); break;
      case 3: tile(std::integral_constant<int, 3>{}, g, r); break;
      case 2: tile(std::integral_constant<int, 2>{}, g, r); break;
      case 1: tile(std::integral_constant<int, 1>{}, g, r); break;
      default: break;
    }
  }
}

struct Isa {
  const char* name;
  PanelsFn fn;
  QuantizeFn quantize;
};

// Instruction sets this CPU runs, the best first; the portable path is always last.
int available_isas(Isa* out, int capacity);
// The ISA named by `forced` (nullptr or "": the best this CPU runs); nullptr if unknown or not runnable here.
const Isa* pick_isa(const char* forced);

}  // namespace specedge
