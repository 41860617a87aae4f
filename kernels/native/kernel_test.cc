// The kernels alone, without ONNX Runtime: every instruction set this CPU runs gives bit for bit what
// the portable path gives, and the portable path gives what the formula in int4_matmul.h gives,
// written here once more as plainly as it reads; each row alone equals that row among others. The
// attention (attention.h) likewise: every instruction set's three steps, split into tasks in more
// than one way, give the reference's bits (one row and head at a time, as the header says), and a
// pass of several rows equals one-row passes in turn (its numpy model is tests/kernels' reference). For
// sanitizer builds (-fsanitize=address,undefined) and for ARM under qemu-user, where the Python
// tests cannot run. Exit code 0 and "N passed, 0 failed" when every case agrees.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "attention.h"
#include "cpu_features.h"
#include "exp_sum.h"
#include "int4_matmul.h"
#include "swiglu.h"

using namespace specedge;

namespace {

struct Case {
  int64_t k, n, block, m, panel;  // panel: 8 (layout 1) or 32 (layout 2)
};

// The formula, straight from the header's comment.
std::vector<float> formula(const std::vector<float>& x, const std::vector<uint8_t>& codes /* [N][K] */,
                           const std::vector<float>& scales /* [N][blocks] */,
                           const std::vector<uint8_t>& zeros /* [N][blocks] */, const Case& c) {
  const int64_t blocks = c.k / c.block;
  std::vector<float> y(c.m * c.n);
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t col = 0; col < c.n; ++col) {
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const float* xb = &x[r * c.k + b * c.block];
        float amax = 0.0f;
        for (int64_t i = 0; i < c.block; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t d = 0;
        for (int64_t i = 0; i < c.block; ++i) {
          float v = std::nearbyint(xb[i] * inv);
          v = std::fmin(127.0f, std::fmax(-127.0f, v));
          d += (static_cast<int32_t>(codes[col * c.k + b * c.block + i]) - zeros[col * blocks + b]) *
               static_cast<int32_t>(v);
        }
        acc = acc + static_cast<float>(d) * (scales[col * blocks + b] * (amax / 127.0f));
      }
      y[r * c.n + col] = acc;
    }
  }
  return y;
}

bool run_case(const Case& c, std::mt19937& rng, const Isa* isas, int count) {
  const int64_t blocks = c.k / c.block;
  std::vector<uint8_t> codes(c.n * c.k), zeros(c.n * blocks), packed(c.n * c.k / 2);
  std::vector<float> scales(c.n * blocks), x(c.m * c.k);
  for (auto& v : codes) v = rng() & 15;
  for (auto& v : zeros) v = rng() & 15;
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (auto& v : scales) v = 0.001f + 0.02f * std::fabs(unit(rng));
  for (auto& v : x) v = unit(rng) * (1 + (rng() % 4 == 0 ? 40.0f : 0.0f));
  for (int64_t b = 0; b < blocks && c.m > 0; b += 3) std::memset(&x[b * c.block], 0, c.block * sizeof(float));
  // the layout: [N/P][K/8][4P], byte 4c+i = W[k+i][Pp+c] | W[k+4+i][Pp+c] << 4
  const int64_t P = c.panel;
  std::vector<float> pscales(c.n * blocks);
  std::vector<uint8_t> pzeros(c.n * blocks);
  for (int64_t p = 0; p < c.n / P; ++p) {
    for (int64_t k8 = 0; k8 < c.k / 8; ++k8) {
      for (int col = 0; col < P; ++col) {
        for (int i = 0; i < 4; ++i) {
          const int64_t n = P * p + col;
          packed[(p * (c.k / 8) + k8) * 4 * P + 4 * col + i] =
              static_cast<uint8_t>(codes[n * c.k + 8 * k8 + i] | (codes[n * c.k + 8 * k8 + 4 + i] << 4));
        }
      }
    }
    for (int64_t b = 0; b < blocks; ++b) {
      for (int col = 0; col < P; ++col) {
        pscales[(p * blocks + b) * P + col] = scales[(P * p + col) * blocks + b];
        pzeros[(p * blocks + b) * P + col] = zeros[(P * p + col) * blocks + b];
      }
    }
  }
  const Int4Weights w{packed.data(), pscales.data(), pzeros.data(), c.k, c.n, c.block, P};
  std::vector<int8_t> q(c.m * c.k);
  std::vector<float> xs(c.m * blocks);
  std::vector<int32_t> xsum(c.m * blocks);
  auto rows_from = [&](int64_t r, int64_t m) {  // rows [r, r + m)
    return QuantizedRows{q.data() + r * c.k, xs.data() + r * blocks, xsum.data() + r * blocks, m};
  };
  const int64_t panels = c.n / P;
  const std::vector<float> want = formula(x, codes, scales, zeros, c);
  bool ok = true;
  for (int i = 0; i < count; ++i) {
    if (isas[i].panel != 0 && isas[i].panel != P) continue;  // reads the other layout
    isas[i].quantize(x.data(), c.m, c.k, c.block, q.data(), xs.data(), xsum.data());
    std::vector<float> y(c.m * c.n, NAN);
    isas[i].fn(w, rows_from(0, c.m), 0, panels, y.data());
    if (std::memcmp(y.data(), want.data(), y.size() * sizeof(float)) != 0) {
      std::printf("FAILED %s K=%lld N=%lld block=%lld M=%lld panel=%lld: not the formula's bits\n", isas[i].name,
                  (long long)c.k, (long long)c.n, (long long)c.block, (long long)c.m, (long long)P);
      ok = false;
    }
    for (int64_t r = 0; r < c.m; r += 5) {  // a row alone, split over two calls of panels
      std::vector<float> one(c.n, NAN);
      isas[i].fn(w, rows_from(r, 1), 0, panels / 2, one.data());
      isas[i].fn(w, rows_from(r, 1), panels / 2, panels, one.data());
      if (std::memcmp(one.data(), &want[r * c.n], c.n * sizeof(float)) != 0) {
        std::printf("FAILED %s K=%lld N=%lld block=%lld M=%lld panel=%lld: row %lld alone differs\n", isas[i].name,
                    (long long)c.k, (long long)c.n, (long long)c.block, (long long)c.m, (long long)P, (long long)r);
        ok = false;
      }
    }
  }
  return ok;
}

struct AttentionCase {
  int64_t heads, kv_heads, d, slots, cached, rows;
  int64_t sink = 0, window = 0;  // a window (attention.h): 0 sees every slot
};

// Runs a pass of rows [r0, r1) of the case over the caches: with `isa`'s three steps (scores in
// tasks of `blocks` slot blocks, output dimensions in tasks of the path's), or with the reference
// one row and head at a time (isa null).
std::vector<float> attention_pass(const AttentionCase& c, const std::vector<float>& qkv, const std::vector<float>& cos,
                                  const std::vector<float>& sin, std::vector<uint16_t>& keys,
                                  std::vector<uint16_t>& values, int64_t r0, int64_t r1, const AttentionIsa* isa,
                                  int64_t blocks_per_task = 3) {
  const int64_t width = (c.heads + 2 * c.kv_heads) * c.d;
  std::vector<int64_t> pos;
  for (int64_t r = r0; r < r1; ++r) pos.push_back(c.cached + r);
  std::vector<float> out((r1 - r0) * c.heads * c.d, NAN);
  const int64_t stride = (pos.back() + kSlotBlock) / kSlotBlock * kSlotBlock;  // the slots read, whole blocks
  const AttentionPass p{qkv.data() + r0 * width, pos.data(), cos.data(), sin.data(), keys.data(), values.data(),
                        out.data(), r1 - r0, c.heads, c.kv_heads, c.d, c.slots, 0.125f, stride, c.sink, c.window};
  if (isa == nullptr) {
    attention_write(p);
    std::vector<float> scratch(c.slots);
    for (int64_t r = 0; r < p.rows; ++r) {
      for (int64_t h = 0; h < c.heads; ++h) head_reference(p, r, h, scratch.data());
    }
    return out;
  }
  isa->write(p);
  const int64_t queries = p.rows * (c.heads / c.kv_heads), blocks = (pos.back() + kSlotBlock) / kSlotBlock;
  for (int64_t g = 0; g < c.kv_heads; ++g) {
    std::vector<float> q(queries * c.d), scores(queries * stride, NAN), sums(queries);
    std::vector<int64_t> limit(queries), start(queries);
    isa->prepare(p, g, q.data(), limit.data(), start.data());
    Queries qs{g, q.data(), limit.data(), queries, start.data()};
    common_gap(p, start.data(), queries, &qs.gap0, &qs.gap1);
    const int64_t spans[2][2] = {{0, std::min(blocks, qs.gap0 / kSlotBlock)}, {qs.gap1 / kSlotBlock, blocks}};
    for (const auto& span : spans) {  // the blocks no query sees are left NaN: never read
      for (int64_t b = span[0]; b < span[1]; b += blocks_per_task) {
        isa->scores(p, qs, b, std::min(span[1], b + blocks_per_task), scores.data());
      }
    }
    for (int64_t r = 0; r < queries; ++r) sums[r] = query_softmax(*isa, p, qs, r, scores.data() + r * stride);
    const int64_t dims = task_span(isa->dims, c.d), span = task_span(isa->queries, queries);
    for (int64_t r = 0; r < queries; r += span) {
      for (int64_t i = 0; i < c.d; i += dims) {
        isa->weigh(p, qs, scores.data(), sums.data(), r, std::min(queries, r + span), i, std::min(c.d, i + dims));
      }
    }
  }
  return out;
}

bool run_attention_case(const AttentionCase& c, std::mt19937& rng, const AttentionIsa* isas, int count) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(c.rows * (c.heads + 2 * c.kv_heads) * c.d), cos(c.slots * c.d / 2), sin(cos.size());
  for (auto& v : qkv) v = 2.0f * normal(rng);
  for (size_t i = 0; i < cos.size(); ++i) {
    const double angle = static_cast<double>(i / (c.d / 2)) / std::pow(10000.0, 2.0 * (i % (c.d / 2)) / c.d);
    cos[i] = static_cast<float>(std::cos(angle));
    sin[i] = static_cast<float>(std::sin(angle));
  }
  std::vector<uint16_t> keys(c.kv_heads * c.slots * c.d), values(keys.size());
  for (auto& v : keys) v = half_of(normal(rng));
  for (auto& v : values) v = half_of(normal(rng));
  auto k0 = keys, v0 = values;
  const std::vector<float> want = attention_pass(c, qkv, cos, sin, k0, v0, 0, c.rows, nullptr);
  bool ok = true;
  for (int i = 0; i < count; ++i) {
    auto k = keys, v = values;
    const auto got = attention_pass(c, qkv, cos, sin, k, v, 0, c.rows, &isas[i], 1 + i);
    auto k1 = keys, v1 = values;
    std::vector<float> alone;
    for (int64_t r = 0; r < c.rows; ++r) {  // one row a pass, in turn
      const auto one = attention_pass(c, qkv, cos, sin, k1, v1, r, r + 1, &isas[i], 8);
      alone.insert(alone.end(), one.begin(), one.end());
    }
    if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0 || k != k0 || v != v0 ||
        std::memcmp(alone.data(), want.data(), alone.size() * sizeof(float)) != 0) {
      std::printf("FAILED attention %s H=%lld KV=%lld d=%lld T=%lld L=%lld S=%lld: not the reference's bits\n",
                  isas[i].name, (long long)c.heads, (long long)c.kv_heads, (long long)c.d, (long long)c.slots,
                  (long long)c.cached, (long long)c.rows);
      ok = false;
    }
  }
  return ok;
}

// Every path's tail sum equals the portable path's bits (the last: the reference), over rows of every
// length to two blocks of lanes, with masked (-inf) and NaN ids, and cuts at several heights.
bool run_exp_sum_cases(std::mt19937& rng, const ExpSumIsa* isas, int count) {
  std::normal_distribution<float> normal(0.0f, 4.0f);
  bool ok = true;
  for (int64_t n = 0; n < 40; ++n) {
    std::vector<float> z(n);
    for (auto& v : z) v = normal(rng);
    if (n > 20) z[3] = -INFINITY, z[11] = NAN;
    float top = n ? -INFINITY : 0.0f;
    for (const float v : z) top = std::fmax(top, v);  // fmax passes NaN over
    for (const float below : {INFINITY, top - 8.4f, top - 1.0f}) {
      for (const float scale : {1.0f, 1.0f / 0.7f}) {
        const double want = isas[count - 1].sum(z.data(), n, top, scale, below);
        for (int i = 0; i < count - 1; ++i) {
          const double got = isas[i].sum(z.data(), n, top, scale, below);
          if (std::memcmp(&got, &want, sizeof got) != 0) {
            std::printf("FAILED exp sum %s n=%lld: %.17g, the portable path %.17g\n", isas[i].name, (long long)n, got, want);
            ok = false;
          }
        }
      }
    }
  }
  return ok;
}

// Every path's SwiGLU equals the portable path's bits (the last: the reference): one pair of panels of
// every width to two vectors and more, and several pairs of 8 and 32 columns, with gates of every size:
// 0, -0, at the logistic's clamps (+-18), past them, huge.
bool run_swiglu_case(std::mt19937& rng, const SwigluIsa* isas, int count, int64_t pairs, int64_t panel) {
  std::normal_distribution<float> normal(0.0f, 6.0f);
  std::vector<float> y(2 * pairs * panel), want(pairs * panel), got(pairs * panel);
  for (auto& v : y) v = normal(rng);
  const float edges[] = {0.0f, -0.0f, -18.0f, 18.0f, -45.0f, 45.0f, -1e30f, 1e30f};
  for (int64_t j = 0; j < panel && j < 8; ++j) y[(j * 5) % panel] = edges[j];  // gates of the first pair
  isas[count - 1].fn(y.data(), pairs, panel, want.data());
  bool ok = true;
  for (int i = 0; i < count - 1; ++i) {
    isas[i].fn(y.data(), pairs, panel, got.data());
    if (!want.empty() && std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) != 0) {
      std::printf("FAILED swiglu %s pairs=%lld panel=%lld\n", isas[i].name, (long long)pairs, (long long)panel);
      ok = false;
    }
  }
  return ok;
}

bool run_swiglu_cases(std::mt19937& rng, const SwigluIsa* isas, int count) {
  bool ok = true;
  for (int64_t panel = 0; panel < 40; ++panel) ok = run_swiglu_case(rng, isas, count, 1, panel) && ok;
  for (int64_t panel : {8, 32}) ok = run_swiglu_case(rng, isas, count, 5, panel) && ok;
  return ok;
}

}  // namespace

int main() {
  std::printf("cpu flags: %s\n", cpu_flag_names(cpu_features()).c_str());
  Isa isas[4];
  const int count = available_isas(isas, 4);
  std::printf("instruction sets:");
  for (int i = 0; i < count; ++i) std::printf(" %s", isas[i].name);
  std::printf("\n");
  std::mt19937 rng(7);
  int passed = 0, failed = 0;
  for (int64_t panel : {8, 32}) {
    for (int64_t block : {32, 64, 128}) {
      for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 33, 64}) {
        const int64_t k = block * (1 + static_cast<int64_t>(rng() % 4)), n = 32 * (1 + static_cast<int64_t>(rng() % 3));
        (run_case(Case{k, n, block, m, panel}, rng, isas, count) ? passed : failed)++;
      }
    }
    for (int64_t m : {3, 16, 17}) {  // a long K: the AVX-512 path takes it in spans (24 KB of a tile's activations)
      (run_case(Case{4096, 64, 32, m, panel}, rng, isas, count) ? passed : failed)++;
    }
  }
  AttentionIsa attention_isas[3];
  const int attention_count = available_attention_isas(attention_isas, 3);
  std::printf("attention instruction sets:");
  for (int i = 0; i < attention_count; ++i) std::printf(" %s", attention_isas[i].name);
  std::printf("\n");
  for (const AttentionCase& c : {AttentionCase{4, 1, 16, 16, 0, 3}, AttentionCase{12, 2, 128, 64, 40, 9},
                                 AttentionCase{14, 2, 64, 96, 79, 17}, AttentionCase{3, 3, 256, 32, 5, 2},
                                 AttentionCase{12, 2, 128, 272, 200, 5}, AttentionCase{7, 1, 48, 144, 100, 3},
                                 // windows: a sink and a gap, none of a pass's rows seeing the middle; a gap
                                 // some rows see into; a window with no sink; a window wider than the rows
                                 AttentionCase{12, 2, 128, 272, 200, 5, 32, 64}, AttentionCase{14, 2, 64, 304, 230, 17, 16, 32},
                                 AttentionCase{4, 1, 16, 160, 120, 9, 0, 48}, AttentionCase{6, 2, 32, 64, 20, 4, 16, 512},
                                 AttentionCase{4, 1, 32, 64, 20, 4, 512, 16}}) {
    (run_attention_case(c, rng, attention_isas, attention_count) ? passed : failed)++;
  }
  ExpSumIsa sum_isas[3];
  const int sum_count = available_exp_sum_isas(sum_isas, 3);
  std::printf("exp sum instruction sets:");
  for (int i = 0; i < sum_count; ++i) std::printf(" %s", sum_isas[i].name);
  std::printf("\n");
  (run_exp_sum_cases(rng, sum_isas, sum_count) ? passed : failed)++;
  SwigluIsa swiglu_isas[3];
  const int swiglu_count = available_swiglu_isas(swiglu_isas, 3);
  std::printf("swiglu instruction sets:");
  for (int i = 0; i < swiglu_count; ++i) std::printf(" %s", swiglu_isas[i].name);
  std::printf("\n");
  (run_swiglu_cases(rng, swiglu_isas, swiglu_count) ? passed : failed)++;
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
