#include "sluice/kernels/onednn_conv.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/kernels/onednn_runtime.h"

namespace sluice::kernels {

namespace {

using dims = dnnl::memory::dims;
using tag = dnnl::memory::format_tag;
constexpr auto kF32 = dnnl::memory::data_type::f32;

// Everything a chunk's primitives depend on: the pass, the chunk's images, the convolution and the
// OpenMP threads it runs on — a primitive divides its work for the threads OpenMP offers when it
// is made: run on fewer, its threads wait at barriers for ones that never come (the ResNet-8's
// weight gradients took 7.5 ms a call instead of 0.06); on more, two threads do one part (a
// race). SetOneDnnThreads' count, but 1 for the weight gradient, whose threads meet at a
// spinning barrier to add their parts — on a loaded machine a thread waiting there for one without
// a core spun 10 ms a call (ResNet-8's 16-channel layers, 2 threads, load 11), where the whole
// call takes 0.06 ms on one thread.
struct Key {
  Conv2dPass pass;
  int64_t images;
  Conv2dDims d;
  int threads;
  auto Tie() const {
    return std::tie(threads, pass, images, d.channels, d.height, d.width, d.out_channels,
                    d.kernel_h, d.kernel_w, d.stride_h, d.stride_w, d.pad_h, d.pad_w, d.groups,
                    d.dilation_h, d.dilation_w);
  }
  bool operator<(const Key& o) const { return Tie() < o.Tie(); }
};

int ThreadsFor(Conv2dPass pass) { return pass == Conv2dPass::kGradWeight ? 1 : OneDnnThreads(); }

const char* PassName(Conv2dPass pass) {
  switch (pass) {
    case Conv2dPass::kForward:
      return "convolution";
    case Conv2dPass::kGradInput:
      return "convolution's input gradient";
    case Conv2dPass::kGradWeight:
      return "convolution's weight gradient";
  }
  return "?";
}

std::string Describe(const Key& k) {
  const Conv2dDims& d = k.d;
  return fmt::format(
      "f32 {} of {} images [{}, {}, {}] by {}x{} filters to {} channels (stride "
      "[{}, {}], padding [{}, {}], dilation [{}, {}], {} groups)",
      PassName(k.pass), k.images, d.channels, d.height, d.width, d.kernel_h, d.kernel_w,
      d.out_channels, d.stride_h, d.stride_w, d.pad_h, d.pad_w, d.dilation_h, d.dilation_w,
      d.groups);
}

int64_t Align64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

// One operand of the primitive: its plain layout (a chunk of sluice's tensor) and, where the
// primitive wants another, the reorder between the two and the blocked buffer's place in the
// scratch.
struct Operand {
  int arg = 0;  // DNNL_ARG_*
  bool output = false;
  bool per_chunk = true;  // false: the weights (or their gradient), the same for every chunk
  dnnl::memory::desc plain, blocked;
  std::optional<dnnl::reorder> reorder;  // plain → blocked for inputs, blocked → plain for outputs
  int64_t offset = 0;                    // of the blocked buffer in the scratch
};

struct Entry {
  dnnl::primitive primitive;
  std::string implementation;
  std::vector<Operand> operands;  // inputs, then the output
  int64_t scratchpad_offset = 0, scratchpad_bytes = 0;
  int64_t partial_offset = 0;  // the weight gradient: a chunk's, plain, added into dw
  int64_t bytes = 0;           // the whole scratch
};

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  // Each call brings its scratchpad (onednn_matmul.cc says why the library's shared one is not
  // used), here a part of the caller's scratch: counted by the memory forecast.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

std::shared_ptr<const Entry> Make(const Key& k) {
  const Conv2dDims& d = k.d;
  const dnnl::engine& engine = OneDnnEngine();
  const dims x{k.images, d.channels, d.height, d.width};
  // Grouped filters are oneDNN's [G, O/G, C/G, KH, KW], the same bytes as sluice's [O, C/G, KH,
  // KW].
  const dims w = d.groups == 1 ? dims{d.out_channels, d.channels, d.kernel_h, d.kernel_w}
                               : dims{d.groups, d.out_channels / d.groups, Conv2dGroupChannels(d),
                                      d.kernel_h, d.kernel_w};
  const tag w_tag = d.groups == 1 ? tag::oihw : tag::goihw;
  const dims y{k.images, d.out_channels, d.out_h, d.out_w};
  const dims strides{d.stride_h, d.stride_w}, padding{d.pad_h, d.pad_w};
  // oneDNN counts dilation from 0 (taps next to each other), sluice and PyTorch from 1.
  const dims dilates{d.dilation_h - 1, d.dilation_w - 1};
  // oneDNN's right padding: what makes its output size the floor formula's (conv.h) exactly.
  const dims padding_r{
      (d.out_h - 1) * d.stride_h + d.dilation_h * (d.kernel_h - 1) + 1 - d.height - d.pad_h,
      (d.out_w - 1) * d.stride_w + d.dilation_w * (d.kernel_w - 1) + 1 - d.width - d.pad_w};
  const dnnl::memory::desc any_x(x, kF32, tag::any), any_w(w, kF32, tag::any),
      any_y(y, kF32, tag::any);
  const dnnl::memory::desc plain_x(x, kF32, tag::nchw), plain_w(w, kF32, w_tag),
      plain_y(y, kF32, tag::nchw);
  const dnnl::primitive_attr attr = UserScratchpad();
  const dnnl::convolution_forward::primitive_desc forward(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                      dnnl::algorithm::convolution_direct, any_x, any_w, any_y,
                                      strides, dilates, padding, padding_r),
      attr, engine);
  auto entry = std::make_shared<Entry>();
  dnnl::memory::desc scratchpad;
  switch (k.pass) {
    case Conv2dPass::kForward:
      entry->primitive = dnnl::convolution_forward(forward);
      entry->implementation = forward.impl_info_str();
      scratchpad = forward.scratchpad_desc();
      entry->operands = {{DNNL_ARG_SRC, false, true, plain_x, forward.src_desc()},
                         {DNNL_ARG_WEIGHTS, false, false, plain_w, forward.weights_desc()},
                         {DNNL_ARG_DST, true, true, plain_y, forward.dst_desc()}};
      break;
    case Conv2dPass::kGradInput: {
      const dnnl::convolution_backward_data::primitive_desc data(
          dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, any_x, any_w,
                                                any_y, strides, dilates, padding, padding_r),
          attr, engine, forward);
      entry->primitive = dnnl::convolution_backward_data(data);
      entry->implementation = data.impl_info_str();
      scratchpad = data.scratchpad_desc();
      entry->operands = {{DNNL_ARG_DIFF_DST, false, true, plain_y, data.diff_dst_desc()},
                         {DNNL_ARG_WEIGHTS, false, false, plain_w, data.weights_desc()},
                         {DNNL_ARG_DIFF_SRC, true, true, plain_x, data.diff_src_desc()}};
      break;
    }
    case Conv2dPass::kGradWeight: {
      const dnnl::convolution_backward_weights::primitive_desc weights(
          dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any_x,
                                                   any_w, any_y, strides, dilates, padding,
                                                   padding_r),
          attr, engine, forward);
      entry->primitive = dnnl::convolution_backward_weights(weights);
      entry->implementation = weights.impl_info_str();
      scratchpad = weights.scratchpad_desc();
      entry->operands = {
          {DNNL_ARG_DIFF_DST, false, true, plain_y, weights.diff_dst_desc()},
          {DNNL_ARG_SRC, false, true, plain_x, weights.src_desc()},
          {DNNL_ARG_DIFF_WEIGHTS, true, false, plain_w, weights.diff_weights_desc()}};
      break;
    }
  }
  int64_t at = 0;
  int64_t scratchpad_bytes = static_cast<int64_t>(scratchpad.get_size());
  for (Operand& op : entry->operands) {
    if (op.plain == op.blocked) continue;
    const auto& [from, to] =
        op.output ? std::pair(op.blocked, op.plain) : std::pair(op.plain, op.blocked);
    const dnnl::reorder::primitive_desc reorder(engine, from, engine, to, attr);
    scratchpad_bytes =
        std::max(scratchpad_bytes, static_cast<int64_t>(reorder.scratchpad_desc().get_size()));
    op.reorder = dnnl::reorder(reorder);
    op.offset = at;
    at += Align64(static_cast<int64_t>(op.blocked.get_size()));
  }
  if (k.pass == Conv2dPass::kGradWeight) {
    entry->partial_offset = at;
    at += Align64(static_cast<int64_t>(plain_w.get_size()));
  }
  entry->scratchpad_offset = at;
  entry->scratchpad_bytes = scratchpad_bytes;
  entry->bytes = at + Align64(scratchpad_bytes);
  return entry;
}

std::shared_ptr<const Entry> Primitives(const Key& k) {
  static auto* cache = new OneDnnCache<Key, Entry>();  // never destroyed, as onednn_matmul.cc's
  return cache->Get(k, k.threads, [&]() -> std::shared_ptr<const Entry> {
    try {
      return Make(k);
    } catch (const dnnl::error& e) {
      throw InternalError(fmt::format("oneDNN cannot make the {}: {}", Describe(k), e.what()));
    }
  });
}

// The chunks of the batch: full chunks of OneDnnConvImages(d) images and the remainder.
std::vector<int64_t> ChunkSizes(const Conv2dDims& d) {
  const int64_t n = OneDnnConvImages(d);
  std::vector<int64_t> sizes(static_cast<size_t>(d.batch / n), n);
  if (d.batch % n != 0) sizes.push_back(d.batch % n);
  return sizes;
}

// A plain buffer of sluice's for each of the entry's operands, in its order.
struct PlainOperand {
  float* data;
  int64_t per_image;  // elements an image; 0 for the weights and their gradient
};

// Runs `pass` over the batch, chunk after chunk.
void Run(Conv2dPass pass, const Conv2dDims& d, const std::vector<PlainOperand>& plain,
         void* scratch) {
  if (d.batch == 0) return;
  std::byte* base = static_cast<std::byte*>(scratch);
  const int threads = ThreadsFor(pass);
  dnnl::stream& stream = OneDnnThreadStream(threads);
  const dnnl::engine& engine = OneDnnEngine();
  const Entry* previous = nullptr;
  int64_t image = 0;
  std::optional<Key> key;
  try {
    for (const int64_t images : ChunkSizes(d)) {
      key = Key{pass, images, d, threads};
      const std::shared_ptr<const Entry> entry = Primitives(*key);
      std::unordered_map<int, dnnl::memory> reorder_args;  // the scratchpad, where there is one
      if (entry->scratchpad_bytes > 0) {
        reorder_args.emplace(DNNL_ARG_SCRATCHPAD,
                             dnnl::memory(dnnl::memory::desc({entry->scratchpad_bytes},
                                                             dnnl::memory::data_type::u8, tag::a),
                                          engine, base + entry->scratchpad_offset));
      }
      auto reorder = [&](const dnnl::reorder& r, const dnnl::memory& from, const dnnl::memory& to) {
        std::unordered_map<int, dnnl::memory> args = reorder_args;
        args.emplace(DNNL_ARG_FROM, from);
        args.emplace(DNNL_ARG_TO, to);
        r.execute(stream, args);
      };
      std::unordered_map<int, dnnl::memory> args = reorder_args;
      const Operand* output = nullptr;
      dnnl::memory output_blocked, output_user;
      float* partial = nullptr;
      for (size_t i = 0; i < entry->operands.size(); ++i) {
        const Operand& op = entry->operands[i];
        float* data = plain[i].data + image * plain[i].per_image;
        // The weight gradient of a later chunk goes to the partial buffer, then is added to dw.
        if (op.output && !op.per_chunk && image > 0) {
          partial = reinterpret_cast<float*>(base + entry->partial_offset);
          data = partial;
        }
        const dnnl::memory user(op.plain, engine, data);
        if (!op.reorder) {
          args.emplace(op.arg, user);
          continue;
        }
        const dnnl::memory blocked(op.blocked, engine, base + op.offset);
        args.emplace(op.arg, blocked);
        if (op.output) {
          output = &op;
          output_blocked = blocked;
          output_user = user;
        } else if (op.per_chunk || entry.get() != previous) {  // the weights: once an entry
          reorder(*op.reorder, user, blocked);
        }
      }
      entry->primitive.execute(stream, args);
      if (output != nullptr) reorder(*output->reorder, output_blocked, output_user);
      stream.wait();
      if (partial != nullptr) {
        float* dw = plain.back().data;
        const int64_t n = d.out_channels * Conv2dGroupChannels(d) * d.kernel_h * d.kernel_w;
        for (int64_t i = 0; i < n; ++i) dw[i] += partial[i];
      }
      previous = entry.get();
      image += images;
    }
  } catch (const dnnl::error& e) {
    throw InternalError(fmt::format("oneDNN failed running the {}: {}", Describe(*key), e.what()));
  }
}

}  // namespace

const char* Fp32ConvEngineName() {
  static const char* engine = [] {
    const char* env = std::getenv("SLUICE_CONV");
    if (env == nullptr || std::string_view(env) == "onednn") return "onednn";
    if (std::string_view(env) == "im2col") return "im2col";
    throw InvalidArgument(
        fmt::format("SLUICE_CONV='{}': the f32 convolution engine is onednn or im2col", env));
  }();
  return engine;
}

bool OneDnnConvolves(const Conv2dDims& d) {
  static const bool on_onednn = std::string_view(Fp32ConvEngineName()) == "onednn";
  if (!on_onednn) return false;
  // Grouped convolutions go to oneDNN whatever their window and channels: im2col runs a GEMM per
  // group of C/G channels (one, for a depthwise convolution), mostly overhead.
  if (d.groups == 1 && (d.kernel_h * d.kernel_w == 1 || d.channels < 16 || d.out_channels < 16)) {
    return false;
  }
  // The blocked weights and weight gradients are the scratch's bulk when the batch is small: a
  // convolution whose scratch would outgrow its own input and output stays on im2col, whose
  // block is bounded by its input. The weight gradient's primitives run on one thread, so the
  // choice depends on the shape alone.
  const int64_t activations =
      d.batch * (d.channels * d.height * d.width + d.out_channels * d.out_h * d.out_w);
  return OneDnnConvScratchBytes(d, Conv2dPass::kGradWeight) <= activations * int64_t{sizeof(float)};
}

int64_t OneDnnConvImages(const Conv2dDims& d) {
  const int64_t per_image = d.channels * d.height * d.width + d.out_channels * d.out_h * d.out_w;
  return std::clamp<int64_t>(kConv2dColsBudget / std::max<int64_t>(1, per_image), 1,
                             std::max<int64_t>(1, d.batch));
}

int64_t OneDnnConvScratchBytes(const Conv2dDims& d, Conv2dPass pass) {
  int64_t bytes = 0;
  for (const int64_t images : ChunkSizes(d)) {
    bytes = std::max(bytes, Primitives(Key{pass, images, d, ThreadsFor(pass)})->bytes);
  }
  return bytes;
}

std::string OneDnnConvImplementation(const Conv2dDims& d, Conv2dPass pass) {
  return Primitives(Key{pass, OneDnnConvImages(d), d, ThreadsFor(pass)})->implementation;
}

void OneDnnConv2d(const float* x, const float* w, float* y, const Conv2dDims& d, void* scratch) {
  // oneDNN's memory objects take non-const pointers; inputs are only read.
  Run(Conv2dPass::kForward, d,
      {{const_cast<float*>(x), d.channels * d.height * d.width},
       {const_cast<float*>(w), 0},
       {y, d.out_channels * d.out_h * d.out_w}},
      scratch);
}

void OneDnnConv2dGradInput(const float* dy, const float* w, float* dx, const Conv2dDims& d,
                           void* scratch) {
  Run(Conv2dPass::kGradInput, d,
      {{const_cast<float*>(dy), d.out_channels * d.out_h * d.out_w},
       {const_cast<float*>(w), 0},
       {dx, d.channels * d.height * d.width}},
      scratch);
}

void OneDnnConv2dGradWeight(const float* dy, const float* x, float* dw, const Conv2dDims& d,
                            void* scratch) {
  if (d.batch == 0) {
    std::fill_n(dw, d.out_channels * Conv2dGroupChannels(d) * d.kernel_h * d.kernel_w, 0.0f);
    return;
  }
  Run(Conv2dPass::kGradWeight, d,
      {{const_cast<float*>(dy), d.out_channels * d.out_h * d.out_w},
       {const_cast<float*>(x), d.channels * d.height * d.width},
       {dw, 0}},
      scratch);
}

}  // namespace sluice::kernels
