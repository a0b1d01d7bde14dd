// Weight-only quantized linear layers on CPU: float32 activations times weights kept as 4-bit or
// 8-bit integers in groups of 32 along the input dimension, each group with a float32 scale (and,
// for 4-bit, a float32 zero): w = q * scale + zero. GGUF's Q4_0, Q4_1 and Q4_K and Q8_0 map onto
// this exactly (kernels/quant.py). Twin: `quant.QuantLinear.dequantize` then F.linear.
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
//   scales, zeros: float32 [N, G].
// The weight is rebuilt as q * scale + zero in float32: q * scale is exact for the GGUF formats
// (an 11-bit or 17-bit scale times a 4-bit or 8-bit integer fits float32's 24 bits), so the
// rebuilt weights are bit-identical to gguf-py's (and transformers') de-quantized float32 ones
// whether or not the compiler fuses the multiply-add. Only the summation order of the dot
// products differs from a float32 GEMM.

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

int mdq_abi_version() { return 1; }

// out [T, N] = x [T, K] @ W.T for the quantized W; bits 4 or 8 (zeros ignored for 8). K % 32 == 0,
// x and out contiguous float32 (the wrapper checks).
void mdq_linear(int bits, const float* x, int64_t T, int64_t K, const void* qw, const float* scales,
                const float* zeros, int64_t N, float* out, int threads) {
  if (bits == 4)
    linear<4>(x, T, K, qw, scales, zeros, N, out, threads);
  else
    linear<8>(x, T, K, qw, scales, zeros, N, out, threads);
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
