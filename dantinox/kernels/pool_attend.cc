// One new token per sequence attending over a shared pool of cache slots, each slot read where it lies.
//
// An XLA:CPU custom call (the XLA FFI), built by dantinox/pool_kernel.py with the machine's C++ compiler.
// A paged cache keeps every sequence's pages in one pool; attention through XLA either gathers each
// sequence's pages into a copy or scores every query against the whole pool and masks the rest. This
// kernel does neither: for each (sequence, KV head) it walks the pool in blocks of kBlock slots, skips every
// block the sequence's mask leaves empty, and folds the blocks it reads into a running softmax (the
// max-and-rescale recurrence of online softmax), so the bytes read are the sequence's own slots.
//
// Shapes (float32 unless named): q [B, K, G, H]; keys [R, K, H, S] (slot axis last, as the cache stores them)
// and values [R, K, S, H], in float32 or bfloat16 (widened as they are read), R = 1 for a pool all sequences
// share or R = B for one row each; mask [B, S] (bool); for int8 codes, key and value scales [R, K, S];
// out [B, K, G, H].
// A sequence that sees no slot gets zeros.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kBlock = 16;
constexpr int64_t kAheadRows = 4;  // key rows  // key rows (channels) read ahead
constexpr int64_t kAheadSlots = 8;  // value rows  // value rows (slots) read ahead


struct Bf16 {  // bfloat16 as stored: the high half of a float32
  uint16_t bits;
};

inline float value(float x) { return x; }
inline float value(int8_t x) { return static_cast<float>(x); }
inline float value(Bf16 x) {
  const uint32_t wide = static_cast<uint32_t>(x.bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof out);
  return out;
}

struct Problem {
  int64_t B, K, G, H, S, R;  // R: rows of keys and values, 1 (a pool every sequence reads) or B (one each)
  float scale;
  const float* q;
  const void* k;
  const void* v;
  const float* k_scale;  // null for float keys
  const float* v_scale;
  const bool* mask;
  float* out;
};

template <typename Code>
void one_pair(const Problem& p, int64_t pair) {
  const int64_t b = pair / p.K, kh = pair % p.K, G = p.G, H = p.H, S = p.S;
  const int64_t head = (p.R == 1 ? 0 : b) * p.K + kh;  // the cached head this pair reads
  const float* q = p.q + pair * G * H;
  const Code* keys = static_cast<const Code*>(p.k) + head * H * S;
  const Code* vals = static_cast<const Code*>(p.v) + head * S * H;
  const float* ks = p.k_scale ? p.k_scale + head * S : nullptr;
  const float* vs = p.v_scale ? p.v_scale + head * S : nullptr;
  const bool* mask = p.mask + b * S;
  float* out = p.out + pair * G * H;

  // The runs of consecutive blocks that hold a slot the mask lets this sequence see (its own pages in a pool).
  // Scratch kept per thread between calls: fresh allocations of a large pool's size would be fresh pages.
  thread_local std::vector<std::pair<int64_t, int64_t>> runs;
  thread_local std::vector<float> s;
  runs.clear();
  for (int64_t start = 0; start < S; start += kBlock) {
    const int64_t end = std::min(S, start + kBlock);
    if (std::none_of(mask + start, mask + end, [](bool m) { return m; })) continue;
    if (!runs.empty() && runs.back().second == start)
      runs.back().second = end;
    else
      runs.emplace_back(start, end);
  }
  if (runs.empty()) {
    std::fill(out, out + G * H, 0.0f);
    return;
  }
  // Scores of the G query heads, key row by key row: each row (one channel, slots in order) is read along its
  // length, once for all G heads, so the bytes stream in the order they are stored.
  s.resize(std::max<size_t>(s.size(), G * S));
  for (const auto& [start, end] : runs)
    for (int64_t g = 0; g < G; ++g) std::fill(s.begin() + g * S + start, s.begin() + g * S + end, 0.0f);
  constexpr int64_t kLine = 64 / sizeof(Code);
  int64_t h = 0;
  for (; h + 4 <= H; h += 4) {  // four key rows at a time: one load and store of a score per four products
    const Code *r0 = keys + h * S, *r1 = r0 + S, *r2 = r1 + S, *r3 = r2 + S;
    for (const auto& [start, end] : runs) {
      // The same slots kAheadRows key rows on: past a 4 KiB page the hardware's own prefetch stops.
      if (h + 4 + kAheadRows <= H)
        for (int64_t j = start; j < end; j += kLine)
          for (int64_t i = 0; i < 4; ++i) __builtin_prefetch(r0 + (kAheadRows + i) * S + j);
      for (int64_t g = 0; g < G; ++g) {
        const float* qg = q + g * H + h;
        const float q0 = qg[0], q1 = qg[1], q2 = qg[2], q3 = qg[3];
        float* sg = s.data() + g * S;
        for (int64_t j = start; j < end; ++j)
          sg[j] += q0 * value(r0[j]) + q1 * value(r1[j]) + q2 * value(r2[j]) + q3 * value(r3[j]);
      }
    }
  }
  for (; h < H; ++h) {
    const Code* row = keys + h * S;
    for (const auto& [start, end] : runs)
      for (int64_t g = 0; g < G; ++g) {
        const float qh = q[g * H + h];
        float* sg = s.data() + g * S;
        for (int64_t j = start; j < end; ++j) sg[j] += qh * value(row[j]);
      }
  }
  // Softmax over the seen slots (0 elsewhere), then the weighted sum of value rows, slot by slot.
  std::vector<float> acc(G * H, 0.0f), total(G, 0.0f);
  for (int64_t g = 0; g < G; ++g) {
    float* sg = s.data() + g * S;
    float top = -std::numeric_limits<float>::max();
    for (const auto& [start, end] : runs)
      for (int64_t j = start; j < end; ++j) {
        sg[j] *= p.scale * (ks ? ks[j] : 1.0f);
        if (mask[j]) top = std::max(top, sg[j]);
      }
    for (const auto& [start, end] : runs) {
      for (int64_t j = start; j < end; ++j) sg[j] = std::exp(sg[j] - top);  // a plain loop: vectorized
      for (int64_t j = start; j < end; ++j) {
        sg[j] = mask[j] ? sg[j] : 0.0f;
        total[g] += sg[j];
        if (vs) sg[j] *= vs[j];
      }
    }
  }
  for (int64_t g = 0; g < G; ++g) {  // one query head's sum at a time, four value rows at a time
    float* ag = acc.data() + g * H;
    const float* wg = s.data() + g * S;
    for (const auto& [start, end] : runs) {
      int64_t j = start;
      for (; j + 4 <= end; j += 4) {
        const Code* r0 = vals + j * H;
        if (g == 0)
          for (int64_t i = 0; i < 4 * H; i += kLine) __builtin_prefetch(r0 + kAheadSlots * H + i);
        if (!(mask[j] && mask[j + 1] && mask[j + 2] && mask[j + 3])) {
          for (int64_t i = 0; i < 4; ++i)
            if (mask[j + i])
              for (int64_t c = 0; c < H; ++c) ag[c] += wg[j + i] * value(r0[i * H + c]);
          continue;
        }
        const Code *r1 = r0 + H, *r2 = r1 + H, *r3 = r2 + H;
        const float w0 = wg[j], w1 = wg[j + 1], w2 = wg[j + 2], w3 = wg[j + 3];
        for (int64_t c = 0; c < H; ++c)
          ag[c] += w0 * value(r0[c]) + w1 * value(r1[c]) + w2 * value(r2[c]) + w3 * value(r3[c]);
      }
      for (; j < end; ++j)
        if (mask[j])
          for (int64_t c = 0; c < H; ++c) ag[c] += wg[j] * value(vals[j * H + c]);
    }
  }
  for (int64_t g = 0; g < G; ++g)
    for (int64_t h = 0; h < H; ++h) out[g * H + h] = acc[g * H + h] / total[g];
}

// The (sequence, KV head) pairs, claimed one at a time by the calling thread and by helpers on XLA's
// intra-op pool. The shared state lives on the heap: a helper that starts after the call has returned finds
// no pair left and touches nothing else.
struct Work {
  Problem problem;
  void (*fn)(const Problem&, int64_t);
  int64_t pairs;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void run() {
    for (int64_t i; (i = next.fetch_add(1)) < pairs;) {
      fn(problem, i);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error launch(ffi::ThreadPool pool, Problem problem, void (*fn)(const Problem&, int64_t)) {
  auto work = std::make_shared<Work>();
  work->problem = problem;
  work->fn = fn;
  work->pairs = problem.B * problem.K;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), work->pairs) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work] { work->run(); });
  work->run();
  while (work->done.load(std::memory_order_acquire) < work->pairs) std::this_thread::yield();
  return ffi::Error::Success();
}

// Float keys and values (float32, or bfloat16 read as Bf16), no scales.
template <ffi::DataType kType, typename Code>
ffi::Error attend_float(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<kType> k, ffi::Buffer<kType> v,
                        ffi::Buffer<ffi::PRED> mask, float scale, ffi::Result<ffi::Buffer<ffi::F32>> out) {
  auto d = q.dimensions();
  Problem p{d[0], d[1], d[2], d[3], k.dimensions()[3], k.dimensions()[0], scale, q.typed_data(), k.untyped_data(),
            v.untyped_data(), nullptr, nullptr, mask.typed_data(), out->typed_data()};
  return launch(pool, p, one_pair<Code>);
}

template <ffi::DataType kType>
auto float_binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()  // q [B, K, G, H]
      .template Arg<ffi::Buffer<kType>>()  // keys [R, K, H, S]
      .template Arg<ffi::Buffer<kType>>()  // values [R, K, S, H]
      .template Arg<ffi::Buffer<ffi::PRED>>()  // mask [B, S]
      .template Attr<float>("scale")
      .template Ret<ffi::Buffer<ffi::F32>>();  // out [B, K, G, H]
}

ffi::Error attend_int8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::S8> k,
                       ffi::Buffer<ffi::S8> v, ffi::Buffer<ffi::F32> k_scale, ffi::Buffer<ffi::F32> v_scale,
                       ffi::Buffer<ffi::PRED> mask, float scale, ffi::Result<ffi::Buffer<ffi::F32>> out) {
  auto d = q.dimensions();
  Problem p{d[0], d[1], d[2], d[3], k.dimensions()[3], k.dimensions()[0], scale, q.typed_data(), k.typed_data(),
            v.typed_data(), k_scale.typed_data(), v_scale.typed_data(), mask.typed_data(), out->typed_data()};
  return launch(pool, p, one_pair<int8_t>);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PoolAttendFloat, (attend_float<ffi::F32, float>), float_binding<ffi::F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(PoolAttendBf16, (attend_float<ffi::BF16, Bf16>), float_binding<ffi::BF16>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(PoolAttendInt8, attend_int8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [B, K, G, H]
                                  .Arg<ffi::Buffer<ffi::S8>>()  // key codes [R, K, H, S]
                                  .Arg<ffi::Buffer<ffi::S8>>()  // value codes [R, K, S, H]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // key scales [R, K, S]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // value scales [R, K, S]
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // mask [B, S]
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>());  // out [B, K, G, H]
