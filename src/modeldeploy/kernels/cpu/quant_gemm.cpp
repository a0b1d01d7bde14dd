// Weight-streaming linear layers on CPU for few rows (and, further down, long chunks on int8
// activations): float32 activations times weights read once from memory, either kept as 4-bit or
// 8-bit integers in groups of 32 along the input dimension, each group with a float32 scale (and,
// for 4-bit, a float32 zero): w = q * scale + zero; or float32 as
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
#include <vector>
#if defined(__x86_64__)
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

// ---------------------------------------------------------------------------------------------
// Long chunks (prefill) on int8 activations: W4A8 / W8A8 with AVX-512 VNNI.
//
// Why: a 1536-token prompt spent 1.1 s of its 1.7 s prefill in float32 GEMMs that MKL runs near
// this CPU's float32 peak, so the quantized formats prefilled no faster than float32 (the weights
// were rebuilt as float32, then BLAS). VPDPBUSD multiplies 64 byte pairs per instruction where an
// FMA does 16 float pairs. llama.cpp's CPU path does the same for these formats (its vec_dot_type
// Q8_0 / Q8_1): each activation row is quantized per group of 32 inputs, ia = round(x * 127 /
// amax), with scale amax / 127, so a group's dot product is one exact int32 sum, times the weight
// group's scale and the activation group's scale. The zero term (4-bit), z * sum_k x_k, takes the
// group's float activation sum, one more FMA a group.
//
// Layout, packed per call from the QuantLinear's own bytes (so memory stays at its 0.75 / 1.125
// bytes a weight): strips of 16 output columns; strip s, group g, quad j (inputs 4j..4j+3 of the
// group) is 64 bytes, column l's four signed values at bytes 4l..4l+3, the int32 lane l of one
// register. 4-bit q in 0..15 become q - 8 (the zero, moved to z + 8 * scale, absorbs it). VPDPBUSD
// wants one operand unsigned: the activations go in as ia + 128 (1..255), and each (strip, group) carries
// -128 * sum(q) as its accumulator's start, which cancels the offset exactly. Centring the 4-bit q
// (and moving the zero to z + 8 * scale) halves the rounding error the activations bring: the int8
// part then carries only scale * (q - 8).
// ---------------------------------------------------------------------------------------------
#if defined(__x86_64__) && defined(__GNUC__)
#define MDQ_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define MDQ_HAVE_I8 1
namespace {

constexpr int STRIP = 16;
constexpr int I8_ROWS = 4;         // activation rows a micro-kernel holds
constexpr int64_t I8_MBLOCK = 192;  // rows per block whose int8 activations stay in L2

// x [M, K] -> xa uint8 [M, K] (ia + 128), sa [M, G] (amax / 127) and xs [M, G] (the float sums), one
// task per row.
MDQ_VNNI void quantize_rows(const float* x, int64_t M, int64_t K, uint8_t* xa, float* sa, float* xs, int threads) {
  const int64_t G = K / GROUP;
  const bool par = M * K >= (1 << 15) && threads > 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (par)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      const float* p = x + m * K + g * GROUP;
      const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      sa[m * G + g] = amax / 127.0f;
      xs[m * G + g] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
      const __m512 vi = _mm512_set1_ps(inv);
      const __m512i off = _mm512_set1_epi32(128);
      const __m512i qa = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a, vi)), off);
      const __m512i qb = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(b, vi)), off);
      uint8_t* o = xa + m * K + g * GROUP;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm512_cvtepi32_epi8(qa));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16), _mm512_cvtepi32_epi8(qb));
    }
  }
}

// The weight [N, K] (N % 16 == 0) -> wp int8 strips (see above), corr int32 [N/16, G, 16] =
// -128 * sum of the group's signed values, ws float32 [N/16, G, 16] = the groups' scales, and for
// 4-bit wz float32 [N/16, G, 16] = zero + 8 * scale.
MDQ_VNNI void pack_strips(int bits, const void* qw, const float* scales, const float* zeros, int64_t N, int64_t K,
                          int8_t* wp, int32_t* corr, float* ws, float* wz, int threads) {
  const int64_t G = K / GROUP, strips = N / STRIP;
  const bool par = N * K >= (1 << 16) && threads > 1;
  const __m512i idx = _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);
#pragma omp parallel for schedule(static) num_threads(threads) if (par)
  for (int64_t s = 0; s < strips; ++s) {
    alignas(64) int8_t tmp[STRIP * GROUP];
    for (int64_t g = 0; g < G; ++g) {
      const int64_t cg = (s * G + g) * STRIP;
      for (int l = 0; l < STRIP; ++l) {
        const int64_t n = s * STRIP + l;
        __m128i lo, hi;  // the group's 32 signed values
        if (bits == 4) {
          const uint8_t* r = static_cast<const uint8_t*>(qw) + n * (K / 2) + g * 16;
          const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r));
          const __m128i m4 = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
          lo = _mm_sub_epi8(_mm_and_si128(b, m4), eight);
          hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), m4), eight);
        } else {
          const int8_t* r = static_cast<const int8_t*>(qw) + n * K + g * GROUP;
          lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r));
          hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 16));
        }
        // their sum: the bytes read as v + 128 (sign bit flipped), summed unsigned, less 32 * 128
        const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80)), zero = _mm_setzero_si128();
        const __m128i sad = _mm_add_epi64(_mm_sad_epu8(_mm_xor_si128(lo, flip), zero),
                                          _mm_sad_epu8(_mm_xor_si128(hi, flip), zero));
        const int32_t sum = static_cast<int32_t>(_mm_cvtsi128_si64(sad) + _mm_extract_epi64(sad, 1)) - 128 * GROUP;
        _mm_store_si128(reinterpret_cast<__m128i*>(tmp + l * GROUP), lo);
        _mm_store_si128(reinterpret_cast<__m128i*>(tmp + l * GROUP + 16), hi);
        corr[cg + l] = -128 * sum;
        ws[cg + l] = scales[n * G + g];
        if (bits == 4) wz[cg + l] = zeros[n * G + g] + 8.0f * scales[n * G + g];
      }
      int8_t* dst = wp + (s * G + g) * (STRIP * GROUP);
      for (int j = 0; j < GROUP / 4; ++j)
        _mm512_storeu_si512(dst + j * 64,
                            _mm512_i32gather_epi32(_mm512_add_epi32(idx, _mm512_set1_epi32(j)), tmp, 4));
    }
  }
}

// Per-row and per-strip pointers of one call.
struct I8 {
  const uint8_t* xa;  // activation rows, ia + 128
  const float* sa;    // their groups' scales [rows, G]
  const float* xs;    // their groups' float sums [rows, G]
  const int8_t* wp;   // the first strip
  const int32_t* corr;
  const float* ws;
  const float* wz;  // nullptr for 8-bit
  float* out;
  int64_t K, N;
};

// out[r, 16 c + l] = sum over groups of (int32 dot) * ws * sa (+ wz * xs), for R rows and C strips.
template <int R, int C, bool ZERO>
MDQ_VNNI inline void micro_i8(const I8& a) {
  const int64_t K = a.K, G = K / GROUP, strip_bytes = K * STRIP, strip_groups = G * STRIP;
  const uint8_t* xa = a.xa;
  const float *sa = a.sa, *xs = a.xs, *ws = a.ws, *wz = a.wz;
  const int8_t* wp = a.wp;
  const int32_t* corr = a.corr;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512i ia[R][C];
    for (int c = 0; c < C; ++c) {
      const __m512i k0 = _mm512_loadu_si512(corr + c * strip_groups + g * STRIP);
      for (int r = 0; r < R; ++r) ia[r][c] = k0;
    }
    const int8_t* wg = wp + g * (STRIP * GROUP);
    const uint8_t* xg = xa + g * GROUP;
    for (int j = 0; j < GROUP / 4; ++j) {
      __m512i w[C];
      for (int c = 0; c < C; ++c) w[c] = _mm512_loadu_si512(wg + c * strip_bytes + j * 64);
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, xg + r * K + j * 4, 4);
        const __m512i a = _mm512_set1_epi32(four);
        for (int c = 0; c < C; ++c) ia[r][c] = _mm512_dpbusd_epi32(ia[r][c], a, w[c]);
      }
    }
    for (int c = 0; c < C; ++c) {
      const __m512 s = _mm512_loadu_ps(ws + c * strip_groups + g * STRIP);
      for (int r = 0; r < R; ++r)
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r][c]), _mm512_mul_ps(s, _mm512_set1_ps(sa[r * G + g])),
                                    acc[r][c]);
      if constexpr (ZERO) {
        const __m512 z = _mm512_loadu_ps(wz + c * strip_groups + g * STRIP);
        for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(z, _mm512_set1_ps(xs[r * G + g]), acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(a.out + r * a.N + c * STRIP, acc[r][c]);
}

// `rows` activation rows against C strips: I8_ROWS at a time, then one at a time.
template <int C, bool ZERO>
MDQ_VNNI inline void rows_i8(int64_t rows, I8 a) {
  const int64_t G = a.K / GROUP;
  for (int64_t r = 0; r < rows;) {
    if (rows - r >= I8_ROWS) {
      micro_i8<I8_ROWS, C, ZERO>(a);
      r += I8_ROWS;
      a.xa += I8_ROWS * a.K, a.sa += I8_ROWS * G, a.xs += I8_ROWS * G, a.out += I8_ROWS * a.N;
    } else {
      micro_i8<1, C, ZERO>(a);
      r += 1;
      a.xa += a.K, a.sa += G, a.xs += G, a.out += a.N;
    }
  }
}

template <bool ZERO>
MDQ_VNNI inline void strips_i8(int64_t rows, const I8& a, bool pair) {
  if (pair)
    rows_i8<2, ZERO>(rows, a);
  else
    rows_i8<1, ZERO>(rows, a);
}

MDQ_VNNI void linear_i8(int bits, const float* x, int64_t M, int64_t K, const void* qw, const float* scales,
                        const float* zeros, int64_t N, float* out, int threads) {
  const int64_t G = K / GROUP, strips = N / STRIP, pairs = (strips + 1) / 2;
  thread_local std::vector<uint8_t> xa_buf, w_buf;
  thread_local std::vector<float> sa_buf, xs_buf, ws_buf, wz_buf;
  thread_local std::vector<int32_t> corr_buf;
  xa_buf.resize(M * K);
  sa_buf.resize(M * G);
  xs_buf.resize(M * G);
  w_buf.resize(N * K);
  corr_buf.resize(strips * G * STRIP);
  ws_buf.resize(strips * G * STRIP);
  wz_buf.resize(bits == 4 ? strips * G * STRIP : 0);
  uint8_t* xa = xa_buf.data();
  float* sa = sa_buf.data();
  int8_t* wp = reinterpret_cast<int8_t*>(w_buf.data());
  int32_t* corr = corr_buf.data();
  float *ws = ws_buf.data(), *wz = bits == 4 ? wz_buf.data() : nullptr, *xs = xs_buf.data();
  quantize_rows(x, M, K, xa, sa, xs, threads);
  pack_strips(bits, qw, scales, zeros, N, K, wp, corr, ws, wz, threads);
  const int64_t mblocks = (M + I8_MBLOCK - 1) / I8_MBLOCK;
  const bool par = threads > 1 && M * N * K >= (1 << 20);
  // Row blocks one after the other, each block's strip pairs split among the threads (a split over
  // blocks would leave a thread idle behind a short last block).
#pragma omp parallel num_threads(threads) if (par)
  for (int64_t mb = 0; mb < mblocks; ++mb) {
#pragma omp for schedule(static)
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t m0 = mb * I8_MBLOCK, rows = (M - m0 < I8_MBLOCK ? M - m0 : I8_MBLOCK), s = 2 * p;
      const int64_t sg = s * G * STRIP;
      const I8 a{xa + m0 * K,   sa + m0 * G,           xs + m0 * G, wp + s * K * STRIP,    corr + sg,
                 ws + sg,       wz ? wz + sg : nullptr, out + m0 * N + s * STRIP, K, N};
      if (wz)
        strips_i8<true>(rows, a, s + 1 < strips);
      else
        strips_i8<false>(rows, a, s + 1 < strips);
    }
  }
  // A big call (the head's 28 M weights, a long prompt) would otherwise keep its copies for the
  // life of the thread.
  constexpr int64_t KEEP = int64_t(8) << 20;
  if (N * K > KEEP) {
    std::vector<uint8_t>().swap(w_buf);
    std::vector<int32_t>().swap(corr_buf);
    std::vector<float>().swap(ws_buf);
    std::vector<float>().swap(wz_buf);
  }
  if (M * K > KEEP) {
    std::vector<uint8_t>().swap(xa_buf);
    std::vector<float>().swap(sa_buf);
    std::vector<float>().swap(xs_buf);
  }
}

}  // namespace
#else
#define MDQ_HAVE_I8 0
#endif

extern "C" {

int mdq_abi_version() { return 3; }

// Whether mdq_linear_i8 runs on this CPU (AVX-512 with VNNI, whatever level this object was built for).
int mdq_i8_supported() {
#if MDQ_HAVE_I8
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
#else
  return 0;
#endif
}

// out [M, N] = x [M, K] @ W.T on int8 activations (see above); bits 4 or 8 (zeros ignored for 8),
// K % 32 == 0, N % 16 == 0, only where mdq_i8_supported().
void mdq_linear_i8(int bits, const float* x, int64_t M, int64_t K, const void* qw, const float* scales,
                   const float* zeros, int64_t N, float* out, int threads) {
#if MDQ_HAVE_I8
  linear_i8(bits, x, M, K, qw, scales, zeros, N, out, threads);
#endif
}

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
