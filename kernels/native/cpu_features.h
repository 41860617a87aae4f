// The instruction sets this CPU runs, as the kernels choose among them: read from CPUID on x86 and
// from the operating system on ARM (Linux's auxiliary vector, macOS's sysctl, Windows' processor
// features), so the choice is the same on every OS and never depends on /proc/cpuinfo.
#pragma once

#include <string>

namespace specedge {

struct CpuFeatures {
  // x86 (CPUID; AVX and AVX-512 only where the OS saves their registers, as GCC/Clang's builtins check)
  bool avx2 = false, fma = false, avx512f = false, avx512bw = false, avx512vl = false, avx512_vnni = false,
       avx_vnni = false, avx512_bf16 = false, amx_tile = false, amx_int8 = false, amx_bf16 = false;
  // ARM
  bool asimd = false, asimddp = false, i8mm = false, sve = false, sve2 = false, bf16 = false;
};

// Read once per process.
const CpuFeatures& cpu_features();

// The features present, space-separated, named as Linux's /proc/cpuinfo names them.
std::string cpu_flag_names(const CpuFeatures& f);

// The names of `n` instruction-set entries (anything with a `name`), comma-separated, in their order.
template <class Entry>
std::string isa_names(const Entry* isas, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::string(isas[i].name);
  return s;
}

}  // namespace specedge
