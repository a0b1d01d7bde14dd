// Weight-streaming linear layers on CPU for few rows: float32 activations times weights read once
// from memory, either kept as 4-bit or 8-bit integers in groups of 32 along the input dimension, each
// group with a float32 scale (and, for 4-bit, a float32 zero): w = q * scale + zero; or float32 as
// they are (the tied head's embedding table, which is never packed for oneDNN). GGUF's Q4_0, Q4_1
// and Q4_K and Q8_0 map onto the integer layouts exactly (kernels/quant.py). Twins:
// `quant.QuantLinear.dequantize` then F.linear; F.linear for float32.
//
// Plain C ABI (loaded with ctypes by kernels/cpu_quant.py), OpenMP over output rows with the
// thread count the caller passes (torch.get_num_threads()).
// AVX2 + FMA intrinsics where the build targets them (x86-64-v3 and v4; cpu_build.py builds one
// object per level), else portable scalar code.
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
// Why a float32 path: at one to a few rows a GEMM is a GEMV, bound by reading the weight once.
// torch's BLAS `mm` read the 49152 x 576 head at 10-15 GB/s at 4-8 rows on a 2-core machine that
// streams 21-26 GB/s (and at 13-14 GB/s even at one row on another); this loop keeps two FMA chains
// per activation row, so that loads, not FMA latency, bound it: 9-10 % off a decode step at batch
// 4-8 (bench/results/serving_real_cpu.md, "The head on a weight-streaming kernel").

#include <cstdint>
#include <cstring>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

constexpr int GROUP = 32;

#if defined(__AVX2__) && defined(__FMA__)
// AVX2 + FMA (x86-64-v3 and v4): a group's 32 weights as four 8-float registers.
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

// x[0:16] . w[0:16] into two accumulators (two FMA chains in flight per activation row).
inline void dot16_f32(__m256* acc, const float* x, const float* w) {
  acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(w), acc[0]);
  acc[1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8), _mm256_loadu_ps(w + 8), acc[1]);
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

// out[t, n] for TT rows of x (row stride K) and the float32 weight row w[n] (K % 32 == 0).
template <int TT>
inline void row_dot_f32(const float* x, int64_t K, const float* w, int64_t n, int64_t N, float* out) {
  const float* wr = w + n * K;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc[TT][2];
  for (int t = 0; t < TT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    for (int t = 0; t < TT; ++t) dot16_f32(acc[t], x + t * K + k, wr + k);
  }
  for (int t = 0; t < TT; ++t) out[t * N + n] = acc_sum(_mm256_add_ps(acc[t][0], acc[t][1]));
#else
  float acc[TT][16] = {};
  for (int64_t k = 0; k < K; k += 16) {
    for (int t = 0; t < TT; ++t)
      for (int j = 0; j < 16; ++j) acc[t][j] += x[t * K + k + j] * wr[k + j];
  }
  for (int t = 0; t < TT; ++t) {
    float s = 0.0f;
    for (float v : acc[t]) s += v;
    out[t * N + n] = s;
  }
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
// One activation row against four weight rows n..n+3 (four streams in flight, eight FMA chains).
inline void gemv4_f32(const float* x, int64_t K, const float* w, int64_t n, int64_t N, float* out) {
  const float* r[4] = {w + n * K, w + (n + 1) * K, w + (n + 2) * K, w + (n + 3) * K};
  __m256 acc[4][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
  // the next block of four rows (contiguous after these) is fetched while these are read: one line of
  // it per 16 floats of each row here, i.e. all of it by the end
  const int64_t next = (n + 4) * K, end = N * K;  // in floats; a 64-byte line holds 16
  for (int64_t k = 0; k < K; k += 16) {
    for (int i = 0; i < 4; ++i) {
      const int64_t line = next + (k / 16 * 4 + i) * 16;
      if (line < end) _mm_prefetch(reinterpret_cast<const char*>(w + line), _MM_HINT_T0);
      dot16_f32(acc[i], x + k, r[i] + k);
    }
  }
  for (int i = 0; i < 4; ++i) out[n + i] = acc_sum(_mm256_add_ps(acc[i][0], acc[i][1]));
}
#endif

void linear_f32(const float* x, int64_t T, int64_t K, const float* w, int64_t N, float* out, int threads) {
  const bool par = N * K * (T < 8 ? T : 8) >= (1 << 16) && threads > 1;
#if defined(__AVX2__) && defined(__FMA__)
  if (T == 1 && N % 4 == 0) {
#pragma omp parallel for schedule(static) num_threads(threads) if (par)
    for (int64_t n = 0; n < N; n += 4) gemv4_f32(x, K, w, n, N, out);
    return;
  }
#endif
#pragma omp parallel for schedule(static) num_threads(threads) if (par)
  for (int64_t n = 0; n < N; ++n) {
    int64_t t = 0;
    for (; t + 4 <= T; t += 4) row_dot_f32<4>(x + t * K, K, w, n, N, out + t * N);
    if (T - t >= 2) {
      row_dot_f32<2>(x + t * K, K, w, n, N, out + t * N);
      t += 2;
    }
    if (T - t >= 1) row_dot_f32<1>(x + t * K, K, w, n, N, out + t * N);
  }
}

template <int BITS>
inline W group(const void* qw, const float* sc, const float* zr, int64_t n, int64_t K, int64_t g) {
  const int64_t G = K / GROUP;
  if constexpr (BITS == 4)
    return group4(static_cast<const uint8_t*>(qw) + n * (K / 2), sc + n * G, zr + n * G, g);
  else
    return group8(static_cast<const int8_t*>(qw) + n * K, sc + n * G, g);
}

// out[t, n] for TT rows of x starting at x (row stride K) and output row n: each group's weights
// are rebuilt once and used by all TT rows.
template <int BITS, int TT>
inline void row_dot(const float* x, int64_t K, const void* qw, const float* sc, const float* zr,
                    int64_t n, int64_t N, float* out) {
  const int64_t G = K / GROUP;
  Acc acc[TT];
  for (int t = 0; t < TT; ++t) acc[t] = acc_zero();
  for (int64_t g = 0; g < G; ++g) {
    const W w = group<BITS>(qw, sc, zr, n, K, g);
    const float* xg = x + g * GROUP;
    for (int t = 0; t < TT; ++t) acc[t] = acc_dot(acc[t], xg + t * K, w);
  }
  for (int t = 0; t < TT; ++t) out[t * N + n] = acc_sum(acc[t]);
}

template <int BITS>
void linear(const float* x, int64_t T, int64_t K, const void* qw, const float* sc, const float* zr,
            int64_t N, float* out, int threads) {
  const bool par = N * K * (T < 8 ? T : 8) >= (1 << 16) && threads > 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (par)
  for (int64_t n = 0; n < N; ++n) {
    int64_t t = 0;
    for (; t + 8 <= T; t += 8) row_dot<BITS, 8>(x + t * K, K, qw, sc, zr, n, N, out + t * N);
    if (T - t >= 4) {
      row_dot<BITS, 4>(x + t * K, K, qw, sc, zr, n, N, out + t * N);
      t += 4;
    }
    if (T - t >= 2) {
      row_dot<BITS, 2>(x + t * K, K, qw, sc, zr, n, N, out + t * N);
      t += 2;
    }
    if (T - t >= 1) row_dot<BITS, 1>(x + t * K, K, qw, sc, zr, n, N, out + t * N);
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
    linear_f32(x, T, K, static_cast<const float*>(qw), N, out, threads);
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
