// Vectors one register wide for dantinox's kernels, through GCC's vector extensions (Clang takes them too).
//
// kLanes float32 lanes: 16 where the compiler may use 512-bit vectors (-march=native on a CPU with AVX-512),
// else 8 (AVX2, or whatever the target lowers them to). The kernels are written in whole vectors of kLanes,
// so one source runs on both. `widen` reads kLanes stored values as float32: float32 as they are, bfloat16
// by shifting its bits up 16 (a bfloat16 is the high half of a float32, so this is exact), int8 codes by
// conversion.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace dantinox {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif

typedef float VecF __attribute__((vector_size(4 * kLanes)));
typedef uint32_t VecU __attribute__((vector_size(4 * kLanes)));
typedef int32_t VecI __attribute__((vector_size(4 * kLanes)));  // a comparison's lanes: -1 (true) or 0
typedef uint16_t VecH __attribute__((vector_size(2 * kLanes)));
typedef int8_t VecC __attribute__((vector_size(kLanes)));

struct Bf16 {  // bfloat16 as stored: the high half of a float32
  uint16_t bits;
};

template <typename To, typename From>
inline To bits_as(const From& from) {  // the same bytes read as another type (std::bit_cast, C++20)
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

inline float widen(float x) { return x; }
inline float widen(int8_t x) { return static_cast<float>(x); }
inline float widen(Bf16 x) { return bits_as<float>(static_cast<uint32_t>(x.bits) << 16); }

inline VecF load(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, VecF v) { std::memcpy(p, &v, sizeof v); }
inline VecF splat(float x) { return VecF{} + x; }

inline VecF widen_vec(const float* p) { return load(p); }
// One zero-extending load and a shift where the instructions can be named. GCC lowers the portable
// conversion below to four shuffles per vector on AVX2, at half the read rate or less
// (docs/benchmarks.md#speed-layer-rules, widen_vec).
inline VecF widen_vec(const Bf16* p) {
#if defined(__AVX512F__)
  return bits_as<VecF>(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(p))), 16));
#elif defined(__AVX2__)
  return bits_as<VecF>(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
      reinterpret_cast<const __m128i*>(p))), 16));
#else
  VecH h;
  std::memcpy(&h, p, sizeof h);
  return bits_as<VecF>(__builtin_convertvector(h, VecU) << 16);
#endif
}
// 2 * kLanes bfloat16 values as two float32 vectors, with no shuffle at all: read as kLanes 32-bit words,
// each word holds an even-numbered value in its low half and the next, odd-numbered one in its high half
// (little-endian x86 and Arm), so a shift and a mask widen them. The fastest of the three (widen_vec above).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "widen_pairs reads the even value from the low half");
inline void widen_pairs(const Bf16* p, VecF& even, VecF& odd) {
  VecU u;
  std::memcpy(&u, p, sizeof u);
  even = bits_as<VecF>(u << 16);
  odd = bits_as<VecF>(u & 0xFFFF0000u);
}
// kLanes bytes sign-extended to 32-bit lanes: one instruction where it can be named; GCC 12 lowers the portable
// conversion to a scalar conversion per lane (docs/benchmarks.md#speed-layer-rules, widen_vec int8).
inline VecI bytes_to_lanes(const void* p) {
#if defined(__AVX512F__)
  return bits_as<VecI>(_mm512_cvtepi8_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  return bits_as<VecI>(_mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
#else
  VecC c;
  std::memcpy(&c, p, sizeof c);
  return __builtin_convertvector(c, VecI);
#endif
}
inline VecF widen_vec(const int8_t* p) { return __builtin_convertvector(bytes_to_lanes(p), VecF); }

// kLanes bools (one byte each) as a lane mask, for `mask ? a : b` on vectors.
inline VecI lanes_of(const bool* p) { return bytes_to_lanes(p) != 0; }

// The lanes folded in halves (lane i with lane i + n, for n = kLanes / 2, ..., 1): a few vector operations, in an
// order written here rather than one the compiler may choose (the kernels are built without reassociation).
template <typename Op>
inline float lane_fold(VecF v, Op op) {
#if defined(__AVX512F__)
  v = op(v, __builtin_shuffle(v, VecU{8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15}));
  v = op(v, __builtin_shuffle(v, VecU{4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7}));
  v = op(v, __builtin_shuffle(v, VecU{2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3}));
  v = op(v, __builtin_shuffle(v, VecU{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}));
#else
  v = op(v, __builtin_shuffle(v, VecU{4, 5, 6, 7, 4, 5, 6, 7}));
  v = op(v, __builtin_shuffle(v, VecU{2, 3, 2, 3, 2, 3, 2, 3}));
  v = op(v, __builtin_shuffle(v, VecU{1, 1, 1, 1, 1, 1, 1, 1}));
#endif
  return v[0];
}

inline float lane_sum(VecF v) {
  return lane_fold(v, [](VecF a, VecF b) { return a + b; });
}

// The highest lane, of lanes that hold no NaN.
inline float lane_max(VecF v) {
  return lane_fold(v, [](VecF a, VecF b) { return b > a ? b : a; });
}

}  // namespace dantinox
