// What the library's ONNX Runtime ops share: the C API table (set when the ops are registered),
// errors as statuses, and tensors' shapes and data.
#pragma once

#include <onnxruntime_c_api.h>

#include <cstring>
#include <string>
#include <vector>

namespace specedge {

extern const OrtApi* g_api;  // set by RegisterCustomOps

inline OrtStatus* fail(const std::string& what) { return g_api->CreateStatus(ORT_INVALID_ARGUMENT, what.c_str()); }

// For calls that cannot fail on the arguments given (a shape's own dimensions).
inline void must(OrtStatus* st) {
  if (st != nullptr) g_api->ReleaseStatus(st);
}

#define RETURN_IF(expr)                      \
  do {                                       \
    if (OrtStatus* st_ = (expr)) return st_; \
  } while (0)

inline std::vector<int64_t> dims_of(const OrtTensorTypeAndShapeInfo* info) {
  size_t count = 0;
  must(g_api->GetDimensionsCount(info, &count));
  std::vector<int64_t> dims(count);
  must(g_api->GetDimensions(info, dims.data(), count));
  return dims;
}

inline std::string shape_text(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

// Input `index` of a kernel's run: its data and dimensions.
inline OrtStatus* tensor_data(OrtKernelContext* ctx, size_t index, const void** data, std::vector<int64_t>* dims) {
  const OrtValue* value = nullptr;
  RETURN_IF(g_api->KernelContext_GetInput(ctx, index, &value));
  OrtTensorTypeAndShapeInfo* shape = nullptr;
  RETURN_IF(g_api->GetTensorTypeAndShape(value, &shape));
  *dims = dims_of(shape);
  g_api->ReleaseTensorTypeAndShapeInfo(shape);
  return g_api->GetTensorMutableData(const_cast<OrtValue*>(value), const_cast<void**>(data));
}

// A CPU custom op of version 1 whose inputs and outputs are all required, single, in default
// memory: the fields the library's ops share (each sets its name, types, arity and functions).
inline OrtCustomOp cpu_op() {
  OrtCustomOp op;
  std::memset(&op, 0, sizeof op);
  op.version = ORT_API_VERSION;
  op.GetExecutionProviderType = [](const OrtCustomOp*) -> const char* { return "CPUExecutionProvider"; };
  op.GetInputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  op.GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  op.GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
  op.GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.GetStartVersion = [](const OrtCustomOp*) { return 1; };
  op.GetEndVersion = [](const OrtCustomOp*) { return 1; };
  return op;
}

// The custom ops of the library (ort_op.cc: MatMulInt4Rows; ort_attention.cc: AttentionRows, with
// the window a session asks for: attention.h).
OrtCustomOp* matmul_op();
OrtCustomOp* attention_op(int64_t sink, int64_t window);

}  // namespace specedge
