// One new token per sequence attending over a shared pool of cache slots, each slot read where it lies.
//
// An XLA:CPU custom call (the XLA FFI), built by dantinox/backend/native.py with the machine's C++ compiler.
// A paged cache keeps every sequence's pages in one pool; attention through XLA either gathers each
// sequence's pages into a copy or scores every query against the whole pool and masks the rest. This
// kernel does neither: for each (sequence, KV head) it finds the runs of kBlock-slot blocks the sequence's
// mask leaves a slot visible in, and reads only those, so the bytes read are the sequence's own slots.
// The query heads that share the KV head go through together, up to kMaxHeads at a time: their scores
// over the runs, a softmax, then the weighted sum of the value rows. In both products the sums stay in
// registers (blocks of slots, then of channels, as many as fit) and each cached key or value is widened
// once for all the heads of the group.
//
// Shapes (float32 unless named): q [B, K, G, H]; keys [R, K, H, S] (slot axis last, as the cache stores them)
// and values [R, K, S, H], in float32 or bfloat16 (widened as they are read), R = 1 for a pool all sequences
// share or R = B for one row each; mask [B, S] (bool); for int8 codes, key and value scales [R, K, S];
// out [B, K, G, H].
// A sequence that sees no slot gets zeros. With fewer pairs than twice the threads, each pair's slots are cut
// into parts read by different threads and combined at the end (launch).
//
// The same library stores new tokens into a cache in place ("store", at the end of this file).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "shapes.h"
#include "simd.h"
#include "xla/ffi/api/ffi.h"

// glibc's vector expf (libmvec) for the softmax's loop of exponentials, which <math.h> declares only under GCC's
// fast-math; the kernels are built without it (they use -inf), and without this the loop calls expf per slot.
#if defined(__GLIBC__) && defined(__x86_64__)
extern "C" float expf(float) __attribute__((simd("notinbranch")));
#endif

namespace ffi = xla::ffi;

namespace {

using namespace dantinox;

constexpr int64_t kBlock = 16;
constexpr int64_t kAheadSlots = 8;  // value rows (slots) read ahead
constexpr int64_t kRowsAtOnce = 16;  // key rows (channels) read side by side when scoring
constexpr int kMaxHeads = 4;  // query heads of one KV head handled together; more go in groups of this many
constexpr int kRegisters = kLanes == 16 ? 32 : 16;  // vector registers: 32 with AVX-512, 16 with AVX2

// Vectors of slots (scores) or of channels (values) per step for NG heads: NG x that many sums, that many
// widened keys or values and one broadcast fit in the registers.
template <int NG>
constexpr int kWidth = (kRegisters - 2) / (NG + 1);

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
  // With few (sequence, KV head) pairs for the threads, each pair's slots are cut into `parts` parts of whole
  // blocks, and each part writes its unnormalized sums [G, H], its highest score and its sum of exponentials
  // [G] to these (one entry per pair and part), added up once every part is done (see launch).
  int64_t parts = 1;
  float* partial = nullptr;
  float* tops = nullptr;
  float* totals = nullptr;
};

using Runs = std::vector<std::pair<int64_t, int64_t>>;

// Scores of NG query heads (rows of q, H apart) against the J * kLanes slots from j, over key rows [h0, h1), into
// s (rows S apart), added to what s holds unless h0 is 0: the sums stay in registers over the rows, and each key
// is widened once for the NG heads.
template <int NG, int J, typename Code>
inline void score_slots(const float* q, int64_t H, const Code* keys, int64_t S, int64_t j, float* s, int64_t h0,
                        int64_t h1) {
  VecF acc[NG][J] = {};
  if (h0 > 0)
    for (int g = 0; g < NG; ++g)
      for (int v = 0; v < J; ++v) acc[g][v] = load(s + g * S + j + v * kLanes);
  for (int64_t h = h0; h < h1; ++h) {
    const Code* row = keys + h * S + j;
    VecF k[J];
    for (int v = 0; v < J; ++v) k[v] = widen_vec(row + v * kLanes);
    for (int g = 0; g < NG; ++g) {
      const VecF qh = splat(q[g * H + h]);
      for (int v = 0; v < J; ++v) acc[g][v] += qh * k[v];
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int v = 0; v < J; ++v) store(s + g * S + j + v * kLanes, acc[g][v]);
}

// Weighted sums of the value rows over the seen slots, channels [c, c + C * kLanes), for NG heads whose
// weights are rows of w (S apart), into out (rows H apart); each value widened once for the NG heads.
template <int NG, int C, typename Code>
inline void sum_values(const float* w, int64_t S, const Code* vals, int64_t H, int64_t c, const Runs& runs,
                       const bool* mask, float* out) {
  constexpr int64_t kLine = 64 / sizeof(Code);
  VecF acc[NG][C] = {};
  for (const auto& [start, end] : runs)
    for (int64_t j = start; j < end; ++j) {
      const Code* row = vals + j * H;
      if (c == 0)  // the first pass over the rows brings them in: kAheadSlots rows on
        for (int64_t i = 0; i < H; i += kLine) __builtin_prefetch(row + kAheadSlots * H + i);
      if (!mask[j]) continue;  // a hidden slot's weight is 0, and its value may be anything
      VecF v[C];
      for (int i = 0; i < C; ++i) v[i] = widen_vec(row + c + i * kLanes);
      for (int g = 0; g < NG; ++g) {
        const VecF wj = splat(w[g * S + j]);
        for (int i = 0; i < C; ++i) acc[g][i] += wj * v[i];
      }
    }
  for (int g = 0; g < NG; ++g)
    for (int i = 0; i < C; ++i) store(out + g * H + c + i * kLanes, acc[g][i]);
}

// Slots [j, end) over key rows [h0, h1) in steps of J vectors while they fit, then of fewer (so that NG * J sums
// stay in flight); where the whole vectors end.
template <int NG, int J, typename Code>
int64_t score_rows(const float* q, int64_t H, const Code* keys, int64_t S, int64_t j, int64_t end, float* s,
                   int64_t h0, int64_t h1) {
  for (; j + J * kLanes <= end; j += J * kLanes) score_slots<NG, J>(q, H, keys, S, j, s, h0, h1);
  if constexpr (J > 1) j = score_rows<NG, J - 1>(q, H, keys, S, j, end, s, h0, h1);
  return j;
}

// The scores over slots [j, end), kRowsAtOnce key rows at a time: each pass reads that many rows side by side
// along the whole run, few enough streams for the hardware prefetchers to follow (all H rows at once were too
// many: docs/benchmarks.md#speed-layer-rules, kRowsAtOnce); where the whole vectors end.
template <int NG, int J, typename Code>
int64_t score_run(const float* q, int64_t H, const Code* keys, int64_t S, int64_t j, int64_t end, float* s) {
  int64_t done = j;
  for (int64_t h0 = 0; h0 < H; h0 += kRowsAtOnce)
    done = score_rows<NG, J>(q, H, keys, S, j, end, s, h0, std::min(H, h0 + kRowsAtOnce));
  return done;
}

// Channels from c in steps of C vectors while they fit, then of fewer; where the whole vectors end.
template <int NG, int C, typename Code>
int64_t values_from(const float* w, int64_t S, const Code* vals, int64_t H, int64_t c, const Runs& runs,
                    const bool* mask, float* out) {
  for (; c + C * kLanes <= H; c += C * kLanes) sum_values<NG, C>(w, S, vals, H, c, runs, mask, out);
  if constexpr (C > 1) c = values_from<NG, C - 1>(w, S, vals, H, c, runs, mask, out);
  return c;
}

// A run starts on a block, a whole number of vectors: only the run that ends at the last slot may end inside one.
static_assert(kBlock % kLanes == 0);

// The highest score of the seen slots in `runs`, at least -FLT_MAX: a vector of running highest scores, where a
// hidden slot's lane keeps its value (the slot's score may be anything), folded once at the end. GCC 12 left the
// plain loop (a running std::max over a bool mask) scalar, with GCC's fast-math or without it.
inline float highest_seen(const float* s, const Runs& runs, const bool* mask) {
  float top = -std::numeric_limits<float>::max();
  VecF tops = splat(top);
  for (const auto& [start, end] : runs) {
    int64_t j = start;
    for (; j + kLanes <= end; j += kLanes) {
      const VecF x = load(s + j);
      tops = (lanes_of(mask + j) & (x > tops)) ? x : tops;
    }
    for (; j < end; ++j) top = std::max(top, mask[j] ? s[j] : top);
  }
  return std::max(top, lane_max(tops));
}

// The softmax's weights in place: w (exponentials) kept at the seen slots of `runs` and 0 at the hidden ones
// (whose exponentials may be anything), then times the value scales `vs` where there are any; the sum of the
// kept exponentials, in kLanes partial sums (without reassociation the compiler adds them one at a time).
inline float keep_seen(float* w, const Runs& runs, const bool* mask, const float* vs) {
  float sum = 0.0f;
  VecF sums{};
  for (const auto& [start, end] : runs) {
    int64_t j = start;
    for (; j + kLanes <= end; j += kLanes) {
      VecF x = lanes_of(mask + j) ? load(w + j) : VecF{};
      sums += x;
      if (vs) x *= load(vs + j);
      store(w + j, x);
    }
    for (; j < end; ++j) {
      w[j] = mask[j] ? w[j] : 0.0f;
      sum += w[j];
      if (vs) w[j] *= vs[j];
    }
  }
  return lane_sum(sums) + sum;
}

// Query heads [g0, g0 + NG) of one (sequence, KV head) pair over the slots in `runs`: scores, softmax over
// the seen slots (0 elsewhere), weighted sum of the values, out. With `tops` (one part of the pair's slots),
// out keeps the sums unnormalized, and tops and totals get each head's highest score and its sum of
// exponentials.
template <int NG, typename Code>
void some_heads(const Problem& p, const Runs& runs, const float* q, const Code* keys, const Code* vals,
                const float* ks, const float* vs, const bool* mask, float* out, float* s, float* tops,
                float* totals) {
  const int64_t H = p.H, S = p.S;
  for (const auto& [start, end] : runs) {
    int64_t j = score_run<NG, kWidth<NG>>(q, H, keys, S, start, end, s);
    for (; j < end; ++j)
      for (int g = 0; g < NG; ++g) {
        float dot = 0.0f;
        for (int64_t h = 0; h < H; ++h) dot += q[g * H + h] * widen(keys[h * S + j]);
        s[g * S + j] = dot;
      }
  }
  float total[NG], highest[NG];
  for (int g = 0; g < NG; ++g) {  // plain loops, which the compiler vectorizes, and the reductions in vectors
    float* sg = s + g * S;
    for (const auto& [start, end] : runs) {
      if (ks)
        for (int64_t j = start; j < end; ++j) sg[j] *= p.scale * ks[j];
      else
        for (int64_t j = start; j < end; ++j) sg[j] *= p.scale;
    }
    const float top = highest_seen(sg, runs, mask);
    for (const auto& [start, end] : runs)
      for (int64_t j = start; j < end; ++j) sg[j] = std::exp(sg[j] - top);
    total[g] = keep_seen(sg, runs, mask, vs);
    highest[g] = top;
  }
  int64_t c = values_from<NG, kWidth<NG>>(s, S, vals, H, 0, runs, mask, out);
  for (; c < H; ++c)
    for (int g = 0; g < NG; ++g) {
      float sum = 0.0f;
      for (const auto& [start, end] : runs)
        for (int64_t j = start; j < end; ++j)
          if (mask[j]) sum += s[g * S + j] * widen(vals[j * H + c]);
      out[g * H + c] = sum;
    }
  if (tops) {
    std::copy(highest, highest + NG, tops);
    std::copy(total, total + NG, totals);
    return;
  }
  for (int g = 0; g < NG; ++g)
    for (int64_t h = 0; h < H; ++h) out[g * H + h] /= total[g];
}

// One part of one (sequence, KV head) pair's slots (the whole pair when p.parts is 1).
template <typename Code>
void one_pair(const Problem& p, int64_t unit) {
  const int64_t pair = unit / p.parts, part = unit % p.parts, G = p.G, H = p.H, S = p.S;
  const int64_t b = pair / p.K, kh = pair % p.K, blocks = (S + kBlock - 1) / kBlock;
  const int64_t lo = blocks * part / p.parts * kBlock, hi = std::min(S, blocks * (part + 1) / p.parts * kBlock);
  const int64_t head = (p.R == 1 ? 0 : b) * p.K + kh;  // the cached head this pair reads
  const float* q = p.q + pair * G * H;
  const Code* keys = static_cast<const Code*>(p.k) + head * H * S;
  const Code* vals = static_cast<const Code*>(p.v) + head * S * H;
  const float* ks = p.k_scale ? p.k_scale + head * S : nullptr;
  const float* vs = p.v_scale ? p.v_scale + head * S : nullptr;
  const bool* mask = p.mask + b * S;
  float* out = p.parts == 1 ? p.out + pair * G * H : p.partial + unit * G * H;
  float* tops = p.parts == 1 ? nullptr : p.tops + unit * G;
  float* totals = p.parts == 1 ? nullptr : p.totals + unit * G;

  // The runs of consecutive blocks that hold a slot the mask lets this sequence see (its own pages in a pool).
  // Scratch kept per thread between calls: fresh allocations of a large pool's size would be fresh pages.
  thread_local Runs runs;
  thread_local std::vector<float> s;
  runs.clear();
  for (int64_t start = lo; start < hi; start += kBlock) {
    const int64_t end = std::min(hi, start + kBlock);
    if (std::none_of(mask + start, mask + end, [](bool m) { return m; })) continue;
    if (!runs.empty() && runs.back().second == start)
      runs.back().second = end;
    else
      runs.emplace_back(start, end);
  }
  if (runs.empty()) {
    std::fill(out, out + G * H, 0.0f);
    if (totals) std::fill(totals, totals + G, 0.0f);  // a part that sees nothing adds nothing
    return;
  }
  s.resize(std::max<size_t>(s.size(), kMaxHeads * S));
  for (int64_t g0 = 0; g0 < G; g0 += kMaxHeads) {  // up to kMaxHeads query heads per pass over keys and values
    const float* qg = q + g0 * H;
    float* og = out + g0 * H;
    float *tops_g = tops ? tops + g0 : nullptr, *totals_g = totals ? totals + g0 : nullptr;
    switch (std::min<int64_t>(kMaxHeads, G - g0)) {
      case 1: some_heads<1>(p, runs, qg, keys, vals, ks, vs, mask, og, s.data(), tops_g, totals_g); break;
      case 2: some_heads<2>(p, runs, qg, keys, vals, ks, vs, mask, og, s.data(), tops_g, totals_g); break;
      case 3: some_heads<3>(p, runs, qg, keys, vals, ks, vs, mask, og, s.data(), tops_g, totals_g); break;
      default: some_heads<4>(p, runs, qg, keys, vals, ks, vs, mask, og, s.data(), tops_g, totals_g); break;
    }
  }
}

// The (sequence, KV head) pairs, or their parts, claimed one at a time by the calling thread and by helpers on XLA's
// intra-op pool. The shared state lives on the heap: a helper that starts after the call has returned finds
// no unit left and touches nothing else.
struct Work {
  Problem problem;
  void (*fn)(const Problem&, int64_t);
  int64_t units;  // of work: (sequence, KV head) pairs times parts
  std::vector<float> scratch;  // the parts' sums, highest scores and totals
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void run() {
    for (int64_t i; (i = next.fetch_add(1)) < units;) {
      fn(problem, i);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Fewer pairs than twice the threads (SmolLM2 at batch 1: three KV heads on two cores) leave a thread idle
// while the last pair is read. Then each pair's slots are cut into parts of at least kPartSlots, enough for
// twice as many units as threads, and the parts' softmaxes are combined at the end: each part's sums scaled
// by exp(its highest score - the pair's highest): a batch-1 step over a long cache on two cores; parts of 256 or
// 128 slots gained no more (docs/benchmarks.md#speed-layer-rules, kPartSlots).
constexpr int64_t kPartSlots = 512;

ffi::Error launch(ffi::ThreadPool pool, Problem problem, void (*fn)(const Problem&, int64_t)) {
  auto work = std::make_shared<Work>();
  Problem& p = work->problem;
  p = problem;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads()), pairs = p.B * p.K;
  if (pairs < 2 * threads)
    p.parts = std::max<int64_t>(1, std::min<int64_t>((2 * threads + pairs - 1) / pairs, p.S / kPartSlots));
  if (p.parts > 1) {
    const int64_t units = pairs * p.parts;
    work->scratch.resize(units * p.G * (p.H + 2));
    p.partial = work->scratch.data();
    p.tops = p.partial + units * p.G * p.H;
    p.totals = p.tops + units * p.G;
  }
  work->fn = fn;
  work->units = pairs * p.parts;
  const int64_t helpers = std::min<int64_t>(threads, work->units) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work] { work->run(); });
  work->run();
  while (work->done.load(std::memory_order_acquire) < work->units) std::this_thread::yield();
  if (p.parts == 1) return ffi::Error::Success();
  for (int64_t pair = 0; pair < pairs; ++pair)
    for (int64_t g = 0; g < p.G; ++g) {
      const int64_t first = pair * p.parts;  // the pair's first unit
      float top = -std::numeric_limits<float>::infinity(), total = 0.0f;
      for (int64_t u = first; u < first + p.parts; ++u)
        if (p.totals[u * p.G + g] > 0.0f) top = std::max(top, p.tops[u * p.G + g]);
      float* out = p.out + (pair * p.G + g) * p.H;
      std::fill(out, out + p.H, 0.0f);
      for (int64_t u = first; u < first + p.parts; ++u) {
        if (!(p.totals[u * p.G + g] > 0.0f)) continue;
        const float w = std::exp(p.tops[u * p.G + g] - top);
        total += w * p.totals[u * p.G + g];
        const float* part = p.partial + (u * p.G + g) * p.H;
        for (int64_t h = 0; h < p.H; ++h) out[h] += w * part[h];
      }
      if (total > 0.0f)
        for (int64_t h = 0; h < p.H; ++h) out[h] /= total;
    }
  return ffi::Error::Success();
}

// The operands of one call against q's [B, K, G, H] and the keys' rows R (1 or B) and slots S; with `scales`,
// int8 codes' key and value scales [R, K, S] too. Success, or the one-line error naming every shape.
template <typename Dims>
ffi::Error check_attend(Dims q, Dims k, Dims v, Dims mask, Dims out, const Dims* ks = nullptr,
                        const Dims* vs = nullptr) {
  const bool ranks = q.size() == 4 && k.size() == 4;
  const int64_t B = ranks ? q[0] : 0, K = ranks ? q[1] : 0, G = ranks ? q[2] : 0, H = ranks ? q[3] : 0;
  const int64_t R = ranks ? k[0] : 0, S = ranks ? k[3] : 0;
  if (ranks && (R == 1 || R == B) && has_shape(k, {R, K, H, S}) && has_shape(v, {R, K, S, H}) &&
      has_shape(mask, {B, S}) && has_shape(out, {B, K, G, H}) &&
      (!ks || (has_shape(*ks, {R, K, S}) && has_shape(*vs, {R, K, S}))))
    return ffi::Error::Success();
  if (ks)
    return shape_error<Dims>("dantinox pool attend",
                             "q [B, K, G, H], keys [R, K, H, S], values [R, K, S, H] (R = 1 or B), scales "
                             "[R, K, S] each, mask [B, S], out [B, K, G, H]",
                             {{"q", q}, {"keys", k}, {"values", v}, {"key scales", *ks}, {"value scales", *vs},
                              {"mask", mask}, {"out", out}});
  return shape_error<Dims>("dantinox pool attend",
                           "q [B, K, G, H], keys [R, K, H, S], values [R, K, S, H] (R = 1 or B), mask [B, S], "
                           "out [B, K, G, H]",
                           {{"q", q}, {"keys", k}, {"values", v}, {"mask", mask}, {"out", out}});
}

// Float keys and values (float32, or bfloat16 read as Bf16), no scales.
template <ffi::DataType kType, typename Code>
ffi::Error attend_float(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<kType> k, ffi::Buffer<kType> v,
                        ffi::Buffer<ffi::PRED> mask, float scale, ffi::Result<ffi::Buffer<ffi::F32>> out) {
  auto d = q.dimensions();
  if (auto bad = check_attend(d, k.dimensions(), v.dimensions(), mask.dimensions(), out->dimensions()); bad.failure())
    return bad;
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
  const auto ks = k_scale.dimensions(), vs = v_scale.dimensions();
  if (auto bad = check_attend(d, k.dimensions(), v.dimensions(), mask.dimensions(), out->dimensions(), &ks, &vs);
      bad.failure())
    return bad;
  Problem p{d[0], d[1], d[2], d[3], k.dimensions()[3], k.dimensions()[0], scale, q.typed_data(), k.typed_data(),
            v.typed_data(), k_scale.typed_data(), v_scale.typed_data(), mask.typed_data(), out->typed_data()};
  return launch(pool, p, one_pair<int8_t>);
}

// Storing tokens into a cache in place. XLA:CPU updates an array of bfloat16, float16 or fp8 by widening all
// of it to float32, writing the slot and narrowing it back, so a decode step rewrote each layer's whole cache
// (docs/benchmarks.md#speed-layer-rules, store). Here each token's bytes are copied to its slot; the cache is the call's
// result, aliased to its operand.
// cache [R, ..., S, ...] of any element type with its slots on axis `axis`, seen as [R, O, S, I]; tokens [n, O, I]
// of the same type; rows and slots [n] (int32): cache[rows[j], o, slots[j], i] = tokens[j, o, i] for every j
// whose row is in [0, R) and slot in [0, S); other tokens are dropped (a masked token, slot -1). The cache keeps
// its own shape: a reshaped operand is copied by XLA before and after an aliased call.
ffi::Error store_tokens(ffi::AnyBuffer cache, ffi::AnyBuffer tokens, ffi::Buffer<ffi::S32> rows,
                        ffi::Buffer<ffi::S32> slots, int64_t axis, ffi::Result<ffi::AnyBuffer> out) {
  const auto cd = cache.dimensions(), td = tokens.dimensions();
  const int64_t rank = static_cast<int64_t>(cd.size());
  int64_t O = 1, I = 1;
  for (int64_t d = 1; d < axis && d < rank; ++d) O *= cd[d];
  for (int64_t d = axis + 1; d < rank; ++d) I *= cd[d];
  if (axis < 1 || axis >= rank || td.size() != 3 || cache.element_type() != tokens.element_type() ||
      out->element_type() != cache.element_type() || td[1] != O || td[2] != I ||
      static_cast<int64_t>(rows.element_count()) != td[0] || static_cast<int64_t>(slots.element_count()) != td[0] ||
      shape_text(out->dimensions()) != shape_text(cd))
    return shape_error<decltype(cd)>("dantinox store",
                                     "cache [R, ..., S at axis, ...], tokens [n, O, I] of its type, rows and slots "
                                     "[n], out as the cache",
                                     {{"cache", cd}, {"tokens", td}, {"rows", rows.dimensions()},
                                      {"slots", slots.dimensions()}, {"out", out->dimensions()}});
  const int64_t R = cd[0], S = cd[axis], n = td[0];
  const int64_t width = static_cast<int64_t>(ffi::ByteWidth(cache.element_type()));
  const int64_t run = I * width;  // bytes of one slot of one outer index
  auto* dst = static_cast<char*>(out->untyped_data());
  if (dst != cache.untyped_data())  // not aliased after all: start from the operand
    std::memcpy(dst, cache.untyped_data(), cache.size_bytes());
  const auto* src = static_cast<const char*>(tokens.untyped_data());
  for (int64_t j = 0; j < n; ++j) {
    const int64_t r = rows.typed_data()[j], s = slots.typed_data()[j];
    if (r < 0 || r >= R || s < 0 || s >= S) continue;
    for (int64_t o = 0; o < O; ++o)
      std::memcpy(dst + ((r * O + o) * S + s) * run, src + (j * O + o) * run, run);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CacheStore, store_tokens,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // cache [R, ..., S, ...]
                                  .Arg<ffi::AnyBuffer>()  // tokens [n, O, I]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // rows [n]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // slots [n]
                                  .Attr<int64_t>("axis")  // the cache's slot axis
                                  .Ret<ffi::AnyBuffer>());  // the cache, aliased to the first operand

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
