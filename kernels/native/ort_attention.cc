// The ONNX Runtime custom op ai.specedge::AttentionRows around the attention of attention.h: one
// layer's rope, cache write and causal attention over a float16 KV cache, rows exact at any width.
//
// Inputs: qkv float [1, S, (H + 2 KV) d] (the packed projection, biases added), position_ids int64
// [1, S], cos and sin caches float [C, d/2], past_key float16 [N, KV, T, d] (slots in blocks of 16:
// attention.h), past_value float16 [N, KV, T, d], and optionally stream_ids int64 [1, S]: the cache
// (of N, one per stream) each row reads and writes. Without stream_ids, N is 1. The rows of one
// stream are one contiguous run; each run is computed as a pass of its own (attention.h: the same
// tasks, the runs' tasks side by side in each of the three steps), so a row's result is the same
// whether its stream shares the pass with others or runs alone, and no row ever reads another
// stream's cache. Outputs: attn float [1, S, H d], present_key and
// present_value (the past buffers with the rows' entries written; bound to the same memory as the
// past ones, the pass writes in place). Attributes: num_heads, kv_heads, head_dim, scale.
// Threads: the session's intra-op pool, in three steps (scores of slot blocks, each query's softmax,
// outputs by queries and dimensions as the path takes them: attention.h), each a set of tasks with
// disjoint outputs.
#include <algorithm>
#include <mutex>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attention.h"
#include "cpu_features.h"
#include "ort_util.h"

using namespace specedge;

namespace {

constexpr const char* kOpName = "AttentionRows";
constexpr const char* kIsaEnv = "SPECEDGE_ATTENTION_ISA";

struct Kernel {
  int64_t heads, kv_heads, head_dim;
  float scale;
  const AttentionIsa* isa;
  int64_t sink, window;  // the session's window (attention.h; window 0: every slot)
};

// The op as one registration made it: the window its session's options ask for.
struct WindowedOp : OrtCustomOp {
  int64_t sink = 0, window = 0;
};

OrtStatus* int_attribute(const OrtKernelInfo* info, const char* name, int64_t* out) {
  if (OrtStatus* st = g_api->KernelInfoGetAttribute_int64(info, name, out)) {
    g_api->ReleaseStatus(st);
    return fail(std::string("AttentionRows: attribute ") + name + " is missing; re-export the model");
  }
  return nullptr;
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info, void** out) {
  Kernel kn{};
  kn.sink = static_cast<const WindowedOp*>(op)->sink;
  kn.window = static_cast<const WindowedOp*>(op)->window;
  RETURN_IF(int_attribute(info, "num_heads", &kn.heads));
  RETURN_IF(int_attribute(info, "kv_heads", &kn.kv_heads));
  RETURN_IF(int_attribute(info, "head_dim", &kn.head_dim));
  if (OrtStatus* st = g_api->KernelInfoGetAttribute_float(info, "scale", &kn.scale)) {
    g_api->ReleaseStatus(st);
    return fail("AttentionRows: attribute scale is missing; re-export the model");
  }
  if (kn.kv_heads <= 0 || kn.heads <= 0 || kn.heads % kn.kv_heads || kn.head_dim < 16 || kn.head_dim > 512 ||
      kn.head_dim % 16) {
    return fail("AttentionRows: num_heads=" + std::to_string(kn.heads) + ", kv_heads=" + std::to_string(kn.kv_heads) +
                ", head_dim=" + std::to_string(kn.head_dim) +
                ": heads must be a multiple of kv_heads and head_dim a multiple of 16 up to 512");
  }
  const char* forced = std::getenv(kIsaEnv);
  kn.isa = pick_attention_isa(forced);
  if (kn.isa == nullptr) return fail(std::string(kIsaEnv) + "=" + forced + " names no instruction set this CPU runs");
  *out = new Kernel(kn);
  return nullptr;
}

// One pass's work: the pass, each KV head's queries, their scores (then exps) and sums.
struct Job {
  AttentionPass pass;
  const AttentionIsa* isa;
  int64_t queries;      // R: queries a KV head has (rows x heads per KV head)
  int64_t blocks;       // slot blocks the last row reads
  int64_t chunks;       // score tasks per KV head
  int64_t dims;         // dimensions a weigh task takes
  int64_t span;         // queries a weigh task takes
  int64_t dim_tasks;    // weigh tasks per KV head and span of queries
  int64_t weigh_tasks;  // weigh tasks per KV head
  float* q;             // [KV][R][d]
  int64_t* limits;      // [KV][R]
  float* scores;        // [KV][R][T]
  float* sums;          // [KV][R]
  int64_t* starts;      // [KV][R]: where each query's window starts
  int64_t gap0, gap1;   // the slots no query sees (every KV head's queries are of the same rows)
  int64_t seen;         // the slot blocks before the gap (then the gap's are skipped)

  Queries of(int64_t kv) const {
    return {kv, q + kv * queries * pass.head_dim, limits + kv * queries, queries, starts + kv * queries, gap0, gap1};
  }
  float* scores_of(int64_t kv) const { return scores + kv * queries * pass.stride; }
};

constexpr int64_t kBlocksPerTask = 8;  // 128 slots of scores a task

// Score tasks of kBlocksPerTask blocks over the blocks before the gap, then over those after it.
int64_t score_chunks(int64_t blocks) { return (blocks + kBlocksPerTask - 1) / kBlocksPerTask; }

void score_task(const Job& job, int64_t task) {
  const int64_t kv = task / job.chunks, c = task % job.chunks, before = score_chunks(job.seen);
  const int64_t first = c < before ? 0 : job.gap1 / kSlotBlock, end = c < before ? job.seen : job.blocks;
  const int64_t b0 = first + (c < before ? c : c - before) * kBlocksPerTask, b1 = std::min(end, b0 + kBlocksPerTask);
  job.isa->scores(job.pass, job.of(kv), b0, b1, job.scores_of(kv));
}

void softmax_task(const Job& job, int64_t task) {
  const int64_t kv = task / job.queries, r = task % job.queries;
  job.sums[kv * job.queries + r] = query_softmax(*job.isa, job.pass, job.of(kv), r, job.scores_of(kv) + r * job.pass.stride);
}

void weigh_task(const Job& job, int64_t task) {
  const int64_t kv = task / job.weigh_tasks, c = task % job.weigh_tasks;
  const int64_t r0 = c / job.dim_tasks * job.span, r1 = std::min(job.queries, r0 + job.span);
  const int64_t i0 = c % job.dim_tasks * job.dims, i1 = std::min(job.pass.head_dim, i0 + job.dims);
  job.isa->weigh(job.pass, job.of(kv), job.scores_of(kv), job.sums + kv * job.queries, r0, r1, i0, i1);
}

// One step of every stream's job, as one set of tasks on the pool: the tasks of job j are
// [first[j], first[j + 1]), each the task the job alone would run (so a stream's rows come out as
// in a pass of their own, whatever streams share it).
struct Step {
  const std::vector<Job>* jobs;
  std::vector<int64_t> first;  // per job its first task, then the total
  void (*task)(const Job&, int64_t);

  Step(const std::vector<Job>& all, void (*fn)(const Job&, int64_t), int64_t (*count)(const Job&))
      : jobs(&all), first{0}, task(fn) {
    for (const Job& job : all) first.push_back(first.back() + count(job));
  }
  size_t total() const { return static_cast<size_t>(first.back()); }
};

void step_task(void* data, size_t task) {
  const Step& step = *static_cast<const Step*>(data);
  const int64_t t = static_cast<int64_t>(task);
  const size_t j = static_cast<size_t>(std::upper_bound(step.first.begin(), step.first.end(), t) - step.first.begin()) - 1;
  step.task((*step.jobs)[j], t - step.first[j]);
}

// Buffers kept by the thread that runs a session's passes, grown as needed.
struct Scratch {
  std::vector<float> q, scores, sums;
  std::vector<int64_t> limits, starts;
};

// The scratch of a pass: one for the process, sized by the pass's rows and the slots they read (not the
// cache's capacity), passes taking turns on it (two sessions' passes at once wait here, their matrix
// products apart). A scratch kept more than 4x (and 1 MB) larger than a pass needs is given back.
struct SharedScratch {
  std::mutex lock;
  Scratch scratch;
};
SharedScratch g_scratch;

template <typename T>
T* fit(std::vector<T>* v, size_t n) {
  if (v->capacity() > 4 * n + (1u << 20) / sizeof(T)) std::vector<T>().swap(*v);
  v->resize(n);
  return v->data();
}

OrtStatus* output(OrtKernelContext* ctx, size_t index, const std::vector<int64_t>& dims, void** data) {
  OrtValue* value = nullptr;
  RETURN_IF(g_api->KernelContext_GetOutput(ctx, index, dims.data(), dims.size(), &value));
  return g_api->GetTensorMutableData(value, data);
}

OrtStatus* check_inputs(const Kernel& kn, const std::vector<int64_t>* dims, const int64_t* pos) {
  const int64_t d = kn.head_dim, width = (kn.heads + 2 * kn.kv_heads) * d;
  const auto& qkv = dims[0];
  if (qkv.size() != 3 || qkv[0] != 1 || qkv[2] != width || dims[1] != std::vector<int64_t>{1, qkv[1]}) {
    return fail("AttentionRows: qkv " + shape_text(qkv) + " and positions " + shape_text(dims[1]) +
                " do not match [1, S, " + std::to_string(width) + "] and [1, S]");
  }
  const auto& cache = dims[4];
  if (cache.size() != 4 || cache[0] < 1 || cache[1] != kn.kv_heads || cache[3] != d || cache[2] % kSlotBlock ||
      dims[5] != cache) {
    return fail("AttentionRows: cache buffers " + shape_text(cache) + " and " + shape_text(dims[5]) + " must both be [N, " +
                std::to_string(kn.kv_heads) + ", T, " + std::to_string(d) + "] with T a multiple of 16");
  }
  if (dims[2].size() != 2 || dims[2][1] != d / 2 || dims[3] != dims[2]) {
    return fail("AttentionRows: rope caches " + shape_text(dims[2]) + ", " + shape_text(dims[3]) + " must be [C, " +
                std::to_string(d / 2) + "]");
  }
  for (int64_t s = 0; s < qkv[1]; ++s) {
    if (pos[s] < 0 || pos[s] >= cache[2] || pos[s] >= dims[2][0]) {
      return fail("AttentionRows: position " + std::to_string(pos[s]) + " is outside the cache of " +
                  std::to_string(cache[2]) + " slots (or the rope tables' " + std::to_string(dims[2][0]) + ")");
    }
  }
  return nullptr;
}

// A run of rows of one stream: rows [first, first + count) read and write cache `stream`.
struct Run {
  int64_t stream, first, count;
};

// The runs of rows by stream (no stream_ids: all rows are stream 0 of a single cache); refuses a
// stream outside the N caches, and a stream whose rows are not one contiguous run.
OrtStatus* stream_runs(const int64_t* streams, const std::vector<int64_t>* ids_dims, int64_t rows, int64_t caches,
                       std::vector<Run>* runs) {
  runs->clear();
  if (streams == nullptr) {
    if (caches != 1) return fail("AttentionRows: " + std::to_string(caches) + " caches need stream_ids [1, S]");
    runs->push_back({0, 0, rows});
    return nullptr;
  }
  if (*ids_dims != std::vector<int64_t>{1, rows}) {
    return fail("AttentionRows: stream_ids " + shape_text(*ids_dims) + " must be [1, " + std::to_string(rows) + "]");
  }
  std::vector<char> seen(static_cast<size_t>(caches), 0);
  for (int64_t s = 0; s < rows; ++s) {
    const int64_t b = streams[s];
    if (b < 0 || b >= caches) {
      return fail("AttentionRows: stream " + std::to_string(b) + " is outside the " + std::to_string(caches) + " caches");
    }
    if (!runs->empty() && runs->back().stream == b) {
      ++runs->back().count;
      continue;
    }
    if (seen[static_cast<size_t>(b)]) {
      return fail("AttentionRows: the rows of stream " + std::to_string(b) + " are not one contiguous run");
    }
    seen[static_cast<size_t>(b)] = 1;
    runs->push_back({b, s, 1});
  }
  return nullptr;
}

// Every stream's rows (a pass each): the cache writes, then the three steps of attention.h, each step
// one set of tasks on the intra-op pool for all the streams.
OrtStatus* run_passes(OrtKernelContext* ctx, const Kernel& kn, const std::vector<AttentionPass>& passes) {
  for (const AttentionPass& pass : passes) kn.isa->write(pass);  // every row's entries before any row reads them
  const int64_t d = kn.head_dim, kv = kn.kv_heads, group = kn.heads / kn.kv_heads;
  size_t q_size = 0, score_size = 0, query_count = 0;
  for (const AttentionPass& pass : passes) {
    const int64_t queries = pass.rows * group;
    q_size += static_cast<size_t>(kv * queries * d);
    score_size += static_cast<size_t>(kv * queries * pass.stride);
    query_count += static_cast<size_t>(kv * queries);
  }
  std::lock_guard<std::mutex> hold(g_scratch.lock);
  Scratch& scratch = g_scratch.scratch;
  float *q = fit(&scratch.q, q_size), *scores = fit(&scratch.scores, score_size);
  float* sums = fit(&scratch.sums, query_count);
  int64_t* limits = fit(&scratch.limits, query_count);
  int64_t* starts = fit(&scratch.starts, query_count);
  std::vector<Job> jobs;
  for (const AttentionPass& pass : passes) {
    const int64_t queries = pass.rows * group;
    for (int64_t g = 0; g < kv; ++g) {
      kn.isa->prepare(pass, g, q + g * queries * d, limits + g * queries, starts + g * queries);
    }
    const int64_t last = *std::max_element(pass.pos, pass.pos + pass.rows) + 1;
    const int64_t dims = task_span(kn.isa->dims, d), span = task_span(kn.isa->queries, queries);
    const int64_t dim_tasks = (d + dims - 1) / dims, weigh_tasks = dim_tasks * ((queries + span - 1) / span);
    Job job{pass, kn.isa, queries, (last + kSlotBlock - 1) / kSlotBlock, 0, dims, span, dim_tasks, weigh_tasks,
            q, limits, scores, sums, starts, 0, 0, 0};
    common_gap(pass, starts, queries, &job.gap0, &job.gap1);
    job.seen = std::min(job.blocks, job.gap0 / kSlotBlock);
    job.chunks = score_chunks(job.seen) + score_chunks(std::max<int64_t>(job.blocks - job.gap1 / kSlotBlock, 0));
    jobs.push_back(job);
    q += kv * queries * d;
    limits += kv * queries;
    starts += kv * queries;
    scores += kv * queries * pass.stride;
    sums += kv * queries;
  }
  const Step steps[] = {
      Step(jobs, score_task, [](const Job& j) { return j.pass.kv_heads * j.chunks; }),
      Step(jobs, softmax_task, [](const Job& j) { return j.pass.kv_heads * j.queries; }),
      Step(jobs, weigh_task, [](const Job& j) { return j.pass.kv_heads * j.weigh_tasks; })};
  for (const Step& step : steps) {
    RETURN_IF(g_api->KernelContext_ParallelFor(ctx, step_task, step.total(), 0, const_cast<Step*>(&step)));
  }
  return nullptr;
}

// stream_ids (input 6), where the graph gives it: its data and dimensions, else nullptr.
OrtStatus* stream_ids(OrtKernelContext* ctx, const int64_t** ids, std::vector<int64_t>* dims) {
  *ids = nullptr;
  size_t count = 0;
  RETURN_IF(g_api->KernelContext_GetInputCount(ctx, &count));
  if (count < 7) return nullptr;
  const OrtValue* value = nullptr;
  RETURN_IF(g_api->KernelContext_GetInput(ctx, 6, &value));
  if (value == nullptr) return nullptr;  // the graph leaves the optional input out
  const void* data = nullptr;
  RETURN_IF(tensor_data(ctx, 6, &data, dims));
  *ids = static_cast<const int64_t*>(data);
  return nullptr;
}

OrtStatus* ORT_API_CALL compute(void* state, OrtKernelContext* ctx) {
  const Kernel& kn = *static_cast<const Kernel*>(state);
  const void* ptr[6];
  std::vector<int64_t> dims[7];
  for (size_t i = 0; i < 6; ++i) RETURN_IF(tensor_data(ctx, i, &ptr[i], &dims[i]));
  const int64_t* pos = static_cast<const int64_t*>(ptr[1]);
  RETURN_IF(check_inputs(kn, dims, pos));
  const int64_t* streams = nullptr;
  RETURN_IF(stream_ids(ctx, &streams, &dims[6]));
  const int64_t rows = dims[0][1], d = kn.head_dim, caches = dims[4][0], slots = dims[4][2];
  std::vector<Run> runs;
  RETURN_IF(stream_runs(streams, &dims[6], rows, caches, &runs));
  void* out[3];
  RETURN_IF(output(ctx, 0, {1, rows, kn.heads * d}, &out[0]));
  const int64_t cache_size = kn.kv_heads * slots * d;  // float16 numbers of one stream's cache
  for (size_t i = 1; i < 3; ++i) {
    RETURN_IF(output(ctx, i, dims[3 + i], &out[i]));
    if (out[i] != ptr[3 + i]) {  // not bound in place: the present buffer starts as the past one
      std::memcpy(out[i], ptr[3 + i], static_cast<size_t>(caches * cache_size) * sizeof(uint16_t));
    }
  }
  if (rows == 0) return nullptr;
  const int64_t width = (kn.heads + 2 * kn.kv_heads) * d;
  std::vector<AttentionPass> passes;
  for (const Run& run : runs) {
    const int64_t last = *std::max_element(pos + run.first, pos + run.first + run.count) + 1;  // slots read
    passes.push_back({static_cast<const float*>(ptr[0]) + run.first * width, pos + run.first,
                      static_cast<const float*>(ptr[2]), static_cast<const float*>(ptr[3]),
                      static_cast<uint16_t*>(out[1]) + run.stream * cache_size,
                      static_cast<uint16_t*>(out[2]) + run.stream * cache_size,
                      static_cast<float*>(out[0]) + run.first * kn.heads * d, run.count, kn.heads, kn.kv_heads, d,
                      slots, kn.scale, (last + kSlotBlock - 1) / kSlotBlock * kSlotBlock, kn.sink, kn.window});
  }
  return run_passes(ctx, kn, passes);
}

OrtStatus* set_output(OrtShapeInferContext* ctx, size_t index, ONNXTensorElementDataType type,
                      const std::vector<int64_t>& dims, const std::vector<std::string>& names) {
  std::vector<const char*> symbolic;
  for (const auto& name : names) symbolic.push_back(name.c_str());
  OrtTensorTypeAndShapeInfo* out = nullptr;
  RETURN_IF(g_api->CreateTensorTypeAndShapeInfo(&out));
  OrtStatus* st = g_api->SetTensorElementType(out, type);
  if (st == nullptr) st = g_api->SetDimensions(out, dims.data(), dims.size());
  if (st == nullptr) st = g_api->SetSymbolicDimensions(out, symbolic.data(), symbolic.size());
  if (st == nullptr) st = g_api->ShapeInferContext_SetOutputTypeShape(ctx, index, out);
  g_api->ReleaseTensorTypeAndShapeInfo(out);
  return st;
}

OrtStatus* input_shape(OrtShapeInferContext* ctx, size_t index, std::vector<int64_t>* dims,
                       std::vector<std::string>* names) {
  OrtTensorTypeAndShapeInfo* in = nullptr;
  RETURN_IF(g_api->ShapeInferContext_GetInputTypeShape(ctx, index, &in));
  size_t count = 0;
  must(g_api->GetDimensionsCount(in, &count));
  dims->assign(count, 0);
  std::vector<const char*> borrowed(count);
  must(g_api->GetDimensions(in, dims->data(), count));
  must(g_api->GetSymbolicDimensions(in, borrowed.data(), count));
  names->assign(borrowed.begin(), borrowed.end());  // copied: `in` stays ONNX Runtime's
  return nullptr;
}

OrtStatus* ORT_API_CALL infer_shape(const OrtCustomOp*, OrtShapeInferContext* ctx) {
  // attn: qkv's shape with the last dimension num_heads * head_dim; present_*: the past buffers' shapes
  std::vector<int64_t> dims;
  std::vector<std::string> names;
  RETURN_IF(input_shape(ctx, 0, &dims, &names));
  if (dims.empty()) return fail("AttentionRows: qkv has no dimensions");
  int64_t heads = 0, head_dim = 0;
  size_t size = 0;
  const OrtOpAttr* attr = nullptr;
  RETURN_IF(g_api->ShapeInferContext_GetAttribute(ctx, "num_heads", &attr));
  RETURN_IF(g_api->ReadOpAttr(attr, ORT_OP_ATTR_INT, &heads, sizeof(int64_t), &size));
  RETURN_IF(g_api->ShapeInferContext_GetAttribute(ctx, "head_dim", &attr));
  RETURN_IF(g_api->ReadOpAttr(attr, ORT_OP_ATTR_INT, &head_dim, sizeof(int64_t), &size));
  dims.back() = heads * head_dim;
  names.back().clear();
  RETURN_IF(set_output(ctx, 0, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, dims, names));
  for (size_t i = 1; i < 3; ++i) {
    RETURN_IF(input_shape(ctx, 3 + i, &dims, &names));
    RETURN_IF(set_output(ctx, i, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, dims, names));
  }
  return nullptr;
}

ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp*, size_t i) {
  if (i == 1 || i == 6) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  return i >= 4 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp*, size_t i) {
  return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
}

OrtCustomOp make_op() {
  OrtCustomOp op = cpu_op();
  op.GetName = [](const OrtCustomOp*) { return kOpName; };
  op.GetInputType = input_type;
  op.GetInputTypeCount = [](const OrtCustomOp*) -> size_t { return 7; };
  op.GetInputCharacteristic = [](const OrtCustomOp*, size_t i) {
    return i == 6 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;  // stream_ids: graphs of several streams
  };
  op.GetOutputType = output_type;
  op.GetOutputTypeCount = [](const OrtCustomOp*) -> size_t { return 3; };
  op.KernelDestroy = [](void* k) { delete static_cast<Kernel*>(k); };
  op.CreateKernelV2 = create_kernel;
  op.KernelComputeV2 = compute;
  op.InferOutputShapeFn = infer_shape;
  return op;
}

}  // namespace

OrtCustomOp* specedge::attention_op(int64_t sink, int64_t window) {
  // One op per window asked for, kept for the process (as ONNX Runtime keeps the domains holding them).
  static std::mutex lock;
  static std::vector<WindowedOp*> ops;
  std::lock_guard<std::mutex> hold(lock);
  for (WindowedOp* op : ops) {
    if (op->sink == sink && op->window == window) return op;
  }
  WindowedOp* op = new WindowedOp();
  static_cast<OrtCustomOp&>(*op) = make_op();
  op->sink = sink;
  op->window = window;
  ops.push_back(op);
  return op;
}

extern "C" {

// The instruction set the attention would use here ("" if SPECEDGE_ATTENTION_ISA names none this CPU runs).
__attribute__((visibility("default"))) const char* specedge_attention_isa() {
  const AttentionIsa* isa = pick_attention_isa(std::getenv(kIsaEnv));
  return isa != nullptr ? isa->name : "";
}

// Every instruction set this CPU runs the attention on, comma-separated, best first.
__attribute__((visibility("default"))) const char* specedge_attention_isas() {
  static const std::string names = [] {
    AttentionIsa isas[3];
    return isa_names(isas, available_attention_isas(isas, 3));
  }();
  return names.c_str();
}

}  // extern "C"
