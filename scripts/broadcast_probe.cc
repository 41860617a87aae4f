// What bounds a tile of many rows in the AVX-512 VNNI kernel: the weight stream, the vpdpbusd unit, or
// the broadcasts of activations that feed it? Streams 96 MiB (beyond the last-level cache) or 256 KiB
// (in L2) on every core, D vpdpbusd per 64 bytes read, their second operand either a register or a
// 32-bit broadcast of activations from L1 (as the kernel's tiles do), and prints cycles per 64-byte
// line, medians of 7; "cycles" are vpdpbusd issue slots, measured first by a loop of independent
// vpdpbusd (one a cycle on the CPUs this was written on). Build and run on an AVX-512 VNNI machine:
//
//     g++ -O2 -std=c++17 -pthread -mavx512f -mavx512bw -mavx512vnni scripts/broadcast_probe.cc -o broadcast_probe
//     ./broadcast_probe
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

alignas(64) int8_t activations[16 * 2048];  // 16 rows: D up to 32

template <int D, bool Broadcast>
__m512i stream(const uint8_t* p, int64_t lines) {
  __m512i acc[16];
  for (auto& a : acc) a = _mm512_setzero_si512();
  const __m512i x = _mm512_set1_epi32(0x01020304);
  for (int64_t i = 0; i < lines; ++i, p += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p + 4096), _MM_HINT_T0);
    const __m512i w = _mm512_loadu_si512(p);
#pragma GCC unroll 32
    for (int j = 0; j < D; ++j) {
      __m512i b = x;
      if (Broadcast) {  // row j/2's 4 activations at this line's k, as a tile of D/2 rows reads them
        int32_t v;
        std::memcpy(&v, activations + (j / 2) * 2048 + (i & 255) * 8 + (j % 2) * 4, 4);
        b = _mm512_set1_epi32(v);
      }
      acc[j % 16] = _mm512_dpbusd_epi32(acc[j % 16], w, b);
    }
    if (D == 0) acc[0] = _mm512_add_epi32(acc[0], w);
  }
  __m512i s = acc[0];
  for (int j = 1; j < 16; ++j) s = _mm512_add_epi32(s, acc[j]);
  return s;
}

double issue_rate() {  // vpdpbusd a second, one core, 16 independent chains
  __m512i a[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_set1_epi32(i);
  __m512i b = _mm512_set1_epi32(0x01010101), c = _mm512_set1_epi32(0x02020202);
  const int64_t n = 50000000;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) a[j] = _mm512_dpbusd_epi32(a[j], b, c);
    asm volatile("" : "+v"(b));
  }
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  static volatile int sink = 0;
  for (auto& v : a) sink = sink + _mm512_reduce_add_epi32(v);  // keeps the loop
  return n * 16 / t;
}

template <int D, bool Broadcast>
double seconds_per_line(const uint8_t* buffer, int64_t bytes, int threads, bool cached) {
  std::vector<double> runs;
  for (int round = 0; round < 7; ++round) {
    const auto start = std::chrono::steady_clock::now();
    auto work = [&](int t) {
      const int64_t part = bytes / threads;
      const int64_t lines = cached ? (256 << 10) / 64 : part / 64;
      const int64_t reps = cached ? part / (256 << 10) : 1;
      volatile int sink = 0;
      for (int64_t r = 0; r < reps; ++r) {
        sink = _mm_cvtsi128_si32(_mm512_castsi512_si128(stream<D, Broadcast>(buffer + t * part, lines)));
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool) th.join();
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2] / (bytes / threads / 64);
}

template <int D>
void row(const uint8_t* buffer, int64_t bytes, int threads, double rate) {
  std::printf("| %2d | %5.1f | %5.1f | %5.1f | %5.1f |\n", D, seconds_per_line<D, false>(buffer, bytes, threads, false) * rate,
              seconds_per_line<D, false>(buffer, bytes, threads, true) * rate,
              seconds_per_line<D, true>(buffer, bytes, threads, false) * rate,
              seconds_per_line<D, true>(buffer, bytes, threads, true) * rate);
}

}  // namespace

int main() {
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t bytes = int64_t{96} << 20;
  auto* buffer = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
  for (int64_t i = 0; i < bytes; ++i) buffer[i] = static_cast<uint8_t>(i * 7);
  for (auto& a : activations) a = 3;
  const double rate = issue_rate();
  std::printf("%d threads; %.2f G vpdpbusd a second a core; cycles per 64-byte line, each core:\n\n", threads,
              rate / 1e9);
  std::printf("| vpdpbusd a line | register, DRAM | register, L2 | broadcast, DRAM | broadcast, L2 |\n");
  std::printf("|---|---|---|---|---|\n");
  row<0>(buffer, bytes, threads, rate);
  row<4>(buffer, bytes, threads, rate);
  row<8>(buffer, bytes, threads, rate);
  row<12>(buffer, bytes, threads, rate);
  row<16>(buffer, bytes, threads, rate);
  row<24>(buffer, bytes, threads, rate);
  std::free(buffer);
}
