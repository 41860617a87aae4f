// A 4-bit block-quantized MatMul whose rows do not depend on each other: Y[M, N] = X[M, K] @ W[K, N].
//
// Weights (packed by the exporter, kernels/int4_layout.py): per panel of P output columns p and per 8
// consecutive k, 4P bytes; byte 4c+i holds W[k+i][Pp+c] in its low nibble and W[k+4+i][Pp+c] in its
// high nibble (codes 0..15). Per panel and block of `block` k: P float32 scales and P uint8 zero points.
// W[k][n] = scale * (code - zero point). P is 8 (layout 1: what the AVX2, ARM and portable paths read
// as one stream) or 32 (layout 2: the AVX-512 VNNI path's); the 8 columns Pp+8j.. of a panel (a group,
// what the AVX2, ARM and portable paths take at once) are bytes 32j..32j+31 of each 4P.
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

constexpr int64_t kGroup = 8;  // output columns per group

struct Int4Weights {
  const uint8_t* packed;     // [N/P][K/8][4P]
  const float* scales;       // [N/P][K/block][P]
  const uint8_t* zeros;      // [N/P][K/block][P]
  int64_t k, n, block;       // n: a multiple of P
  int64_t panel;             // P: 8 or 32
};

// Output columns per panel of a layout (1 or 2), 0 for a layout this library does not read.
inline int64_t panel_columns(int64_t layout) { return layout == 1 ? 8 : layout == 2 ? 32 : 0; }
inline int64_t groups_per_panel(const Int4Weights& w) { return w.panel / kGroup; }
// Bytes from one 8 k of a panel (or of a group in it) to the next.
inline int64_t chunk_stride(const Int4Weights& w) { return 4 * w.panel; }
// Group g (columns 8g..8g+7): its first 32 bytes (k 0..7); the next 8 k follow chunk_stride later.
inline const uint8_t* group_chunks(const Int4Weights& w, int64_t g) {
  const int64_t per = groups_per_panel(w);
  return w.packed + (g / per) * (w.k / 8) * chunk_stride(w) + (g % per) * 32;
}
// The index of group g's 8 scales (and zero points) of block b.
inline int64_t group_block(const Int4Weights& w, int64_t g, int64_t b) {
  const int64_t per = groups_per_panel(w);
  return ((g / per) * (w.k / w.block) + b) * w.panel + (g % per) * kGroup;
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

// Y[:, P*p0 : P*p1] for every row; y has row stride n.
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
inline void each_tile(const Int4Weights& w, int64_t p0, int64_t p1, int64_t m, Tile&& tile) {
  for (int64_t g = p0 * groups_per_panel(w); g < p1 * groups_per_panel(w); ++g) {
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
  int64_t panel;  // the panel width its fn reads (0: either)
};

// Instruction sets this CPU runs, the best first; the portable path is always last.
int available_isas(Isa* out, int capacity);
// The ISA named by `forced` (nullptr or "": the best this CPU runs) that reads panels of `panel` columns
// (0: any); nullptr if unknown, not runnable here or not reading them.
const Isa* pick_isa(const char* forced, int64_t panel = 0);

}  // namespace specedge
