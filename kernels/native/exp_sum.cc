// The tail sum's portable path, its lane fold, the choice of instruction set and its C entry points
// (the arithmetic is told in exp_sum.h).
#include "exp_sum.h"

#include <cstring>
#include <string>

#include "attention.h"
#include "cpu_features.h"

namespace specedge {

void add_exp_lanes(const float* z, int64_t from, int64_t n, float top, float scale, float below, double* lanes) {
  for (int64_t i = from; i < n; ++i) {
    if (!(z[i] < below)) continue;  // NaN and +inf are not below anything
    const float x = (z[i] - top) * scale;
    lanes[i % kSumLanes] += static_cast<double>(x < kExpFloor ? 0.0f : exp_rows(x));
  }
}

double fold_lanes(double* lanes) {
  for (int64_t w = kSumLanes / 2; w >= 1; w /= 2) {
    for (int64_t l = 0; l < w; ++l) lanes[l] = lanes[l] + lanes[l + w];
  }
  return lanes[0];
}

namespace {

double sum_portable(const float* z, int64_t n, float top, float scale, float below) {
  double lanes[kSumLanes] = {};
  add_exp_lanes(z, 0, n, top, scale, below, lanes);
  return fold_lanes(lanes);
}

}  // namespace

int available_exp_sum_isas(ExpSumIsa* out, int capacity) {
  int n = 0;
  auto add = [&](const ExpSumIsa& isa) {
    if (n < capacity) out[n++] = isa;
  };
#if defined(__x86_64__) || defined(_M_X64)
  const CpuFeatures& cpu = cpu_features();
  if (cpu.avx2 && cpu.fma && cpu.avx512f) add(avx512_exp_sum());
  if (cpu.avx2 && cpu.fma) add(avx2_exp_sum());
#endif
  add(ExpSumIsa{"portable", sum_portable});
  return n;
}

}  // namespace specedge

namespace {

// The paths this CPU runs, read once.
struct ExpSumTable {
  specedge::ExpSumIsa isas[3];
  int count;
};

const ExpSumTable& exp_sum_table() {
  static const ExpSumTable table = [] {
    ExpSumTable t{};
    t.count = specedge::available_exp_sum_isas(t.isas, 3);
    return t;
  }();
  return table;
}

}  // namespace

extern "C" {

// The sum of exp_sum.h over z[0 .. n) on the instruction set `isa` names (null or "": the best here);
// returns 0, or -1 where `isa` names none this CPU runs (*out untouched).
__attribute__((visibility("default"))) int specedge_exp_sum(const float* z, int64_t n, float top, float scale,
                                                            float below, const char* isa, double* out) {
  const ExpSumTable& table = exp_sum_table();
  for (int i = 0; i < table.count; ++i) {
    if (isa == nullptr || isa[0] == '\0' || std::strcmp(table.isas[i].name, isa) == 0) {
      *out = table.isas[i].sum(z, n, top, scale, below);
      return 0;
    }
  }
  return -1;
}

// Every instruction set this CPU runs the sum on, comma-separated, best first.
__attribute__((visibility("default"))) const char* specedge_exp_sum_isas() {
  static const std::string names = specedge::isa_names(exp_sum_table().isas, exp_sum_table().count);
  return names.c_str();
}

}  // extern "C"
