// Weight-streaming linear layers on CPU for few rows: float32 activations times weights read once
// from memory, either kept as 4-bit or 8-bit integers in groups of 32 along the input dimension, each
// group with a float32 scale (and, for 4-bit, a float32 zero): w = q * scale + zero; or float32 as
// they are (the tied head's embedding table, never packed for oneDNN; and the layers' weights when
// MODELDEPLOY_CPU_GEMM=0 keeps them plain). GGUF's Q4_0, Q4_1 and Q4_K and Q8_0 map onto the
// integer layouts exactly (kernels/quant.py). Twins: `quant.QuantLinear.dequantize` then F.linear;
// F.linear for float32.
//
// Plain C ABI (loaded with ctypes by kernels/cpu_quant.py), OpenMP over tiles of eight output rows
// with the thread count the caller passes (torch.get_num_threads()). AVX-512 intrinsics where the
// build targets them (x86-64-v4), AVX2 + FMA (x86-64-v3), else portable scalar code; cpu_build.py
// builds one object per level.
//
// Layouts (row n of N, K inputs, G = K / 32 groups):
//   4-bit: qw uint8 [N, K/2]; group g is 16 bytes, byte j holds q[j] (low nibble) and q[j+16]
//          (high nibble), q in 0..15 (GGUF's Q4_0/Q4_1 block layout).
//   8-bit: qw int8 [N, K], q in -128..127, no zero.
//   32-bit: qw float32 [N, K], no scales or zeros.
//   scales, zeros: float32 [N, G].
// The weight is rebuilt as q * scale + zero in float32: q * scale is exact for the GGUF formats
// (an 11-bit or 17-bit scale times a 4-bit or 8-bit integer fits float32's 24 bits), so the
// rebuilt weights are bit-identical to gguf-py's (and transformers') de-quantized float32 ones
// whether or not the compiler fuses the multiply-add. Only the summation order of the dot
// products differs from a float32 GEMM.
//
// Why tiles: at one to a few rows a GEMM is a GEMV, bound by reading the weight once, if the
// arithmetic keeps up. One accumulator per output row is a chain of dependent FMAs, and at one
// activation row that chain, not memory, bounded the 4-bit kernel (5-8 GB/s on a machine that
// streams ~20). A task owns eight weight rows and keeps eight accumulators in flight whatever the
// activation rows (8 x 1, 4 x 2, 2 x 4, 1 x 8), fetching the next tile while it reads this one:
// at one row the real model's Q4_1 layers went from 10-14 to 5.9-6.4 ms, Q8_0 from 11-21 to
// 6.3-7.0 ms, its Q8_0 head from 1.7 to 1.1 ms (bench/results/serving_real_cpu.md, "Decode on
// the kernels' own calls").

#include <cstdint>
#include <cstring>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

constexpr int GROUP = 32;
constexpr int TILE = 8;  // output rows a task owns; R x TT = TILE accumulators in flight (see tile())

#if defined(__AVX512F__)
// AVX-512 (x86-64-v4): a group's 32 weights as two 16-float registers, widened straight from bytes.
struct W {
  __m512 v[2];
};

inline W group4(const uint8_t* row, const float* sc, const float* zr, int64_t g) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * 16));
  const __m128i m = _mm_set1_epi8(15);
  const __m512 s = _mm512_set1_ps(sc[g]), z = _mm512_set1_ps(zr[g]);
  W w;
  w.v[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, m))), s, z);
  w.v[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), m))), s, z);
  return w;
}

inline W group8(const int8_t* row, const float* sc, int64_t g) {
  const __m512 s = _mm512_set1_ps(sc[g]);
  const __m128i* p = reinterpret_cast<const __m128i*>(row + g * GROUP);
  W w;
  w.v[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p))), s);
  w.v[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p + 1))), s);
  return w;
}

inline W group32(const float* row, int64_t g) {
  return W{{_mm512_loadu_ps(row + g * GROUP), _mm512_loadu_ps(row + g * GROUP + 16)}};
}

typedef __m512 Acc;
inline Acc acc_zero() { return _mm512_setzero_ps(); }

inline Acc acc_dot(Acc acc, const float* x, const W& w) {
  acc = _mm512_fmadd_ps(_mm512_loadu_ps(x), w.v[0], acc);
  return _mm512_fmadd_ps(_mm512_loadu_ps(x + 16), w.v[1], acc);
}

inline float acc_sum(Acc a) { return _mm512_reduce_add_ps(a); }

inline void store_w(float* out, const W& w) {
  _mm512_storeu_ps(out, w.v[0]);
  _mm512_storeu_ps(out + 16, w.v[1]);
}
#elif defined(__AVX2__) && defined(__FMA__)
// AVX2 + FMA (x86-64-v3): a group's 32 weights as four 8-float registers.
struct W {
  __m256 v[4];
};

inline __m256 cvt8(__m128i bytes8, bool is_signed) {
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(bytes8) : _mm256_cvtepu8_epi32(bytes8));
}

inline W group4(const uint8_t* row, const float* sc, const float* zr, int64_t g) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * 16));
  const __m128i m = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(b, m);                     // elements 0..15
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);  // elements 16..31
  const __m256 s = _mm256_set1_ps(sc[g]), z = _mm256_set1_ps(zr[g]);
  W w;
  w.v[0] = _mm256_fmadd_ps(cvt8(lo, false), s, z);
  w.v[1] = _mm256_fmadd_ps(cvt8(_mm_srli_si128(lo, 8), false), s, z);
  w.v[2] = _mm256_fmadd_ps(cvt8(hi, false), s, z);
  w.v[3] = _mm256_fmadd_ps(cvt8(_mm_srli_si128(hi, 8), false), s, z);
  return w;
}

inline W group8(const int8_t* row, const float* sc, int64_t g) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * GROUP));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + g * GROUP + 16));
  const __m256 s = _mm256_set1_ps(sc[g]);
  W w;
  w.v[0] = _mm256_mul_ps(cvt8(a, true), s);
  w.v[1] = _mm256_mul_ps(cvt8(_mm_srli_si128(a, 8), true), s);
  w.v[2] = _mm256_mul_ps(cvt8(b, true), s);
  w.v[3] = _mm256_mul_ps(cvt8(_mm_srli_si128(b, 8), true), s);
  return w;
}

inline W group32(const float* row, int64_t g) {
  const float* p = row + g * GROUP;
  return W{{_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8), _mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 24)}};
}

typedef __m256 Acc;
inline Acc acc_zero() { return _mm256_setzero_ps(); }

inline Acc acc_dot(Acc acc, const float* x, const W& w) {
  acc = _mm256_fmadd_ps(_mm256_loadu_ps(x), w.v[0], acc);
  acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8), w.v[1], acc);
  acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16), w.v[2], acc);
  return _mm256_fmadd_ps(_mm256_loadu_ps(x + 24), w.v[3], acc);
}

inline float acc_sum(Acc a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline void store_w(float* out, const W& w) {
  for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + 8 * i, w.v[i]);
}
#else
// Portable fallback (x86-64-v2, other CPUs): scalar code the compiler vectorizes as it can.
struct W {
  float v[GROUP];
};

inline W group4(const uint8_t* row, const float* sc, const float* zr, int64_t g) {
  W w;
  const uint8_t* b = row + g * 16;
  for (int j = 0; j < 16; ++j) {
    w.v[j] = static_cast<float>(b[j] & 15) * sc[g] + zr[g];
    w.v[j + 16] = static_cast<float>(b[j] >> 4) * sc[g] + zr[g];
  }
  return w;
}

inline W group8(const int8_t* row, const float* sc, int64_t g) {
  W w;
  for (int j = 0; j < GROUP; ++j) w.v[j] = static_cast<float>(row[g * GROUP + j]) * sc[g];
  return w;
}

inline W group32(const float* row, int64_t g) {
  W w;
  std::memcpy(w.v, row + g * GROUP, sizeof(w.v));
  return w;
}

struct Acc {
  float v[8];
};
inline Acc acc_zero() { return Acc{}; }

inline Acc acc_dot(Acc acc, const float* x, const W& w) {
  for (int j = 0; j < GROUP; ++j) acc.v[j % 8] += x[j] * w.v[j];
  return acc;
}

inline float acc_sum(Acc a) {
  float s = 0.0f;
  for (float v : a.v) s += v;
  return s;
}

inline void store_w(float* out, const W& w) { std::memcpy(out, w.v, sizeof(w.v)); }
#endif

// Bytes of one weight row (K inputs) and of one group in it.
template <int BITS>
constexpr int64_t group_bytes() {
  return BITS == 4 ? 16 : BITS == 8 ? GROUP : GROUP * 4;
}

template <int BITS>
inline W group(const void* qw, const float* sc, const float* zr, int64_t n, int64_t K, int64_t g) {
  const int64_t G = K / GROUP;
  if constexpr (BITS == 4)
    return group4(static_cast<const uint8_t*>(qw) + n * (K / 2), sc + n * G, zr + n * G, g);
  else if constexpr (BITS == 8)
    return group8(static_cast<const int8_t*>(qw) + n * K, sc + n * G, g);
  else
    return group32(static_cast<const float*>(qw) + n * K, g);
}

// out[t, n + r] for TT rows of x (row stride K) and R weight rows n..n+R-1: R x TT independent
// accumulators (each group's weights rebuilt once, used by all TT rows). While reading the group g of
// weight row n + r, the same bytes of row n + r + TILE (the next task's tile) are fetched, so a task
// streams its rows with the next tile already on the way (`pf_end`: the weight's size in bytes).
template <int BITS, int TT, int R>
inline void block(const float* x, int64_t K, const void* qw, const float* sc, const float* zr, int64_t n,
                  int64_t N, float* out, int64_t pf_end) {
  const int64_t G = K / GROUP, gb = group_bytes<BITS>(), row_bytes = G * gb;
  const char* base = static_cast<const char*>(qw);
  Acc acc[R][TT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) acc[r][t] = acc_zero();
  for (int64_t g = 0; g < G; ++g) {
    const float* xg = x + g * GROUP;
    for (int r = 0; r < R; ++r) {
#if defined(__AVX2__)
      const int64_t lo = (n + r + TILE) * row_bytes + g * gb;  // 64-byte lines starting in this group
      for (int64_t o = (lo + 63) & ~int64_t(63); o < lo + gb && o < pf_end; o += 64)
        _mm_prefetch(base + o, _MM_HINT_T0);
#endif
      const W w = group<BITS>(qw, sc, zr, n + r, K, g);
      for (int t = 0; t < TT; ++t) acc[r][t] = acc_dot(acc[r][t], xg + t * K, w);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) out[t * N + n + r] = acc_sum(acc[r][t]);
}

// Activation rows x[0:TT] against the weight rows n..n+count-1 of a tile: R = TILE / TT weight rows
// at a time when the tile is full (so TILE accumulator chains are in flight), one at a time at a
// ragged end.
template <int BITS, int TT>
inline void rows(const float* x, int64_t K, const void* qw, const float* sc, const float* zr, int64_t n,
                 int64_t count, int64_t N, float* out, int64_t pf_end) {
  constexpr int R = TILE / TT;
  if (count == TILE)
    for (int r = 0; r < TILE; r += R) block<BITS, TT, R>(x, K, qw, sc, zr, n + r, N, out, pf_end);
  else
    for (int64_t r = 0; r < count; ++r) block<BITS, TT, 1>(x, K, qw, sc, zr, n + r, N, out, pf_end);
}

// All T rows of x against a tile's weight rows: activation rows in blocks of 8, 4, 2, 1 (one
// activation row: eight weight rows at once; at one chain per row the FMA latency, not memory,
// bounds a GEMV).
template <int BITS>
inline void tile(const float* x, int64_t T, int64_t K, const void* qw, const float* sc, const float* zr,
                 int64_t n, int64_t count, int64_t N, float* out, int64_t pf_end) {
  int64_t t = 0;
  for (; t + 8 <= T; t += 8) rows<BITS, 8>(x + t * K, K, qw, sc, zr, n, count, N, out + t * N, pf_end);
  if (T - t >= 4) {
    rows<BITS, 4>(x + t * K, K, qw, sc, zr, n, count, N, out + t * N, pf_end);
    t += 4;
  }
  if (T - t >= 2) {
    rows<BITS, 2>(x + t * K, K, qw, sc, zr, n, count, N, out + t * N, pf_end);
    t += 2;
  }
  if (T - t >= 1) rows<BITS, 1>(x + t * K, K, qw, sc, zr, n, count, N, out + t * N, pf_end);
}

template <int BITS>
void linear(const float* x, int64_t T, int64_t K, const void* qw, const float* sc, const float* zr,
            int64_t N, float* out, int threads) {
  const bool par = N * K * (T < 8 ? T : 8) >= (1 << 16) && threads > 1;
  const int64_t tiles = (N + TILE - 1) / TILE, pf_end = N * (K / GROUP) * group_bytes<BITS>();
#pragma omp parallel for schedule(static) num_threads(threads) if (par)
  for (int64_t i = 0; i < tiles; ++i) {
    const int64_t n = i * TILE, count = N - n < TILE ? N - n : TILE;
    tile<BITS>(x, T, K, qw, sc, zr, n, count, N, out, pf_end);
  }
}

template <int BITS>
void dequant(const void* qw, const float* sc, const float* zr, int64_t N, int64_t K, float* out,
             int threads) {
  const int64_t G = K / GROUP;
  const bool par = N * K >= (1 << 16) && threads > 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (par)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) store_w(out + n * K + g * GROUP, group<BITS>(qw, sc, zr, n, K, g));
  }
}

}  // namespace

extern "C" {

int mdq_abi_version() { return 2; }

// out [T, N] = x [T, K] @ W.T; bits 4 or 8 for a quantized W (zeros ignored for 8), 32 for a
// float32 W (scales and zeros ignored). K % 32 == 0, x and out contiguous float32 (the wrapper checks).
void mdq_linear(int bits, const float* x, int64_t T, int64_t K, const void* qw, const float* scales,
                const float* zeros, int64_t N, float* out, int threads) {
  if (bits == 4)
    linear<4>(x, T, K, qw, scales, zeros, N, out, threads);
  else if (bits == 8)
    linear<8>(x, T, K, qw, scales, zeros, N, out, threads);
  else
    linear<32>(x, T, K, qw, scales, zeros, N, out, threads);
}

// out [N, K] float32 = the de-quantized weight (for long prefill chunks: one rebuild, then a GEMM).
void mdq_dequant(int bits, const void* qw, const float* scales, const float* zeros, int64_t N, int64_t K,
                 float* out, int threads) {
  if (bits == 4)
    dequant<4>(qw, scales, zeros, N, K, out, threads);
  else
    dequant<8>(qw, scales, zeros, N, K, out, threads);
}

}  // extern "C"
