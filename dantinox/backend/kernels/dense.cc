// A few rows of float32 activations times a bfloat16 weight matrix, the weights widened as they are read.
//
// An XLA:CPU custom call (the XLA FFI), built by dantinox/backend/native.py with the machine's C++ compiler. A decode
// step multiplies one row per sequence by every weight matrix, so it is bound by reading the weights. Stored in
// bfloat16 they are half the bytes of float32, but XLA:CPU first converts each matrix into a float32 temporary
// (reading 2 bytes, writing 4 and reading 4 again per weight). Here each weight is widened in registers (a
// bfloat16 is the high half of a float32, so this is exact) and multiplied in float32 with float32 sums: the
// float32 model's arithmetic on the stored weights, in one pass over them.
//
// Two shapes of product, M rows of x [M, D] (float32), kMaxRows at a time:
//   "nn": y [M, N] = x · W for W [D, N], a dense layer's kernel as flax stores it ([in, out]);
//   "nt": y [M, N] = x · Wᵀ for W [N, D], the tied output head (the embedding table, one row per token).
// The calling thread and helpers on XLA's intra-op pool claim the work one piece at a time: for nn, one block
// of W's rows per thread, each summed into its own [M, N] and added up at the end; for nt, tiles of W's rows.
//
// And the embedding lookup of the same table: "rows" widens the rows of a bfloat16 table [V, D] at given ids.
// XLA:CPU gathers bfloat16 by widening the whole table to float32 first; inside a decode loop that widening
// does not depend on the step, so XLA lifts it out of the loop and every call of the loop wrote a float32 copy
// of the table (113 MB for SmolLM2-135M) before its first step.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>


#include "shapes.h"
#include "simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace dantinox;

constexpr int64_t kMaxRows = 8;

struct Problem {
  int64_t M, D, N, blocks;  // blocks: how many parts W's rows are cut into (nn)
  const float* x;     // [M, D]
  const float* xp;    // [M, D]: x with each group of kGroup values as its even ones, then its odd ones (nt)
  const Bf16* w;      // [D, N] (nn) or [N, D] (nt)
  float* y;           // [M, N]
  float* partial;     // [blocks - 1, M, N]: the other blocks' sums (nn)
};

// Columns of a product are read in groups of kGroup = 2 * kLanes: one read of 4 * kLanes bytes widens to two
// vectors, the group's even-numbered values and its odd-numbered ones (simd.h, widen_pairs). Sums over a
// group are kept in that order (even columns, then odd) and put back in order once, when they are written out.
constexpr int64_t kGroup = 2 * kLanes;

// nn: one block of W's rows (its share of the D inputs) for all M rows of x, into its own partial sum
// [M, N]: rows of W are read in order, four at a time, into column chunks of accumulators that stay in L1.
// A chunk of 1,024 columns, rows prefetched 8 ahead, read a batch-1 step's weights fastest. Past 4 rows the chunk
// narrows to 256 columns: 8 rows of 1,024 sums are 32 KiB, a whole L1 data cache on many x86 cores, so the sums
// went out to L2 and back on every step while W streamed past them. With fewer rows the chunk widens to 16 KiB
// of sums (4,096 columns at M = 1), so that a layer as wide as SmolLM2's gate and up products (3,072 columns) is
// read in address order (docs/benchmarks.md#speed-layer-rules, dense chunks).
constexpr int64_t kAheadRows = 8;

template <int M>
constexpr int64_t nn_chunk() {  // columns of sums per pass, a multiple of every kGroup (16 or 32)
  return M > 4 ? 256 : 4096 / M / 32 * 32;
}

// Rows read side by side from far-apart parts of W (streams). One core here keeps more reads in flight when it
// follows several sequential streams at once than when it follows one: a bare sum over 1 GiB on both cores
// read faster as two or four streams per core than as one. So with few rows of x (whole rows of W per pass,
// bound by the reads) the four rows taken at a time come one from each quarter of the block, and the hardware's
// prefetchers follow them without help; software prefetching on top of that was slower. With more rows the
// product is paced by its arithmetic and narrower chunks (above): there the four rows are consecutive,
// prefetched kAheadRows on (docs/benchmarks.md#speed-layer-rules, dense streams).
constexpr int nn_streams(int64_t M) { return M > 4 ? 1 : 4; }

template <int M>
void nn_block(const float* x, const Bf16* w, int64_t D, int64_t N, int64_t d0, int64_t d1, float* out) {
  constexpr int64_t kChunk = nn_chunk<M>();
  constexpr int kStreams = nn_streams(M);
  const int64_t steps = (d1 - d0) / 4;  // of four rows; the rows past d0 + 4 * steps follow one at a time
  alignas(64) float acc[M][kChunk];
  for (int64_t c0 = 0; c0 < N; c0 += kChunk) {
    const int64_t n = std::min(kChunk, N - c0), grouped = n - n % kGroup;
    for (int m = 0; m < M; ++m) std::fill(acc[m], acc[m] + n, 0.0f);
    for (int64_t k = 0; k < steps; ++k) {
      int64_t rows[4];  // four streams: row k of each quarter; one: four consecutive rows
      for (int r = 0; r < 4; ++r) rows[r] = d0 + (kStreams == 4 ? r * steps + k : 4 * k + r);
      const Bf16* wr[4];
      for (int r = 0; r < 4; ++r) wr[r] = w + rows[r] * N + c0;
      for (int64_t j = 0; j < grouped; j += kGroup) {
        if (kStreams == 1 && j % 32 == 0)  // the 64-byte lines this group starts, of the four rows kAheadRows on
          for (int64_t i = 0; i < kGroup; i += 32)
            for (int r = 0; r < 4; ++r) __builtin_prefetch(wr[r] + kAheadRows * N + j + i);
        VecF even[4], odd[4];
        for (int r = 0; r < 4; ++r) widen_pairs(wr[r] + j, even[r], odd[r]);
        for (int m = 0; m < M; ++m) {
          float* am = acc[m] + j;
          VecF se = load(am), so = load(am + kLanes);
          for (int r = 0; r < 4; ++r) {
            const VecF xr = splat(x[m * D + rows[r]]);
            se += xr * even[r];
            so += xr * odd[r];
          }
          store(am, se);
          store(am + kLanes, so);
        }
      }
      for (int64_t j = grouped; j < n; ++j)
        for (int m = 0; m < M; ++m)
          for (int r = 0; r < 4; ++r) acc[m][j] += x[m * D + rows[r]] * widen(wr[r][j]);
    }
    for (int64_t d = d0 + 4 * steps; d < d1; ++d) {
      const Bf16* wd = w + d * N + c0;
      for (int64_t j = 0; j < grouped; j += kGroup) {
        VecF even, odd;
        widen_pairs(wd + j, even, odd);
        for (int m = 0; m < M; ++m) {
          const VecF xd = splat(x[m * D + d]);
          store(acc[m] + j, load(acc[m] + j) + xd * even);
          store(acc[m] + j + kLanes, load(acc[m] + j + kLanes) + xd * odd);
        }
      }
      for (int m = 0; m < M; ++m)
        for (int64_t j = grouped; j < n; ++j) acc[m][j] += x[m * D + d] * widen(wd[j]);
    }
    for (int m = 0; m < M; ++m) {
      float* y = out + m * N + c0;
      for (int64_t j = 0; j < grouped; j += kGroup)
        for (int i = 0; i < kLanes; ++i) {
          y[j + 2 * i] = acc[m][j + i];
          y[j + 2 * i + 1] = acc[m][j + kLanes + i];
        }
      std::copy(acc[m] + grouped, acc[m] + n, y + grouped);
    }
  }
}

// nt: the outputs [r0, r0 + rows) of y for all M rows, one tile: dot products of x's rows with rows of W, each
// row of W read in address order. x comes in the order widen_pairs gives W (p.xp: each group's even-numbered
// values, then its odd ones). With few rows of x, kStreamsNt rows are read side by side, one from each part of
// the tile (streams, as for nn above); with more, one row at a time, which read faster than adjacent rows side
// by side (docs/benchmarks.md#speed-layer-rules, dense nt).
constexpr int64_t kAheadNt = 256;  // values of W prefetched ahead of the one being read (one row at a time)

constexpr int nt_streams(int64_t M) { return M > 4 ? 1 : 4; }
constexpr int64_t nt_rows(int64_t M) { return 64 * nt_streams(M); }  // rows of W per tile

template <int M>
void nt_tile(const Problem& p, int64_t tile) {
  constexpr int S = nt_streams(M);
  constexpr int U = S > 1 ? 1 : M >= 8 ? 1 : 8 / M;  // groups of each row at once: S * U * M sums in flight
  const int64_t r0 = tile * nt_rows(M), D = p.D, N = p.N, grouped = D - D % kGroup;
  const int64_t n = std::min(nt_rows(M), N - r0), steps = n / S;
  const auto dot = [&](const Bf16* const* w, int64_t row0, int64_t stride, auto streams) {
    constexpr int kS = decltype(streams)::value;
    VecF acc[kS][U][M] = {};
    const auto add_group = [&](VecF* sums, const Bf16* ws, int64_t d) {  // one group into M sums
      VecF even, odd;
      widen_pairs(ws + d, even, odd);
      for (int m = 0; m < M; ++m) sums[m] += load(p.xp + m * D + d) * even + load(p.xp + m * D + d + kLanes) * odd;
    };
    int64_t d = 0;
    for (; d + U * kGroup <= grouped; d += U * kGroup)
      for (int s = 0; s < kS; ++s)
        for (int u = 0; u < U; ++u) {
          if (kS == 1 && (d + u * kGroup) % 32 == 0) __builtin_prefetch(w[s] + d + u * kGroup + kAheadNt);
          add_group(acc[s][u], w[s], d + u * kGroup);
        }
    for (; d < grouped; d += kGroup)
      for (int s = 0; s < kS; ++s) add_group(acc[s][0], w[s], d);
    for (int s = 0; s < kS; ++s)
      for (int m = 0; m < M; ++m) {
        VecF t = acc[s][0][m];
        for (int u = 1; u < U; ++u) t += acc[s][u][m];
        float sum = lane_sum(t);
        for (int64_t e = grouped; e < D; ++e) sum += p.x[m * D + e] * widen(w[s][e]);
        p.y[m * N + row0 + s * stride] = sum;
      }
  };
  for (int64_t k = 0; k < steps; ++k) {  // row k of each of the S parts of the tile
    const Bf16* w[S];
    for (int s = 0; s < S; ++s) w[s] = p.w + (r0 + s * steps + k) * D;
    dot(w, r0 + k, steps, std::integral_constant<int, S>{});
  }
  for (int64_t r = r0 + S * steps; r < r0 + n; ++r) {  // the rows left over in a short last tile
    const Bf16* w[1] = {p.w + r * D};
    dot(w, r, 0, std::integral_constant<int, 1>{});
  }
}

// nn tile b: block b of W's rows, its partial sum written to y (b = 0) or to partial b - 1.
template <int M>
void nn_tile(const Problem& p, int64_t b) {
  const int64_t d0 = p.D * b / p.blocks, d1 = p.D * (b + 1) / p.blocks;
  nn_block<M>(p.x, p.w, p.D, p.N, d0, d1, b == 0 ? p.y : p.partial + (b - 1) * p.M * p.N);
}

using TileFn = void (*)(const Problem&, int64_t);

template <int M>
struct NnFn {
  static constexpr TileFn fn = nn_tile<M>;
};
template <int M>
struct NtFn {
  static constexpr TileFn fn = nt_tile<M>;
};

template <template <int> class Fn>
TileFn for_rows(int64_t M) {
  static constexpr TileFn fns[kMaxRows] = {Fn<1>::fn, Fn<2>::fn, Fn<3>::fn, Fn<4>::fn,
                                           Fn<5>::fn, Fn<6>::fn, Fn<7>::fn, Fn<8>::fn};
  return fns[M - 1];
}

// The tiles, claimed one at a time by the calling thread and by helpers on XLA's intra-op pool. The shared
// state lives on the heap: a helper that starts after the call has returned finds no tile and touches nothing.
struct Work {
  Problem problem;
  TileFn fn;
  int64_t tiles;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void run() {
    for (int64_t i; (i = next.fetch_add(1)) < tiles;) {
      fn(problem, i);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// rows = M <= kMaxRows rows of x [M, D] times W into y [M, N].
template <bool kTransposed>
void product(ffi::ThreadPool& pool, int64_t M, int64_t D, int64_t N, const float* x, const Bf16* w, float* y) {
  auto work = std::make_shared<Work>();
  Problem& p = work->problem;
  p = Problem{M, D, N, 1, x, nullptr, w, y, nullptr};
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  if (kTransposed) {
    thread_local std::vector<float> xp;  // the calling thread's, kept between calls; it outlives the helpers' use
    xp.resize(std::max<size_t>(xp.size(), M * D));
    const int64_t grouped = D - D % kGroup;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t g = d - d % kGroup, k = d % kGroup;
        xp[m * D + (d < grouped ? g + (k % 2) * kLanes + k / 2 : d)] = x[m * D + d];
      }
    p.xp = xp.data();
    work->fn = for_rows<NtFn>(M);
    work->tiles = (N + nt_rows(M) - 1) / nt_rows(M);
  } else {  // one block of rows per thread, each summing into its own [M, N], added up at the end
    p.blocks = std::min<int64_t>(threads, std::max<int64_t>(1, D / 64));
    // The calling thread's scratch, kept between calls (a fresh allocation this size is fresh pages, and
    // their faults cost more than the product); it outlives the helpers' use: the call waits for every block.
    thread_local std::vector<float> scratch;
    scratch.resize(std::max<size_t>(scratch.size(), (p.blocks - 1) * M * N));
    p.partial = scratch.data();
    work->fn = for_rows<NnFn>(M);
    work->tiles = p.blocks;
  }
  const int64_t helpers = std::min<int64_t>(threads, work->tiles) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work] { work->run(); });
  work->run();
  while (work->done.load(std::memory_order_acquire) < work->tiles) std::this_thread::yield();
  for (int64_t b = 1; b < p.blocks; ++b) {
    const float* part = p.partial + (b - 1) * M * N;
    for (int64_t i = 0; i < M * N; ++i) y[i] += part[i];
  }
}

// Any number of rows, kMaxRows at a time: W is read once per tile of rows. Past a tile or two the product is
// bound by the arithmetic, not the reads, so a prompt's rows go through the same code as a decode step's.
template <bool kTransposed>
ffi::Error dense(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::BF16> w,
                 ffi::Result<ffi::Buffer<ffi::F32>> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  const bool ranks = xd.size() == 2 && wd.size() == 2;
  const int64_t M = ranks ? xd[0] : 0, D = ranks ? xd[1] : 0, N = ranks ? (kTransposed ? wd[0] : wd[1]) : 0;
  if (!ranks || M < 1 || !has_shape(wd, kTransposed ? std::initializer_list<int64_t>{N, D}
                                                     : std::initializer_list<int64_t>{D, N}) ||
      !has_shape(yd, {M, N}))
    return shape_error<decltype(xd)>("dantinox dense", kTransposed ? "x [M >= 1, D], W [N, D], y [M, N]"
                                                                    : "x [M >= 1, D], W [D, N], y [M, N]",
                                     {{"x", xd}, {"W", wd}, {"y", yd}});
  const auto* weights = static_cast<const Bf16*>(w.untyped_data());
  for (int64_t r0 = 0; r0 < M; r0 += kMaxRows)
    product<kTransposed>(pool, std::min(kMaxRows, M - r0), D, N, x.typed_data() + r0 * D, weights,
                         y->typed_data() + r0 * N);
  return ffi::Error::Success();
}

// out [n, D] = the rows of table [V, D] at ids [n], widened; an id in [-V, 0) counts from the end and any
// other id outside the table gives a row of NaN (jnp.take's default, which this replaces).
ffi::Error rows(ffi::Buffer<ffi::S32> ids, ffi::Buffer<ffi::BF16> table, ffi::Result<ffi::Buffer<ffi::F32>> out) {
  const auto td = table.dimensions(), od = out->dimensions();
  const int64_t n = static_cast<int64_t>(ids.element_count());
  if (td.size() != 2 || !has_shape(od, {n, td[1]}))
    return shape_error<decltype(td)>("dantinox rows", "ids [n] (any shape of n), table [V, D], out [n, D]",
                                     {{"ids", ids.dimensions()}, {"table", td}, {"out", od}});
  const int64_t V = td[0], D = td[1];
  const auto* t = static_cast<const Bf16*>(table.untyped_data());
  const int32_t* id = ids.typed_data();
  float* o = out->typed_data();
  for (int64_t i = 0; i < n; ++i, o += D) {
    const int64_t r = id[i] < 0 ? id[i] + V : id[i];
    if (r < 0 || r >= V)
      std::fill(o, o + D, __builtin_nanf(""));
    else
      for (int64_t d = 0; d < D; ++d) o[d] = widen(t[r * D + d]);
  }
  return ffi::Error::Success();
}

auto binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()  // x [M, D]
      .Arg<ffi::Buffer<ffi::BF16>>()  // W [D, N] (nn) or [N, D] (nt)
      .Ret<ffi::Buffer<ffi::F32>>();  // y [M, N]
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseBf16, dense<false>, binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(DenseBf16T, dense<true>, binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(RowsBf16, rows,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()   // ids [n]
                                  .Arg<ffi::Buffer<ffi::BF16>>()  // table [V, D]
                                  .Ret<ffi::Buffer<ffi::F32>>());  // out [n, D]
