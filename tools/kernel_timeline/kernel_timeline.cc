// A CUPTI injection library that writes every kernel's (and copy's) GPU start and end between
// cudaProfilerStart and cudaProfilerStop to a CSV: a timeline of a decode step's kernels (graph
// nodes one by one) where Nsight Systems is not installed.
//
//   CUDA_INJECTION64_PATH=build/gpu/tools/libsieve_kernel_timeline.so
//   SIEVE_TIMELINE_CSV=/tmp/step.csv ./build/gpu/sieve bench kernels ... --profile-step
//   (both variables in the environment of the one command)
//   scripts/timeline_gaps.py /tmp/step.csv
//
// The CUDA driver loads the library at cuInit and calls InitializeInjection. Kernel records are
// collected only inside the profiler range, so a benchmark's thousands of other steps cost
// nothing; the records are flushed and written when the range ends. CUPTI's kernel timestamps
// add a little to each kernel, so read the gaps against the step's untraced time.
//
// With SIEVE_TIMELINE_WHOLE=1 the range is the whole process instead (written at exit): how a
// program that never calls the profiler API spends its GPU time, e.g. `sieve serve` under a few
// requests, where the gaps between decode steps are the host's share of each step.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8u << 20;

struct KernelRecord {
  uint64_t start;
  uint64_t end;
  uint32_t graph_id;
  uint64_t graph_node_id;
  uint32_t stream_id;
  int32_t grid[3];
  int32_t block[3];
  uint32_t name;  // index into names: a whole run holds millions of records, of few kernels
};

std::mutex records_mutex;
std::vector<KernelRecord> records;
std::vector<std::string> names;
std::unordered_map<std::string, uint32_t> name_index;
bool tracing = false;

void Check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* message = nullptr;
  cuptiGetResultString(result, &message);
  std::fprintf(stderr, "kernel_timeline: %s failed: %s\n", what, message ? message : "?");
}

std::string Demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string text = status == 0 && plain != nullptr ? plain : name;
  std::free(plain);
  return text;
}

uint32_t NameIndex(const char* mangled) {
  const std::string key = mangled != nullptr ? mangled : "?";
  const auto [it, inserted] = name_index.try_emplace(key, static_cast<uint32_t>(names.size()));
  if (inserted) names.push_back(Demangle(mangled));
  return it->second;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(records_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      // Named as nsys names copies ("[CUDA memcpy Host-to-Device]"), with the size in bytes.
      const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      const char* direction = copy->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "Host-to-Device"
                              : copy->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "Device-to-Host"
                              : copy->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD
                                  ? "Device-to-Device"
                                  : "other";
      const std::string name = std::string("[CUDA memcpy ") + direction + "]";
      records.push_back({copy->start,
                         copy->end,
                         copy->graphId,
                         copy->graphNodeId,
                         copy->streamId,
                         {static_cast<int32_t>(copy->bytes), 0, 0},
                         {0, 0, 0},
                         NameIndex(name.c_str())});  // not a mangled name: kept as is
      continue;
    }
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
      continue;
    }
    const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    records.push_back({kernel->start,
                       kernel->end,
                       kernel->graphId,
                       kernel->graphNodeId,
                       kernel->streamId,
                       {kernel->gridX, kernel->gridY, kernel->gridZ},
                       {kernel->blockX, kernel->blockY, kernel->blockZ},
                       NameIndex(kernel->name)});
  }
  std::free(buffer);
}

// Columns named as in `nsys stats --report cuda_gpu_trace`, so timeline_gaps.py reads both.
void WriteCsv() {
  const char* path = std::getenv("SIEVE_TIMELINE_CSV");
  if (path == nullptr || *path == '\0') path = "kernel_timeline.csv";
  FILE* file = std::fopen(path, "w");
  if (file == nullptr) {
    std::fprintf(stderr, "kernel_timeline: cannot write %s\n", path);
    return;
  }
  std::lock_guard<std::mutex> lock(records_mutex);
  std::fprintf(file, "Start (ns),Duration (ns),Graph,Node,Stream,Grid,Block,Name\n");
  for (const KernelRecord& r : records) {
    std::string name = names[r.name];
    for (char& c : name) {
      if (c == '"') c = '\'';
    }
    std::fprintf(file, "%llu,%llu,%u,%llu,%u,%dx%dx%d,%dx%dx%d,\"%s\"\n",
                 static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end - r.start), r.graph_id,
                 static_cast<unsigned long long>(r.graph_node_id), r.stream_id, r.grid[0],
                 r.grid[1], r.grid[2], r.block[0], r.block[1], r.block[2], name.c_str());
  }
  std::fclose(file);
  std::fprintf(stderr, "kernel_timeline: %zu kernels written to %s\n", records.size(), path);
}

void CUPTIAPI OnRuntimeApi(void*, CUpti_CallbackDomain, CUpti_CallbackId id, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 &&
      info->callbackSite == CUPTI_API_EXIT && !tracing) {
    Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel records");
    Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable copy records");
    tracing = true;
  } else if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 &&
             info->callbackSite == CUPTI_API_ENTER && tracing) {
    Check(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disable kernel records");
    Check(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY), "disable copy records");
    Check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
    tracing = false;
    WriteCsv();
  }
}

void WriteWholeRun() {
  Check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
  WriteCsv();
}

bool WholeRun() {
  const char* whole = std::getenv("SIEVE_TIMELINE_WHOLE");
  return whole != nullptr && std::strcmp(whole, "1") == 0;
}

}  // namespace

extern "C" int InitializeInjection() {
  Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted), "register buffers");
  if (WholeRun()) {
    Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel records");
    Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable copy records");
    tracing = true;
    std::atexit(WriteWholeRun);
    return 1;
  }
  CUpti_SubscriberHandle subscriber;
  Check(cuptiSubscribe(&subscriber, OnRuntimeApi, nullptr), "subscribe");
  Check(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                            CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000),
        "callback on cudaProfilerStart");
  Check(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                            CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000),
        "callback on cudaProfilerStop");
  return 1;
}
