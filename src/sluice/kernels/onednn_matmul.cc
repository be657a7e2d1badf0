#include "sluice/kernels/onednn_matmul.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "sluice/core/error.h"
#include "sluice/kernels/onednn_runtime.h"
#include "sluice/kernels/unary.h"

namespace sluice::kernels {

namespace {

using dt = dnnl::memory::data_type;

// Everything a primitive depends on (pointers excluded: a primitive runs on any buffers): the
// product and the OpenMP threads it runs on, SetOneDnnThreads' count (onednn_runtime.h's
// OneDnnCache says why), so that the scratchpad a caller asks for is the one of the primitive
// that runs, made for the threads that run it.
struct Key {
  OneDnnGemmShape s;
  int threads;
  auto Tie() const {
    return std::tie(threads, s.dtype, s.transpose_a, s.transpose_b, s.m, s.n, s.k, s.lda, s.ldb,
                    s.ldc, s.accumulate, s.bias, s.gelu);
  }
  bool operator<(const Key& o) const { return Tie() < o.Tie(); }
};

dt DataType(DType t) {
  switch (t) {
    case DType::kF32:
      return dt::f32;
    case DType::kBF16:
      return dt::bf16;
    default:
      throw InternalError(fmt::format("oneDNN matmul takes f32 or bf16 operands, not {}", Name(t)));
  }
}

// The shape with its strides filled in.
OneDnnGemmShape Packed(OneDnnGemmShape s) {
  if (s.lda == 0) s.lda = s.transpose_a ? s.m : s.k;
  if (s.ldb == 0) s.ldb = s.transpose_b ? s.k : s.n;
  if (s.ldc == 0) s.ldc = s.n;
  return s;
}

std::string Describe(const OneDnnGemmShape& s) {
  return fmt::format("{} matmul m={} n={} k={}{}{} (lda {}, ldb {}, ldc {}){}{}{}", Name(s.dtype),
                     s.m, s.n, s.k, s.transpose_a ? " a transposed" : "",
                     s.transpose_b ? " b transposed" : "", s.lda, s.ldb, s.ldc,
                     s.accumulate ? " accumulating" : "", s.bias ? " + bias" : "",
                     s.gelu ? " then gelu" : "");
}

// A made primitive and its description (the memory descriptors its buffers are wrapped in).
struct Entry {
  dnnl::matmul::primitive_desc desc;
  dnnl::matmul primitive;
};

// Never destroyed: kernels may run during static teardown.
OneDnnCache<Key, Entry>& GlobalCache() {
  static auto* cache = new OneDnnCache<Key, Entry>();
  return *cache;
}

dnnl::matmul::primitive_desc MakeDesc(const OneDnnGemmShape& s, const dnnl::engine& engine) {
  using dims = dnnl::memory::dims;
  const dt in = DataType(s.dtype);
  // Logical [m, k] · [k, n]; a transposed operand is the same matrix read with swapped strides.
  const dnnl::memory::desc a(dims{s.m, s.k}, in, s.transpose_a ? dims{1, s.lda} : dims{s.lda, 1});
  const dnnl::memory::desc b(dims{s.k, s.n}, in, s.transpose_b ? dims{1, s.ldb} : dims{s.ldb, 1});
  const dnnl::memory::desc c(dims{s.m, s.n}, dt::f32, dims{s.ldc, 1});
  dnnl::primitive_attr attr;
  // The cache's primitives run on every stage thread, at once. With the library's scratchpad (the
  // default) a primitive must run on the thread that made it: two stages running one shape shared
  // one scratchpad and their results differed run to run, or were NaN. Each call brings its own.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (s.accumulate) ops.append_sum(1.0f);
  if (s.gelu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
  attr.set_post_ops(ops);
  if (s.bias) {
    const dnnl::memory::desc bias(dims{1, s.n}, dt::f32, dims{s.n, 1});
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, bias, c), attr, engine);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine);
}

std::shared_ptr<const Entry> Primitive(const OneDnnGemmShape& s, int threads) {
  return GlobalCache().Get(Key{s, threads}, threads, [&] {
    try {
      dnnl::matmul::primitive_desc desc = MakeDesc(s, OneDnnEngine());
      dnnl::matmul primitive(desc);
      return std::make_shared<const Entry>(Entry{std::move(desc), std::move(primitive)});
    } catch (const dnnl::error& e) {
      throw InternalError(fmt::format("oneDNN cannot make the {}: {}", Describe(s), e.what()));
    }
  });
}

std::atomic<int> g_threads{1};
std::atomic<bool> g_size_for_sleeping_workers{false};

}  // namespace

const dnnl::engine& OneDnnEngine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

int OneDnnThreads() { return g_threads.load(std::memory_order_relaxed); }

dnnl::stream& OneDnnThreadStream(int threads) {
  // OpenMP's thread count is per calling thread: set it on this one when the setting changed.
  thread_local int applied = 0;
  if (applied != threads) {
    omp_set_num_threads(threads);
    applied = threads;
  }
  thread_local dnnl::stream stream(OneDnnEngine());
  return stream;
}

// The calling thread's scratchpad for oneDNN's primitives, grown to the largest one asked for
// (the primitives of one thread run one at a time).
void* OneDnnThreadScratchpad(size_t bytes) {
  struct Free {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  thread_local std::unique_ptr<std::byte[], Free> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    buffer.reset();
    buffer.reset(static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{64})));
    capacity = bytes;
  }
  return buffer.get();
}

int64_t OneDnnScratchpadBytes(const OneDnnGemmShape& shape) {
  const OneDnnGemmShape s = Packed(shape);
  if (s.m == 0 || s.n == 0 || s.k == 0) return 0;
  return static_cast<int64_t>(Primitive(s, OneDnnThreads())->desc.scratchpad_desc().get_size());
}

void OneDnnGemm(const OneDnnGemmShape& shape, const void* a, const void* b, float* c,
                const float* bias, void* scratchpad) {
  const OneDnnGemmShape s = Packed(shape);
  if (s.bias != (bias != nullptr)) {
    throw InternalError(fmt::format("the {} was given {} bias", Describe(s),
                                    bias == nullptr ? "no" : "an unasked"));
  }
  if (s.accumulate && (s.bias || s.gelu)) {
    throw InternalError(
        fmt::format("the {}: an epilogue does not combine with accumulate", Describe(s)));
  }
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {
    if (s.accumulate) return;
    for (int64_t i = 0; i < s.m; ++i) {
      float* row = c + i * s.ldc;
      if (s.bias) {
        std::copy_n(bias, s.n, row);
      } else {
        std::fill_n(row, s.n, 0.0f);
      }
      if (s.gelu) GeluReference<float>(row, row, s.n);
    }
    return;
  }
  const int threads = OneDnnThreads();
  const std::shared_ptr<const Entry> entry = Primitive(s, threads);
  dnnl::stream& stream = OneDnnThreadStream(threads);
  const dnnl::engine& engine = OneDnnEngine();
  try {
    // oneDNN's memory objects take non-const pointers; a and b are only read.
    dnnl::memory ma(entry->desc.src_desc(), engine, const_cast<void*>(a));
    dnnl::memory mb(entry->desc.weights_desc(), engine, const_cast<void*>(b));
    dnnl::memory mc(entry->desc.dst_desc(), engine, c);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    const dnnl::memory::desc scratchpad_desc = entry->desc.scratchpad_desc();
    if (const size_t bytes = scratchpad_desc.get_size(); bytes > 0) {
      args.emplace(
          DNNL_ARG_SCRATCHPAD,
          dnnl::memory(scratchpad_desc, engine,
                       scratchpad != nullptr ? scratchpad : OneDnnThreadScratchpad(bytes)));
    }
    if (s.bias) {
      args.emplace(DNNL_ARG_BIAS,
                   dnnl::memory(entry->desc.bias_desc(), engine, const_cast<float*>(bias)));
    }
    entry->primitive.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    throw InternalError(fmt::format("oneDNN failed running the {}: {}", Describe(s), e.what()));
  }
}

void SetOneDnnThreads(int threads) {
  // libgomp reads OMP_WAIT_POLICY once, when it loads; unset, its workers spin after every
  // primitive (on AMX's long `pause` the spin alone cost 10x a 2-thread bf16 step's CPU time:
  // docs/benchmarks.md, "bf16 on AMX"), so then the primitives run on the calling thread only.
  static const bool wait_policy_set = std::getenv("OMP_WAIT_POLICY") != nullptr;
  const bool sleeping = wait_policy_set || g_size_for_sleeping_workers.load();
  g_threads.store(sleeping ? std::max(threads, 1) : 1);
}

void SizeOneDnnForSleepingWorkers() { g_size_for_sleeping_workers.store(true); }

bool OneDnnBf16Native() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16) == bf16;
}

std::string OneDnnImplementation(DType dtype, int64_t m, int64_t n, int64_t k) {
  return OneDnnImplementation({.dtype = dtype, .m = m, .n = n, .k = k});
}

std::string OneDnnImplementation(const OneDnnGemmShape& shape) {
  const OneDnnGemmShape s = Packed(shape);
  try {
    return MakeDesc(s, OneDnnEngine()).impl_info_str();
  } catch (const dnnl::error& e) {
    throw InternalError(fmt::format("oneDNN cannot make the {}: {}", Describe(s), e.what()));
  }
}

int64_t OneDnnCachedPrimitives() { return GlobalCache().size(); }

}  // namespace sluice::kernels
