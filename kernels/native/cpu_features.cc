// CPU features for the kernels' choice of instruction set (see cpu_features.h).
#include "cpu_features.h"

#include <utility>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif
#if defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#if defined(_WIN32) && (defined(__aarch64__) || defined(_M_ARM64))
#include <windows.h>
#endif

namespace specedge {
namespace {

#if defined(__x86_64__) || defined(_M_X64)
CpuFeatures read_x86() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512_vnni = __builtin_cpu_supports("avx512vnni");
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (f.avx2 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {  // leaf 7: AMX in EDX (its OS state asked at use)
    f.amx_bf16 = (d >> 22) & 1;
    f.amx_tile = (d >> 24) & 1;
    f.amx_int8 = (d >> 25) & 1;
    if (a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) {
      f.avx_vnni = (a >> 4) & 1;
      f.avx512_bf16 = f.avx512f && ((a >> 5) & 1);
    }
  }
  return f;
}
#endif

#if defined(__aarch64__) || defined(_M_ARM64)
#if defined(__linux__)
CpuFeatures read_arm() {
  CpuFeatures f;
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  f.asimd = hw & (1UL << 1);
  f.asimddp = hw & (1UL << 20);
  f.sve = hw & (1UL << 22);
  f.sve2 = hw2 & (1UL << 1);
  f.i8mm = hw2 & (1UL << 13);
  f.bf16 = hw2 & (1UL << 14);
  return f;
}
#elif defined(__APPLE__)
bool sysctl_flag(const char* name) {
  int value = 0;
  size_t size = sizeof value;
  return sysctlbyname(name, &value, &size, nullptr, 0) == 0 && value != 0;
}
CpuFeatures read_arm() {
  CpuFeatures f;
  f.asimd = true;  // every Apple CPU that runs arm64 code
  f.asimddp = sysctl_flag("hw.optional.arm.FEAT_DotProd");
  f.i8mm = sysctl_flag("hw.optional.arm.FEAT_I8MM");
  f.bf16 = sysctl_flag("hw.optional.arm.FEAT_BF16");
  return f;
}
#elif defined(_WIN32)
CpuFeatures read_arm() {
  CpuFeatures f;
  f.asimd = true;                                       // Windows on Arm requires it
  f.asimddp = IsProcessorFeaturePresent(43) != FALSE;   // PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE
  f.sve = IsProcessorFeaturePresent(46) != FALSE;       // PF_ARM_SVE_INSTRUCTIONS_AVAILABLE
  f.sve2 = IsProcessorFeaturePresent(47) != FALSE;      // PF_ARM_SVE2_INSTRUCTIONS_AVAILABLE
  f.i8mm = IsProcessorFeaturePresent(54) != FALSE;      // PF_ARM_SVE_I8MM_INSTRUCTIONS_AVAILABLE
  return f;
}
#else
CpuFeatures read_arm() { return CpuFeatures{}; }  // an OS we cannot ask: the portable path
#endif
#endif

CpuFeatures read_features() {
#if defined(__x86_64__) || defined(_M_X64)
  return read_x86();
#elif defined(__aarch64__) || defined(_M_ARM64)
  return read_arm();
#else
  return CpuFeatures{};
#endif
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = read_features();
  return features;
}

std::string cpu_flag_names(const CpuFeatures& f) {
  const std::pair<bool, const char*> named[] = {
      {f.avx2, "avx2"}, {f.fma, "fma"}, {f.avx512f, "avx512f"}, {f.avx512bw, "avx512bw"}, {f.avx512vl, "avx512vl"},
      {f.avx512_vnni, "avx512_vnni"}, {f.avx_vnni, "avx_vnni"}, {f.avx512_bf16, "avx512_bf16"},
      {f.amx_tile, "amx_tile"}, {f.amx_int8, "amx_int8"}, {f.amx_bf16, "amx_bf16"}, {f.asimd, "asimd"},
      {f.asimddp, "asimddp"}, {f.i8mm, "i8mm"}, {f.sve, "sve"}, {f.sve2, "sve2"}, {f.bf16, "bf16"}};
  std::string s;
  for (const auto& [present, name] : named) {
    if (present) s += (s.empty() ? "" : " ") + std::string(name);
  }
  return s;
}

}  // namespace specedge
