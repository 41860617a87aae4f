// The ONNX Runtime custom op ai.specedge::MatMulInt4Rows around the kernel in int4_matmul.h, and a
// streaming read for the bandwidth profiler. The op is registered by RegisterCustomOps (what
// SessionOptions.register_custom_ops_library calls); threads come only from the session's intra-op
// pool (KernelContext_ParallelFor), split over panels of columns, never over K.
//
// Inputs: A float [..., K], packed uint8 [Q, K/8, 4P], scales float [Q, K/block, P], zero points
// uint8 [Q, K/block, P], Q = ceil(N/P) panels of P columns (columns past N are padding, computed and
// dropped), and optionally a bias float [N] added to Y (one rounding, as an Add after it).
// Attributes: K, N, block_size, layout (1: P = 8, 2: P = 32), activation (optional; 0: none, Y [..., N];
// 1: SwiGLU, Y [..., N/2]: the panels come in pairs, a gate panel then its up panel, and pair i gives
// Y's columns [P i, P i + P) = silu(gate) * up, swiglu.h). A task's panels are whole pairs, read as one
// stream, so each task applies the epilogue to its own columns.
// Shapes and attributes are checked when the session is made (one error naming the node and the fix).
#include <onnxruntime_c_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "attention.h"
#include "cpu_features.h"
#include "int4_matmul.h"
#include "ort_util.h"
#include "swiglu.h"

namespace specedge {
const OrtApi* g_api = nullptr;
}  // namespace specedge

using namespace specedge;

namespace {

constexpr const char* kDomain = "ai.specedge";
constexpr const char* kOpName = "MatMulInt4Rows";
constexpr const char* kIsaEnv = "SPECEDGE_KERNEL_ISA";

struct Kernel {
  int64_t k, n, block;
  int64_t panel;  // columns per panel of the weights' layout
  int64_t activation;  // 0: none; 1: SwiGLU over pairs of panels (gate, up)
  const specedge::Isa* isa;
  specedge::SwigluFn swiglu;
  bool weights_checked;  // all three weight inputs are constants, checked when the session was made
};

OrtStatus* attribute(const OrtKernelInfo* info, const char* name, int64_t* out) {
  if (OrtStatus* st = g_api->KernelInfoGetAttribute_int64(info, name, out)) {
    g_api->ReleaseStatus(st);
    return fail(std::string("MatMulInt4Rows: attribute ") + name + " is missing; re-export the model");
  }
  return nullptr;
}

// The expected shapes of inputs 1..3.
std::vector<int64_t> expected(const Kernel& kn, size_t input) {
  const int64_t panels = (kn.n + kn.panel - 1) / kn.panel;
  if (input == 1) return {panels, kn.k / 8, 4 * kn.panel};
  return {panels, kn.k / kn.block, kn.panel};
}

OrtStatus* check_weight(const Kernel& kn, size_t input, const std::vector<int64_t>& dims) {
  const auto want = expected(kn, input);
  if (dims != want) {
    static const char* names[] = {"", "packed weight", "scales", "zero points"};
    return fail(std::string("MatMulInt4Rows: ") + names[input] + " has shape " + shape_text(dims) + ", expected " +
                shape_text(want) + " for K=" + std::to_string(kn.k) + ", N=" + std::to_string(kn.n) +
                ", block " + std::to_string(kn.block) + "; re-export the model");
  }
  return nullptr;
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** out) {
  Kernel kn{};
  int64_t layout = 0;
  RETURN_IF(attribute(info, "K", &kn.k));
  RETURN_IF(attribute(info, "N", &kn.n));
  RETURN_IF(attribute(info, "block_size", &kn.block));
  RETURN_IF(attribute(info, "layout", &layout));
  if (OrtStatus* st = g_api->KernelInfoGetAttribute_int64(info, "activation", &kn.activation)) {
    g_api->ReleaseStatus(st);  // graphs exported before the attribute: no activation
    kn.activation = 0;
  }
  kn.panel = specedge::panel_columns(layout);
  if (kn.panel == 0) {
    return fail("MatMulInt4Rows: weights packed in layout " + std::to_string(layout) +
                ", this library reads layouts 1 and 2; re-export the model");
  }
  if (kn.block != 32 && kn.block != 64 && kn.block != 128) {
    return fail("MatMulInt4Rows: block_size " + std::to_string(kn.block) + " is not 32, 64 or 128");
  }
  if (kn.k <= 0 || kn.n <= 0 || kn.k % kn.block || kn.k > (int64_t{1} << 24) || kn.n > (int64_t{1} << 24)) {
    return fail("MatMulInt4Rows: K=" + std::to_string(kn.k) + " must be a positive multiple of the block (" +
                std::to_string(kn.block) + ") and N=" + std::to_string(kn.n) + " positive (both below 2^24)");
  }
  if (kn.activation != 0 && kn.activation != 1) {
    return fail("MatMulInt4Rows: activation " + std::to_string(kn.activation) +
                " is not 0 (none) or 1 (SwiGLU); re-export the model");
  }
  if (kn.activation == 1 && kn.n % (2 * kn.panel) != 0) {
    return fail("MatMulInt4Rows: SwiGLU needs N (" + std::to_string(kn.n) + ") in whole pairs of panels of " +
                std::to_string(kn.panel) + " columns; re-export the model");
  }
  const char* forced = std::getenv(kIsaEnv);
  kn.isa = specedge::pick_isa(forced, kn.panel);
  if (kn.isa == nullptr) {
    return fail(std::string(kIsaEnv) + "=" + forced + " names no instruction set this CPU runs on weights of layout " +
                std::to_string(layout) + " (unset it)");
  }
  kn.swiglu = specedge::swiglu_for(kn.isa->name);
  kn.weights_checked = true;
  for (size_t input = 1; input <= 3; ++input) {  // constant weights: checked now, not at every run
    int is_constant = 0;
    const OrtValue* value = nullptr;
    OrtStatus* st = g_api->KernelInfoGetConstantInput_tensor(info, input, &is_constant, &value);
    if (st != nullptr) g_api->ReleaseStatus(st);
    if (st != nullptr || !is_constant || value == nullptr) {
      kn.weights_checked = false;  // fed at run time: checked at each run
      continue;
    }
    OrtTensorTypeAndShapeInfo* shape = nullptr;
    RETURN_IF(g_api->GetTensorTypeAndShape(value, &shape));
    const auto dims = dims_of(shape);
    g_api->ReleaseTensorTypeAndShapeInfo(shape);
    RETURN_IF(check_weight(kn, input, dims));
  }
  *out = new Kernel(kn);
  return nullptr;
}

struct Job {
  specedge::Int4Weights w;
  specedge::QuantizedRows x;
  const specedge::Isa* isa;
  float* y;            // [m, w.n]: the MatMul's columns (whole panels)
  const float* bias;   // [n] or null
  int64_t n;           // the op's N (w.n is N rounded up to whole panels)
  specedge::SwigluFn swiglu;  // null: no activation; else out = swiglu of y's panel pairs
  float* out;          // [m, n / 2] under SwiGLU
  int64_t panels_per_task, panels;  // under SwiGLU: pairs of panels
};

// Panels [p0, p1) of y for every row, then the bias on their columns below N.
void compute_panels(const Job& job, int64_t p0, int64_t p1) {
  job.isa->fn(job.w, job.x, p0, p1, job.y);
  if (job.bias == nullptr) return;
  const int64_t c1 = std::min(job.n, p1 * job.w.panel);
  for (int64_t r = 0; r < job.x.m; ++r) {
    float* yr = job.y + r * job.w.n;
    for (int64_t c = p0 * job.w.panel; c < c1; ++c) yr[c] = yr[c] + job.bias[c];
  }
}

void run_task(void* data, size_t task) {
  const Job& job = *static_cast<const Job*>(data);
  const int64_t p0 = static_cast<int64_t>(task) * job.panels_per_task;
  const int64_t p1 = std::min(job.panels, p0 + job.panels_per_task);
  if (p0 >= p1) return;
  if (job.swiglu == nullptr) return compute_panels(job, p0, p1);
  compute_panels(job, 2 * p0, 2 * p1);
  const int64_t half = job.n / 2, panel = job.w.panel;
  for (int64_t r = 0; r < job.x.m; ++r) {  // w.n = n: whole pairs of panels
    job.swiglu(job.y + r * job.w.n + 2 * p0 * panel, p1 - p0, panel, job.out + r * half + p0 * panel);
  }
}

OrtStatus* ORT_API_CALL compute(void* state, OrtKernelContext* ctx) {
  const Kernel& kn = *static_cast<const Kernel*>(state);
  const void* ptr[4];
  std::vector<int64_t> dims[4];
  for (size_t i = 0; i < 4; ++i) RETURN_IF(tensor_data(ctx, i, &ptr[i], &dims[i]));
  const float* bias = nullptr;
  size_t inputs = 0;
  RETURN_IF(g_api->KernelContext_GetInputCount(ctx, &inputs));
  const OrtValue* bias_value = nullptr;
  if (inputs > 4) RETURN_IF(g_api->KernelContext_GetInput(ctx, 4, &bias_value));
  if (bias_value != nullptr) {
    const void* data = nullptr;
    std::vector<int64_t> bias_dims;
    RETURN_IF(tensor_data(ctx, 4, &data, &bias_dims));
    if (bias_dims != std::vector<int64_t>{kn.n}) {
      return fail("MatMulInt4Rows: bias has shape " + shape_text(bias_dims) + ", expected [" + std::to_string(kn.n) +
                  "]; re-export the model");
    }
    bias = static_cast<const float*>(data);
  }
  for (size_t i = 1; i < 4 && !kn.weights_checked; ++i) RETURN_IF(check_weight(kn, i, dims[i]));
  const auto& a = dims[0];
  if (a.empty() || a.back() != kn.k) {
    return fail("MatMulInt4Rows: input of shape " + shape_text(a) + " has no last dimension K=" + std::to_string(kn.k));
  }
  int64_t m = 1;
  for (size_t i = 0; i + 1 < a.size(); ++i) m *= a[i];
  std::vector<int64_t> out_dims(a);
  out_dims.back() = kn.activation == 1 ? kn.n / 2 : kn.n;
  OrtValue* out = nullptr;
  RETURN_IF(g_api->KernelContext_GetOutput(ctx, 0, out_dims.data(), out_dims.size(), &out));
  float* y = nullptr;
  RETURN_IF(g_api->GetTensorMutableData(out, reinterpret_cast<void**>(&y)));
  if (m == 0) return nullptr;

  const int64_t blocks = kn.k / kn.block;
  std::vector<int8_t> q(static_cast<size_t>(m * kn.k));
  std::vector<float> xs(static_cast<size_t>(m * blocks));
  std::vector<int32_t> xsum(static_cast<size_t>(m * blocks));
  kn.isa->quantize(static_cast<const float*>(ptr[0]), m, kn.k, kn.block, q.data(), xs.data(), xsum.data());

  const int64_t panels = (kn.n + kn.panel - 1) / kn.panel, width = panels * kn.panel;
  // N not a multiple of P, or SwiGLU: whole panels into a buffer (then the N columns, or the epilogue)
  std::vector<float> padded;
  if (width != kn.n || kn.activation == 1) padded.resize(static_cast<size_t>(m * width));
  Job job{{static_cast<const uint8_t*>(ptr[1]), static_cast<const float*>(ptr[2]), static_cast<const uint8_t*>(ptr[3]),
           kn.k, width, kn.block, kn.panel},
          {q.data(), xs.data(), xsum.data(), m},
          kn.isa,
          padded.empty() ? y : padded.data(),
          bias,
          kn.n,
          kn.activation == 1 ? kn.swiglu : nullptr,
          y,
          0,
          kn.activation == 1 ? panels / 2 : panels};
  // about 64 tasks: small enough to balance two to sixteen threads, large enough to stream
  job.panels_per_task = std::max<int64_t>(1, (job.panels + 63) / 64);
  const size_t tasks = static_cast<size_t>((job.panels + job.panels_per_task - 1) / job.panels_per_task);
  RETURN_IF(g_api->KernelContext_ParallelFor(ctx, run_task, tasks, 0, &job));
  for (int64_t r = 0; r < m && !padded.empty() && job.swiglu == nullptr; ++r) {
    std::memcpy(y + r * kn.n, padded.data() + r * width, static_cast<size_t>(kn.n) * sizeof(float));
  }
  return nullptr;
}

OrtStatus* ORT_API_CALL infer_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  // Y: A's shape (symbolic names included) with the last dimension N
  OrtTensorTypeAndShapeInfo* in = nullptr;
  RETURN_IF(g_api->ShapeInferContext_GetInputTypeShape(ctx, 0, &in));
  size_t count = 0;
  must(g_api->GetDimensionsCount(in, &count));
  std::vector<int64_t> dims(count);
  std::vector<const char*> borrowed(count);
  must(g_api->GetDimensions(in, dims.data(), count));
  must(g_api->GetSymbolicDimensions(in, borrowed.data(), count));
  std::vector<std::string> names(borrowed.begin(), borrowed.end());  // `in` stays ONNX Runtime's
  if (count == 0) return fail("MatMulInt4Rows: the input has no dimensions");
  const OrtOpAttr* attr = nullptr;
  RETURN_IF(g_api->ShapeInferContext_GetAttribute(ctx, "N", &attr));
  size_t size = 0;
  RETURN_IF(g_api->ReadOpAttr(attr, ORT_OP_ATTR_INT, &dims.back(), sizeof(int64_t), &size));
  const OrtOpAttr* activation = nullptr;
  OrtStatus* missing = g_api->ShapeInferContext_GetAttribute(ctx, "activation", &activation);
  if (missing != nullptr) g_api->ReleaseStatus(missing);  // no attribute: no activation
  int64_t kind = 0;
  if (missing == nullptr && activation != nullptr) {
    RETURN_IF(g_api->ReadOpAttr(activation, ORT_OP_ATTR_INT, &kind, sizeof(int64_t), &size));
  }
  if (kind == 1) dims.back() /= 2;  // SwiGLU: half the columns
  names.back().clear();
  std::vector<const char*> symbolic;
  for (const auto& name : names) symbolic.push_back(name.c_str());
  OrtTensorTypeAndShapeInfo* out = nullptr;
  RETURN_IF(g_api->CreateTensorTypeAndShapeInfo(&out));
  OrtStatus* st = g_api->SetTensorElementType(out, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
  if (st == nullptr) st = g_api->SetDimensions(out, dims.data(), count);
  if (st == nullptr) st = g_api->SetSymbolicDimensions(out, symbolic.data(), count);
  if (st == nullptr) st = g_api->ShapeInferContext_SetOutputTypeShape(ctx, 0, out);
  g_api->ReleaseTensorTypeAndShapeInfo(out);
  return st;
}

ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp*, size_t i) {
  return (i == 0 || i == 2 || i == 4) ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
}

OrtCustomOp make_op() {
  OrtCustomOp op = cpu_op();
  op.GetName = [](const OrtCustomOp*) { return kOpName; };
  op.GetInputType = input_type;
  op.GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 5; };
  op.GetInputCharacteristic = [](const OrtCustomOp*, size_t i) {
    return i == 4 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;  // the bias
  };
  op.GetOutputType = [](const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; };
  op.GetOutputTypeCount = [](const OrtCustomOp*) -> size_t { return 1; };
  op.KernelDestroy = [](void* k) { delete static_cast<Kernel*>(k); };
  op.CreateKernelV2 = create_kernel;
  op.KernelComputeV2 = compute;
  op.InferOutputShapeFn = infer_shape;
  return op;
}

}  // namespace

OrtCustomOp* specedge::matmul_op() {
  static OrtCustomOp op = make_op();
  return &op;
}

namespace {

// The attention window a session asks for, in its options' config entries (set before the library
// is registered with them): slots, a multiple of 16; 0 where the entry is absent.
constexpr const char* kWindowEntry = "specedge.attention_window";
constexpr const char* kSinkEntry = "specedge.attention_sink";

OrtStatus* window_entry(const OrtSessionOptions* options, const char* key, int64_t* out) {
  int has = 0;
  RETURN_IF(g_api->HasSessionConfigEntry(options, key, &has));
  if (!has) return nullptr;
  char text[32] = {};
  size_t size = sizeof text;
  RETURN_IF(g_api->GetSessionConfigEntry(options, key, text, &size));
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || value < 0 || value % kSlotBlock != 0) {
    return fail(std::string(key) + "=" + text + ": give a number of slots, a multiple of 16 (0: every slot)");
  }
  *out = value;
  return nullptr;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                  const OrtApiBase* base) {
  // C API 21 (onnxruntime 1.21): every later release serves it, its function table only grows
  g_api = base->GetApi(ORT_API_VERSION);
  if (g_api == nullptr) return nullptr;  // older than 1.21: nothing registered; the session then names the op
  int64_t window = 0, sink = 0;
  RETURN_IF(window_entry(options, kWindowEntry, &window));
  RETURN_IF(window_entry(options, kSinkEntry, &sink));
  OrtCustomOpDomain* domain = nullptr;  // one per registration, kept for the process (ONNX Runtime's rule)
  RETURN_IF(g_api->CreateCustomOpDomain(kDomain, &domain));
  RETURN_IF(g_api->CustomOpDomain_Add(domain, matmul_op()));
  RETURN_IF(g_api->CustomOpDomain_Add(domain, attention_op(sink, window)));
  return g_api->AddCustomOpDomain(options, domain);
}

// The instruction set the op would use here ("" if SPECEDGE_KERNEL_ISA names none this CPU runs).
__attribute__((visibility("default"))) const char* specedge_kernel_isa() {
  const specedge::Isa* isa = specedge::pick_isa(std::getenv(kIsaEnv));
  return isa != nullptr ? isa->name : "";
}

// 1 if the instruction set `name` runs here and reads weights of `layout` (1 or 2), else 0.
__attribute__((visibility("default"))) int specedge_kernel_reads(const char* name, int64_t layout) {
  const int64_t panel = specedge::panel_columns(layout);
  return name != nullptr && name[0] != '\0' && panel != 0 && specedge::pick_isa(name, panel) != nullptr;
}

// The CPU's features the kernels choose by, space-separated, named as /proc/cpuinfo names them.
__attribute__((visibility("default"))) const char* specedge_cpu_flags() {
  static const std::string names = specedge::cpu_flag_names(specedge::cpu_features());
  return names.c_str();
}

// Every instruction set this CPU runs, comma-separated, best first.
__attribute__((visibility("default"))) const char* specedge_kernel_isas() {
  static const std::string names = [] {
    specedge::Isa isas[4];
    return specedge::isa_names(isas, specedge::available_isas(isas, 4));
  }();
  return names.c_str();
}

// Bytes per second of reading `bytes` (split over `threads` threads, each its own slice) `rounds`
// times after one warm-up round; the best round counts. 0 on failure.
__attribute__((visibility("default"))) double specedge_read_bandwidth(size_t bytes, int threads, int rounds) {
  threads = std::max(1, threads);
  const size_t words = bytes / sizeof(uint64_t) / threads * threads;
  if (words == 0) return 0.0;
  std::vector<uint64_t> data(words, 1);
  std::atomic<uint64_t> sink{0};
  double best = 0.0;
  for (int round = -1; round < rounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const uint64_t* p = data.data() + words / threads * t;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= words / threads; i += 4) {
          s0 += p[i];
          s1 += p[i + 1];
          s2 += p[i + 2];
          s3 += p[i + 3];
        }
        sink += s0 + s1 + s2 + s3;
      });
    }
    for (auto& th : pool) th.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (round >= 0 && seconds > 0) best = std::max(best, static_cast<double>(words * sizeof(uint64_t)) / seconds);
  }
  return sink.load() == 0 ? 0.0 : best;
}

}  // extern "C"
