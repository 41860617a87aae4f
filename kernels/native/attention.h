// Causal attention over a float16 KV cache whose rows do not depend on each other: what
// ai.specedge::AttentionRows computes for each layer of a model exported with `--attention rows`.
//
// Layout. keys: float16 [KV][T/16][d][16] (slots in blocks of 16, a block's 16 slots side by side for
// each of the d dimensions); values: float16 [KV][T][d]; T is a multiple of 16. qkv: float32 [S][(H +
// 2 KV) d] (q of each head, then k, then v of each KV head); pos: the position of each row; cos, sin:
// float32 [C][d/2]. out: float32 [S][H d]. Head h reads KV head h / (H / KV).
//
// Arithmetic (fma: one rounding; every other operation rounds once; no other fused operation), the
// same on every instruction set:
//  rope of x at position p, i < d/2, c = cos[p][i], s = sin[p][i]:
//    x'[i] = fma(x[i], c, -(x[i + d/2] * s)),  x'[i + d/2] = fma(x[i + d/2], c, x[i] * s)
//  write: every row's k' and v of every KV head to slot pos[s], rounded to float16 (nearest, ties to
//    even), before any row is read;
//  per row s (p = pos[s]) and head h: q'[i] = rope(q)[i] * scale;
//    score[j] = fma(q'[d-1], k_j[d-1], ... fma(q'[1], k_j[1], fma(q'[0], k_j[0], 0))) for j = 0..p;
//    m = max score; e[j] = x < -40 ? 0 : exp(x), x = score[j] - m, exp as `exp_rows` below;
//    sum: lane l = 0..15 adds e[j], j = l mod 16, in order of j from 0; then lanes l + w into l for
//    w = 8, 4, 2, 1; sum is lane 0;
//    out[i] = fma(e[p], v_p[i], ... fma(e[1], v_1[i], fma(e[0], v_0[i], 0))) / sum.
// A window (a session's choice, for a draft model: ort_attention.cc) narrows what a row sees: with
// `window` W > 0 and `sink` K (both multiples of 16), the row at p sees slot j <= p only if j < K or
// j >= s = 16 floor(max(0, p + 1 - W) / 16) (whole blocks: its last W to W + 15 positions); the slots
// [K, s) it does not see are left out of m and have e[j] = 0 (so the sums and fma chains above are
// what they would be with those terms 0: fma(0, v, a) = a). W = 0: every slot, as above.
// So a row's result depends only on that row, its position and the cache slots before it: never on
// how many rows share the pass, the thread count or the instruction set.
#pragma once

#include <cstdint>

namespace specedge {

constexpr int64_t kSlotBlock = 16;  // slots per block of the key layout
constexpr float kExpFloor = -40.0f;  // e^-40 = 4e-18: below a float's resolution next to the largest term, 1

struct AttentionPass {
  const float* qkv;     // [S][(H + 2 KV) d]
  const int64_t* pos;   // [S]
  const float* cos;     // [C][d/2]
  const float* sin;     // [C][d/2]
  uint16_t* keys;       // float16 bits [KV][T/16][d][16]
  uint16_t* values;     // float16 bits [KV][T][d]
  float* out;           // [S][H d]
  int64_t rows, heads, kv_heads, head_dim, slots;
  float scale;
  int64_t stride;       // floats a query's scores take in the scratch: its slots read, whole blocks (<= slots)
  int64_t sink = 0;     // the window (above): slots every row sees, a multiple of 16
  int64_t window = 0;   // the last positions a row sees besides the sink, a multiple of 16 (0: all)
};

// The slots [sink, start) the row at `pos` does not see (start: the first slot of its window; no
// such slots when start <= sink: returns sink, an empty span).
inline int64_t window_start(const AttentionPass& p, int64_t pos) {
  if (p.window <= 0) return p.sink;
  const int64_t first = pos + 1 - p.window;
  const int64_t start = first > 0 ? first / kSlotBlock * kSlotBlock : 0;
  return start > p.sink ? start : p.sink;
}

// Float32 <-> float16 bits, round to nearest even (the portable conversions every path matches).
uint16_t half_of(float x);
float float_of(uint16_t h);

// Rope each row's k and store it and v (float16) at the row's slot: before any head is computed (the
// portable path's; each path has its own build of it, AttentionIsa::write).
void attention_write(const AttentionPass& p);

// One KV head's queries in a pass: the G heads that read it, of every row (query r: row r / G, head
// g G + r % G), roped and scaled ([R][d]), how many slots each reads (its row's position + 1: never
// fewer than the query before it), where each one's window starts (window_start), and the slots
// [gap0, gap1) none of them sees (empty without a window), which no step reads.
struct Queries {
  int64_t kv;           // the KV head
  const float* q;       // [R][d]
  const int64_t* limit; // [R]
  int64_t count;        // R
  const int64_t* start; // [R]
  int64_t gap0 = 0, gap1 = 0;
};
// q' of every query of KV head `kv` into q (the scalar rope of attention.h), limits into limit,
// window starts into start (the portable path's; AttentionIsa::prepare is each path's own).
void prepare_queries(const AttentionPass& p, int64_t kv, float* q, int64_t* limit, int64_t* start);
// The slots no query of a pass sees: [sink, the least window start) (gap0 == gap1: none).
void common_gap(const AttentionPass& p, const int64_t* start, int64_t count, int64_t* gap0, int64_t* gap1);

// A pass runs in three steps, each split into tasks that write disjoint outputs (so neither the
// thread count nor the split changes a bit):
//  scores of slot blocks [b0, b1) for every query: scores[r][j] (T floats a query; slots past a
//    query's limit are computed but never read);
//  per query: e[j] in place of its scores, j < limit outside [skip0, skip1) (its unseen slots, left
//    as they are), and the lane sum of them (returned);
//  out rows of queries [r0, r1) for dimensions [i0, i1) (the path's `queries` and `dims` a task),
//    over slots [0, limit) outside [q.gap0, q.gap1).
using ScoresFn = void (*)(const AttentionPass& p, const Queries& q, int64_t b0, int64_t b1, float* scores);
using SoftmaxFn = float (*)(float* scores, int64_t n, int64_t skip0, int64_t skip1);
using WeighFn = void (*)(const AttentionPass& p, const Queries& q, const float* e, const float* sums, int64_t r0,
                         int64_t r1, int64_t i0, int64_t i1);

using WriteFn = void (*)(const AttentionPass& p);
using PrepareFn = void (*)(const AttentionPass& p, int64_t kv, float* q, int64_t* limit, int64_t* start);

struct AttentionIsa {
  const char* name;
  ScoresFn scores;
  SoftmaxFn softmax;
  WeighFn weigh;
  int64_t dims;     // the dimensions a weigh task takes (0: the whole head)
  int64_t queries;  // the queries a weigh task takes (0: all of a KV head's)
  WriteFn write;      // attention_write, compiled for the path's instruction set (attention_rope.h)
  PrepareFn prepare;  // prepare_queries, likewise
};

// Query r's softmax as the pass computes it: the path's over the slots it sees, then e = 0 on the
// slots [gap1, start[r]) it does not see but the weigh step reads; returns the sum.
float query_softmax(const AttentionIsa& isa, const AttentionPass& p, const Queries& q, int64_t r, float* e);

// A weigh task's span of `n` (dimensions or queries) when the path takes `step` at once (0: all).
inline int64_t task_span(int64_t step, int64_t n) { return step > 0 && step < n ? step : n; }

// The instruction sets this CPU runs the attention on, best first, into out; returns how many.
int available_attention_isas(AttentionIsa* out, int capacity);
// The first of them (or the one `forced` names; nullptr if it names none this CPU runs).
const AttentionIsa* pick_attention_isa(const char* forced);

#if defined(__x86_64__) || defined(_M_X64)
AttentionIsa avx512_attention();
AttentionIsa avx2_attention();
#endif

// One row's one head, straight from the arithmetic above: the reference the paths are tested
// against (kernel_test.cc); scratch holds at least T floats.
void head_reference(const AttentionPass& p, int64_t row, int64_t head, float* scratch);

// exp(x) for x in [-40, 0] as every path computes it (x < -40 is 0 before this is called).
float exp_rows(float x);

// Where query r of KV head kv writes its d outputs.
inline float* query_out(const AttentionPass& p, int64_t kv, int64_t r) {
  const int64_t group = p.heads / p.kv_heads;
  return p.out + (r / group) * p.heads * p.head_dim + (kv * group + r % group) * p.head_dim;
}

}  // namespace specedge
