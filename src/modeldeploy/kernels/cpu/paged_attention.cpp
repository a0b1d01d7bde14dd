// Paged attention on CPU, reading K/V blocks in place (no per-sequence contiguous copy).
// Twins: kernels/reference.py paged_attention_decode / paged_attention_prefill.
//
// Plain C ABI (loaded with ctypes by kernels/cpu_attention.py), OpenMP for threads: the
// process shares torch's libgomp; the caller passes torch.get_num_threads() (OpenMP's own
// thread count is per calling thread, and the engine may step on a thread of its own).
//
// Layouts: q [T, H, D] with token stride q_s0 (head stride D, elements contiguous),
// caches [N, S, Hkv, D] contiguous, tables [B, M] int32 with row stride t_s0, out [T, H, D]
// contiguous. Math in float32. One task = (sequence, kv head[, query tile]); the GROUP
// query heads of a kv head share each K/V row load (GQA). Two passes over the keys:
// scores (exact max), then exp-weighted V sum, so no online rescaling is needed.
// Float32 prefill tiles put their query rows along the vector lanes instead (attend_lanes).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

inline float to_f(float x) { return x; }
inline float to_f(uint16_t x) {  // bfloat16 bits
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline void from_f(float x, float* o) { *o = x; }
inline void from_f(float x, uint16_t* o) {  // round to nearest even, as torch does
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    *o = static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  *o = static_cast<uint16_t>(u >> 16);
}

// 8-lane float vectors (GCC/Clang vector extensions: AVX2 or AVX-512 halves, SSE pairs).
// Head dims are multiples of 8 (the wrapper checks); D is a compile-time constant for the
// common head dims so the dot products and accumulators stay in registers.
typedef float v8 __attribute__((vector_size(32)));

inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof v); }

inline float hsum(v8 v) {  // tree reduction (a serial lane sum would cost ~16 add latencies)
  v8 a = v + __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  a = a + __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5);
  a = a + __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6);
  return a[0];
}

inline float hmax(v8 v) {
  v8 a = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  a = v > a ? v : a;
  v8 b = __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5);
  a = a > b ? a : b;
  b = __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6);
  a = a > b ? a : b;
  return a[0];
}

// The sums of 8 vectors at once, lane u = the sum of a[u]: 14 shuffles and 7 adds where 8
// hsum calls take 24 and 24. The scores of 8 keys come out as one vector.
inline v8 reduce8(const v8* a) {
  v8 p[4], w[2];
  for (int i = 0; i < 4; ++i)  // lanes alternate a[2i], a[2i+1]
    p[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 8, 1, 9, 2, 10, 3, 11) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 12, 5, 13, 6, 14, 7, 15);
  for (int i = 0; i < 2; ++i)  // lanes u and u + 4 hold halves of a[4i + u]
    w[i] = __builtin_shufflevector(p[2 * i], p[2 * i + 1], 0, 1, 8, 9, 2, 3, 10, 11) +
           __builtin_shufflevector(p[2 * i], p[2 * i + 1], 4, 5, 12, 13, 6, 7, 14, 15);
  return __builtin_shufflevector(w[0], w[1], 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(w[0], w[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

// exp of 8 lanes (Cephes' expf: range reduction by ln 2 in two parts, a degree-5 polynomial,
// 2^n through the exponent bits; within 2 ulp of expf). The softmax's exps were scalar libm
// calls: about half of the decode kernel's compute. Inputs here are scores minus their max
// (<= 0) or SiLU's -x; lanes are clamped to [ln(FLT_MIN), 88] (below, the result ~1e-38 rounds
// away in a softmax sum or in 1 + e, where expf would return a denormal or 0; above, SiLU's
// x / (1 + e) is -0 either way).
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef uint32_t vu8 __attribute__((vector_size(32)));
template <typename V, typename VI, typename VU>
inline V expv(V x) {
  const V hi = V{} + 88.0f, lo = V{} - 87.3365447504019f;
  x = x > hi ? hi : x;  // written so that a NaN lane stays NaN (and so does its result)
  x = x < lo ? lo : x;
  const V fx = x * 1.44269504088896341f + 0.5f;
  VI n = __builtin_convertvector(fx, VI);  // toward zero, then down to floor(fx)
  n += (__builtin_convertvector(n, V) > fx);  // a true comparison lane is -1
  const V nf = __builtin_convertvector(n, V);
  x = x - nf * 0.693359375f - nf * -2.12194440e-4f;
  V y = V{} + 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * (x * x) + x + 1.0f;
  const VU bits = (VU)(n + 127) << 23;  // unsigned: a NaN lane's n is INT_MIN
  V scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}
inline v8 exp8(v8 x) { return expv<v8, vi8, vu8>(x); }
inline float exp1(float x) { return exp8(v8{} + x)[0]; }

template <int DC>
inline float dot(const float* __restrict a, const float* __restrict b, int Drt) {
  const int D = DC > 0 ? DC : Drt;
  v8 s0 = {}, s1 = {};
  int d = 0;
  for (; d + 16 <= D; d += 16) {
    s0 += load8(a + d) * load8(b + d);
    s1 += load8(a + d + 8) * load8(b + d + 8);
  }
  if (d < D) s0 += load8(a + d) * load8(b + d);
  return hsum(s0 + s1);
}

// Blocks are scattered, so the hardware prefetcher cannot see the next one coming: ask for
// the next block's rows of this kv head while the current one is being used.
template <typename T>
inline void prefetch_block(const T* cache, int64_t base, int S, int h, int Hkv, int D) {
  const int lines = (D * static_cast<int>(sizeof(T)) + 63) / 64;
  for (int o = 0; o < S; ++o) {
    const char* p = reinterpret_cast<const char*>(cache + ((base + o) * Hkv + h) * D);
    for (int c = 0; c < lines; ++c) __builtin_prefetch(p + 64 * c, 0, 3);
  }
}

// Row `t` of a K or V cache for kv head h, as float (converted into buf unless T is float).
template <typename T>
inline const float* row(const T* cache, int64_t slot, int h, int Hkv, int D, float* buf) {
  const T* p = cache + (slot * Hkv + h) * D;
  if constexpr (sizeof(T) == sizeof(float)) {
    (void)buf;
    return reinterpret_cast<const float*>(p);
  } else {
    for (int d = 0; d < D; ++d) buf[d] = to_f(p[d]);
    return buf;
  }
}

// ---- Prefill on float32 caches: query rows along the vector lanes ----
// A prefill task has R = tile x GROUP query rows (48 on SmolLM2) over up to thousands of keys.
// The dot-product form below reloads every key row once per query row and spends a cross-lane
// reduction per 8 keys, and reloads each V row per query row: it held 105-108 GFLOP/s on 2 cores
// of an AVX-512 Xeon where MKL's GEMMs run at ~320, and a 1536-token prompt spent 0.76 s of its
// ~1.9 s in attention (bench/results/paged_attention_cpu.md). Here the tile's rows lie along the
// lanes instead (qt [D][RP], RP = R rounded up to the width W): a key's score for W rows is an FMA
// per d with the key's element broadcast, KT keys x NR row vectors in registers, no reduction;
// the softmax runs down the keys lane-wise (no horizontal max or sum either); and pass 2 keeps
// DT output dims x NR row vectors in registers, one broadcast V element and NR weight vectors a
// key. Transposing the query tile in and the output tile out costs R x D moves each, once a task.
// W is the widest vector the build targets: 16 lanes with AVX-512, else 8.
#if defined(__AVX512F__)
constexpr int W = 16;
constexpr int KT = 8, NR = 3, DT = 8;  // 24 accumulators + 3 vectors of 32 registers
#else
constexpr int W = 8;
constexpr int KT = 4, NR = 3, DT = 4;  // 12 accumulators + 3 vectors of 16 registers
#endif
typedef float vw __attribute__((vector_size(4 * W)));
typedef int32_t viw __attribute__((vector_size(4 * W)));
typedef uint32_t vuw __attribute__((vector_size(4 * W)));

inline vw loadw(const float* p) {
  vw v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void storew(float* p, vw v) { std::memcpy(p, &v, sizeof v); }

// Scores of keys t..t+K-1 (rows krow[0..K-1]) for the N row vectors at qt, st, lastv, mx (all
// already offset to the row group): st[t][lanes], -inf past a lane's last key; mx keeps the max.
template <int D, int K, int N>
inline void lane_scores(const float* qt, int RP, const float* const* krow, int t, const viw* lastv,
                        float* st, vw* mx) {
  vw acc[K][N];
  for (int u = 0; u < K; ++u)
    for (int c = 0; c < N; ++c) acc[u][c] = vw{};
  for (int d = 0; d < D; ++d) {
    vw qv[N];
    for (int c = 0; c < N; ++c) qv[c] = loadw(qt + d * RP + c * W);
    for (int u = 0; u < K; ++u) {
      const float kd = krow[u][d];
      for (int c = 0; c < N; ++c) acc[u][c] += kd * qv[c];
    }
  }
  const vw ninf = vw{} - std::numeric_limits<float>::infinity();
  for (int u = 0; u < K; ++u)
    for (int c = 0; c < N; ++c) {
      const vw v = (viw{} + (t + u) > lastv[c]) ? ninf : acc[u][c];
      storew(st + static_cast<int64_t>(t + u) * RP + c * W, v);
      mx[c] = v > mx[c] ? v : mx[c];
    }
}

template <int D, int K>
inline void lane_scores_rows(const float* qt, int RP, int NV, const float* const* krow, int t,
                             const viw* lastv, float* st, vw* mx) {
  for (int c = 0; c < NV; c += NR) {
    const int n = NV - c < NR ? NV - c : NR;
    const float* q = qt + c * W;
    float* s = st + c * W;
    if (n == 3) lane_scores<D, K, 3>(q, RP, krow, t, lastv + c, s, mx + c);
    else if (n == 2) lane_scores<D, K, 2>(q, RP, krow, t, lastv + c, s, mx + c);
    else lane_scores<D, K, 1>(q, RP, krow, t, lastv + c, s, mx + c);
  }
}

// ot[d][lanes] += sum over the n keys of one block (V rows vrow, from key t0) of st[t][lanes]
// V[t][d], for dims d0..d0+DT-1 and the N row vectors at st, ot (offset to the row group). A
// whole block is swept for every (row group, dim tile) while its V rows sit in L1: walking all
// keys per dim tile instead touched a new cache line per key and waited on L2 for each.
template <int D, int N>
inline void lane_weigh(const float* st, int RP, int t0, int n, const float* const* vrow, int d0,
                       float* ot) {
  vw acc[DT][N];
  for (int dd = 0; dd < DT; ++dd)
    for (int c = 0; c < N; ++c) acc[dd][c] = loadw(ot + (d0 + dd) * RP + c * W);
  for (int o = 0; o < n; ++o) {
    const float* v = vrow[o] + d0;
    const float* w = st + static_cast<int64_t>(t0 + o) * RP;
    vw wv[N];
    for (int c = 0; c < N; ++c) wv[c] = loadw(w + c * W);
    for (int dd = 0; dd < DT; ++dd) {
      const float vd = v[dd];
      for (int c = 0; c < N; ++c) acc[dd][c] += vd * wv[c];
    }
  }
  for (int dd = 0; dd < DT; ++dd)
    for (int c = 0; c < N; ++c) storew(ot + (d0 + dd) * RP + c * W, acc[dd][c]);
}

// Row pointers of block j (keys t0.., S of them or up to L) of kv head h; returns how many.
// Prefetches blocks 0 and 1 on the first call and the block two ahead on every call.
inline int block_rows(const float* cache, const int32_t* table, int j, int t0, int L, int S, int h,
                      int Hkv, int D, const float** rows) {
  if (j == 0) {
    prefetch_block(cache, static_cast<int64_t>(table[0]) * S, S, h, Hkv, D);
    if (S < L) prefetch_block(cache, static_cast<int64_t>(table[1]) * S, S, h, Hkv, D);
  }
  if (t0 + 2 * S < L) prefetch_block(cache, static_cast<int64_t>(table[j + 2]) * S, S, h, Hkv, D);
  const int64_t base = static_cast<int64_t>(table[j]) * S;
  const int n = (L - t0 < S) ? L - t0 : S;
  for (int o = 0; o < n; ++o) rows[o] = cache + ((base + o) * Hkv + h) * D;
  return n;
}

// The same result as attend_rows: normalised rows into acc [R, D].
template <int D>
void attend_lanes(const float* qf, int R, const int* last, const float* kc, const float* vc,
                  const int32_t* table, int L, int S, int h, int Hkv, float* acc) {
  const int RP = (R + W - 1) / W * W, NV = RP / W;
  thread_local std::vector<float> qt, st, ot;
  thread_local std::vector<vw> mx, inv;
  thread_local std::vector<viw> lastv;
  qt.assign(static_cast<size_t>(D) * RP, 0.f);
  st.resize(static_cast<size_t>(L) * RP);
  mx.assign(NV, vw{} - std::numeric_limits<float>::infinity());
  inv.assign(NV, vw{});
  lastv.assign(NV, viw{} + (L - 1));  // padding lanes (q = 0) see every key: finite, unused
  for (int r = 0; r < R; ++r) {
    lastv[r / W][r % W] = last[r];
    for (int d = 0; d < D; ++d) qt[d * RP + r] = qf[r * D + d];
  }
  // pass 1: scores, block by block, KT keys at a time
  for (int j = 0, t0 = 0; t0 < L; ++j, t0 += S) {
    const float* krow[64];  // S <= 64 (the wrapper checks)
    const int n = block_rows(kc, table, j, t0, L, S, h, Hkv, D, krow);
    int o = 0;
    for (; o + KT <= n; o += KT)
      lane_scores_rows<D, KT>(qt.data(), RP, NV, krow + o, t0 + o, lastv.data(), st.data(), mx.data());
    for (; o < n; ++o)
      lane_scores_rows<D, 1>(qt.data(), RP, NV, krow + o, t0 + o, lastv.data(), st.data(), mx.data());
  }
  // softmax down the keys, lane-wise; weights past a lane's last key are exactly 0
  std::vector<vw>& sum = inv;
  for (int t = 0; t < L; ++t)
    for (int c = 0; c < NV; ++c) {
      float* p = st.data() + static_cast<int64_t>(t) * RP + c * W;
      vw e = expv<vw, viw, vuw>(loadw(p) - mx[c]);
      e = (viw{} + t > lastv[c]) ? vw{} : e;
      storew(p, e);
      sum[c] += e;
    }
  for (int c = 0; c < NV; ++c) inv[c] = 1.f / sum[c];
  // pass 2: weighted V into ot [D][RP] block by block, then back to rows, normalised
  ot.assign(static_cast<size_t>(D) * RP, 0.f);
  for (int j = 0, t0 = 0; t0 < L; ++j, t0 += S) {
    const float* vrow[64];
    const int n = block_rows(vc, table, j, t0, L, S, h, Hkv, D, vrow);
    for (int c = 0; c < NV; c += NR) {
      const int g = NV - c < NR ? NV - c : NR;
      const float* sc = st.data() + c * W;
      float* oc = ot.data() + c * W;
      for (int d0 = 0; d0 < D; d0 += DT) {
        if (g == 3) lane_weigh<D, 3>(sc, RP, t0, n, vrow, d0, oc);
        else if (g == 2) lane_weigh<D, 2>(sc, RP, t0, n, vrow, d0, oc);
        else lane_weigh<D, 1>(sc, RP, t0, n, vrow, d0, oc);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int d = 0; d < D; ++d) acc[r * D + d] = ot[d * RP + r] * inv[r / W][r % W];
}

// Attention of R query rows (qf [R, D], already scaled) over the keys 0..L-1 of one sequence's
// block table, row r seeing keys 0..last[r]. Writes normalised rows into acc [R, D].
template <typename T, int DC>
void attend_rows(const float* qf, int R, const int* last, const T* kc, const T* vc,
                 const int32_t* table, int L, int S, int h, int Hkv, int Drt, float* scores,
                 float* acc, float* buf) {
  const int D = DC > 0 ? DC : Drt;
  const float ninf = -std::numeric_limits<float>::infinity();
  if constexpr (DC > 0 && DC % DT == 0 && sizeof(T) == sizeof(float)) {
    if (R >= 2 * W) {  // prefill tiles; decode's GROUP rows keep the dot form
      attend_lanes<DC>(qf, R, last, reinterpret_cast<const float*>(kc),
                       reinterpret_cast<const float*>(vc), table, L, S, h, Hkv, acc);
      return;
    }
  }
  prefetch_block(kc, static_cast<int64_t>(table[0]) * S, S, h, Hkv, D);
  if (S < L) prefetch_block(kc, static_cast<int64_t>(table[1]) * S, S, h, Hkv, D);
  constexpr bool grouped = DC > 0 && sizeof(T) == sizeof(float);
  for (int j = 0, t0 = 0; t0 < L; ++j, t0 += S) {  // pass 1: scores [R, L]
    const int64_t base = static_cast<int64_t>(table[j]) * S;
    const int n = (L - t0 < S) ? L - t0 : S;
    if (t0 + 2 * S < L) prefetch_block(kc, static_cast<int64_t>(table[j + 2]) * S, S, h, Hkv, D);
    int o0 = 0;
    if constexpr (grouped) {  // 8 keys at a time: 8 independent dot chains, one reduction
      constexpr int NV = DC / 8;
      for (; o0 + 8 <= n; o0 += 8) {
        const float* k8[8];
        for (int u = 0; u < 8; ++u) k8[u] = row(kc, base + o0 + u, h, Hkv, D, buf);
        for (int r = 0; r < R; ++r) {
          const float* qr = qf + r * D;
          v8 qv[NV], part[8];
          for (int c = 0; c < NV; ++c) qv[c] = load8(qr + 8 * c);
          for (int u = 0; u < 8; ++u) {
            v8 a = qv[0] * load8(k8[u]);
            for (int c = 1; c < NV; ++c) a += qv[c] * load8(k8[u] + 8 * c);
            part[u] = a;
          }
          float* dst = scores + static_cast<int64_t>(r) * L + t0 + o0;
          store8(dst, reduce8(part));
          for (int u = 0; u < 8; ++u)
            if (t0 + o0 + u > last[r]) dst[u] = ninf;
        }
      }
    }
    for (int o = o0; o < n; ++o) {
      const int t = t0 + o;
      const float* k = row(kc, base + o, h, Hkv, D, buf);
      for (int r = 0; r < R; ++r)
        scores[static_cast<int64_t>(r) * L + t] = (t <= last[r]) ? dot<DC>(qf + r * D, k, D) : ninf;
    }
  }
  thread_local std::vector<float> inv;
  inv.resize(R);
  for (int r = 0; r < R; ++r) {  // softmax per row, 8 lanes at a time
    float* s = scores + static_cast<int64_t>(r) * L;
    const int n = last[r] + 1;
    v8 vm = v8{} + ninf;
    int t = 0;
    for (; t + 8 <= n; t += 8) {
      const v8 x = load8(s + t);
      vm = x > vm ? x : vm;
    }
    float m = hmax(vm);
    for (; t < n; ++t) m = s[t] > m ? s[t] : m;
    v8 vs = {};
    for (t = 0; t + 8 <= n; t += 8) {
      const v8 e = exp8(load8(s + t) - m);
      store8(s + t, e);
      vs += e;
    }
    float sum = hsum(vs);
    for (; t < n; ++t) {
      s[t] = exp1(s[t] - m);
      sum += s[t];
    }
    inv[r] = 1.f / sum;
  }
  std::memset(acc, 0, sizeof(float) * R * D);
  constexpr int NV = DC > 0 ? DC / 8 : 1;
  prefetch_block(vc, static_cast<int64_t>(table[0]) * S, S, h, Hkv, D);
  if (S < L) prefetch_block(vc, static_cast<int64_t>(table[1]) * S, S, h, Hkv, D);
  for (int j = 0, t0 = 0; t0 < L; ++j, t0 += S) {  // pass 2: weighted V
    const int64_t base = static_cast<int64_t>(table[j]) * S;
    const int n = (L - t0 < S) ? L - t0 : S;
    if (t0 + 2 * S < L) prefetch_block(vc, static_cast<int64_t>(table[j + 2]) * S, S, h, Hkv, D);
    const float* vrows[64];  // S <= 64 (the wrapper checks)
    for (int o = 0; o < n; ++o) {
      vrows[o] = row(vc, base + o, h, Hkv, D, buf + static_cast<int64_t>(o) * D);
    }
    for (int r = 0; r < R; ++r) {
      const int m = (last[r] - t0 + 1 < n) ? last[r] - t0 + 1 : n;  // keys of the block it sees
      if (m <= 0) continue;
      const float* w = scores + static_cast<int64_t>(r) * L + t0;
      float* a = acc + r * D;
      if constexpr (DC > 0) {  // accumulator row in registers across the block
        v8 reg[NV];
        for (int c = 0; c < NV; ++c) reg[c] = load8(a + 8 * c);
        for (int o = 0; o < m; ++o) {
          const float* v = vrows[o];
          for (int c = 0; c < NV; ++c) reg[c] += w[o] * load8(v + 8 * c);
        }
        for (int c = 0; c < NV; ++c) store8(a + 8 * c, reg[c]);
      } else {
        for (int o = 0; o < m; ++o)
          for (int d = 0; d < D; d += 8) store8(a + d, load8(a + d) + w[o] * load8(vrows[o] + d));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int d = 0; d < D; ++d) acc[r * D + d] *= inv[r];
}

// Queries `tokens` (indices into q/out, consecutive positions pos0, pos0+1, ...) of one
// sequence, for kv head h: load, attend, store.
template <typename T>
void run_tile(const T* q, int64_t q_s0, const T* kc, const T* vc, const int32_t* table, int L,
              int64_t tok0, int ntok, int pos0, T* out, int h, int H, int Hkv, int D,
              int S, float scale) {
  const int G = H / Hkv, R = ntok * G;
  // Scratch per thread, kept across tasks and calls (OpenMP's threads persist): five heap
  // allocations per task before.
  thread_local std::vector<float> qf, acc, buf, scores;
  thread_local std::vector<int> last;
  qf.resize(static_cast<size_t>(R) * D);
  acc.resize(static_cast<size_t>(R) * D);
  buf.resize(static_cast<size_t>(S) * D);
  scores.resize(static_cast<size_t>(R) * L);
  last.resize(R);
  for (int i = 0; i < ntok; ++i)
    for (int g = 0; g < G; ++g) {
      const int r = i * G + g;
      last[r] = pos0 + i;
      const T* src = q + (tok0 + i) * q_s0 + static_cast<int64_t>(h * G + g) * D;
      for (int d = 0; d < D; ++d) qf[r * D + d] = to_f(src[d]) * scale;
    }
  float *sc = scores.data(), *ac = acc.data(), *bf = buf.data();
  switch (D) {
    case 64: attend_rows<T, 64>(qf.data(), R, last.data(), kc, vc, table, L, S, h, Hkv, D, sc, ac, bf); break;
    case 128: attend_rows<T, 128>(qf.data(), R, last.data(), kc, vc, table, L, S, h, Hkv, D, sc, ac, bf); break;
    case 32: attend_rows<T, 32>(qf.data(), R, last.data(), kc, vc, table, L, S, h, Hkv, D, sc, ac, bf); break;
    default: attend_rows<T, 0>(qf.data(), R, last.data(), kc, vc, table, L, S, h, Hkv, D, sc, ac, bf);
  }
  for (int i = 0; i < ntok; ++i)
    for (int g = 0; g < G; ++g) {
      T* dst = out + ((tok0 + i) * H + h * G + g) * static_cast<int64_t>(D);
      const float* a = acc.data() + (i * G + g) * D;
      for (int d = 0; d < D; ++d) from_f(a[d], dst + d);
    }
}

template <typename T>
void decode(const T* q, int64_t q_s0, const T* kc, const T* vc, const int32_t* tables,
            int64_t t_s0, const int32_t* lens, T* out, int B, int H, int Hkv, int D, int S,
            float scale, int threads) {
  const int64_t tasks = static_cast<int64_t>(B) * Hkv;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t x = 0; x < tasks; ++x) {
    const int b = static_cast<int>(x / Hkv), h = static_cast<int>(x % Hkv);
    const int L = lens[b];
    run_tile(q, q_s0, kc, vc, tables + b * t_s0, L, b, 1, L - 1, out, h, H, Hkv, D, S, scale);
  }
}

// Prefill: sequence b's new tokens are q rows cu[b]..cu[b+1]-1, the last of its lens[b]
// cached tokens. Tasks = (sequence, kv head, tile of `tile` query tokens).
template <typename T>
void prefill(const T* q, int64_t q_s0, const T* kc, const T* vc, const int32_t* tables,
             int64_t t_s0, const int32_t* cu, const int32_t* lens, T* out, int B, int H, int Hkv,
             int D, int S, int tile, float scale, int threads) {
  std::vector<int64_t> first(B + 1, 0);  // first task of each sequence
  for (int b = 0; b < B; ++b) {
    const int n = cu[b + 1] - cu[b];
    first[b + 1] = first[b] + static_cast<int64_t>((n + tile - 1) / tile) * Hkv;
  }
  const int64_t tasks = first[B];
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t x = 0; x < tasks; ++x) {
    int b = 0;
    while (first[b + 1] <= x) ++b;
    const int64_t local = x - first[b];
    const int h = static_cast<int>(local % Hkv), ti = static_cast<int>(local / Hkv);
    const int n = cu[b + 1] - cu[b], L = lens[b];
    const int i0 = ti * tile, ntok = (n - i0 < tile) ? n - i0 : tile;
    const int pos0 = L - n + i0;
    // keys beyond the tile's last query are never seen: attend over pos0 + ntok of them
    run_tile(q, q_s0, kc, vc, tables + b * t_s0, pos0 + ntok, cu[b] + i0, ntok, pos0, out, h,
             H, Hkv, D, S, scale);
  }
}

// Rotary embedding in place (twin: reference.rotary_embedding, NeoX halves). The twin rounds
// each product and the sum separately (and casts cos/sin to the tensor's dtype first), so
// contraction into FMAs is off here: fp32 results equal the twin bit for bit.
// Residual add + RMSNorm (twin: reference.rms_norm, HF LlamaRMSNorm): with a residual, the sum
// x + residual is rounded to the dtype and written to new_res (the next layer's residual); the
// statistics are float32; the normalised row is rounded to the dtype before the weight multiply.
// One pass to sum (and store the residual), one to write, where the torch twin makes ~6 passes
// and allocates ~4 temporaries per call. Rows split over threads only when there are enough.
template <typename T>
void rms_rows(const T* x, int64_t x_s0, const T* res, int64_t r_s0, T* new_res, const T* w,
              T* out, int rows, int E, float eps, int threads) {
  const bool par = static_cast<int64_t>(rows) * E >= (1 << 16) && threads > 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (par)
  for (int r = 0; r < rows; ++r) {
    const T* xr = x + r * x_s0;
    const T* src = xr;
    if (res) {
      const T* rr = res + r * r_s0;
      T* nr = new_res + static_cast<int64_t>(r) * E;
      for (int i = 0; i < E; ++i) from_f(to_f(xr[i]) + to_f(rr[i]), nr + i);
      src = nr;
    }
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 8 partial sums: the loop vectorises
    int i = 0;
    for (; i + 8 <= E; i += 8)
      for (int j = 0; j < 8; ++j) {
        const float v = to_f(src[i + j]);
        acc[j] += v * v;
      }
    float ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < E; ++i) ss += to_f(src[i]) * to_f(src[i]);
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(E) + eps);
    T* o = out + static_cast<int64_t>(r) * E;
    for (int k = 0; k < E; ++k) {
      T n;
      from_f(to_f(src[k]) * inv, &n);
      from_f(to_f(w[k]) * to_f(n), o + k);
    }
  }
}

// SiLU(gate) * up over rows [gate | up] of x ([rows, 2I], row stride x_s0) into out [rows, I]
// (twin: reference.silu_and_mul, torch's silu then a multiply: one pass here, no temporaries).
// silu(g) = g / (1 + exp(-g)) as torch computes it; exp within 2 ulp of torch's; bfloat16 rounds
// the SiLU and the product as the twin's two ops do.
template <typename T>
void silu_mul_rows(const T* x, int64_t x_s0, T* out, int rows, int I, int threads) {
  const bool par = static_cast<int64_t>(rows) * I >= (1 << 15) && threads > 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (par)
  for (int r = 0; r < rows; ++r) {
    const T* g = x + r * x_s0;
    const T* u = g + I;
    T* o = out + static_cast<int64_t>(r) * I;
    int i = 0;
    if constexpr (sizeof(T) == sizeof(float)) {
      for (; i + 8 <= I; i += 8) {
        const v8 gv = load8(g + i);
        store8(o + i, gv / (1.0f + exp8(-gv)) * load8(u + i));
      }
    }
    for (; i < I; ++i) {
      const float gv = to_f(g[i]);
      T act;
      from_f(gv / (1.0f + exp1(-gv)), &act);
      from_f(to_f(act) * to_f(u[i]), o + i);
    }
  }
}

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
template <typename T>
inline void rotate_row(T* __restrict r, const float* __restrict cf, const float* __restrict sf,
                       int half) {
  for (int i = 0; i < half; ++i) {
    const float x1 = to_f(r[i]), x2 = to_f(r[i + half]);
    T a, b, e, f;
    from_f(x1 * cf[i], &a);
    from_f(-x2 * sf[i], &b);
    from_f(x2 * cf[i], &e);
    from_f(x1 * sf[i], &f);
    from_f(to_f(a) + to_f(b), r + i);
    from_f(to_f(e) + to_f(f), r + i + half);
  }
}

template <typename T>
void rotary(const int64_t* pos, T* x, int64_t s0, int T_, int H, int D, const float* cs) {
  const int half = D / 2;
  std::vector<float> cbuf(half), sbuf(half);  // this token's cos / sin as the tensor's dtype
  for (int t = 0; t < T_; ++t) {
    const float* c = cs + pos[t] * D;
    for (int i = 0; i < half; ++i) {
      T cq, sq;
      from_f(c[i], &cq);
      from_f(c[half + i], &sq);
      cbuf[i] = to_f(cq);
      sbuf[i] = to_f(sq);
    }
    for (int h = 0; h < H; ++h)
      rotate_row(x + t * s0 + static_cast<int64_t>(h) * D, cbuf.data(), sbuf.data(), half);
  }
}
#pragma GCC pop_options

}  // namespace

extern "C" {

// Returns the number of positions outside [0, max_pos) (nothing written then: the caller raises).
int md_rotary(int dtype, const int64_t* pos, void* q, int64_t q_s0, int Hq, void* k, int64_t k_s0,
              int Hk, int T_, int D, const float* cs, int64_t max_pos) {
  int bad = 0;
  for (int t = 0; t < T_; ++t) bad += (pos[t] < 0 || pos[t] >= max_pos);
  if (bad) return bad;
  if (dtype == 0) {
    rotary(pos, static_cast<float*>(q), q_s0, T_, Hq, D, cs);
    rotary(pos, static_cast<float*>(k), k_s0, T_, Hk, D, cs);
  } else {
    rotary(pos, static_cast<uint16_t*>(q), q_s0, T_, Hq, D, cs);
    rotary(pos, static_cast<uint16_t*>(k), k_s0, T_, Hk, D, cs);
  }
  return 0;
}

// RMSNorm rows of x ([rows, E], row stride x_s0; residual likewise or null) into out and
// new_res (both [rows, E] contiguous; new_res unused without a residual). dtype as below.
void md_rms_norm(int dtype, const void* x, int64_t x_s0, const void* res, int64_t r_s0,
                 void* new_res, const void* w, void* out, int rows, int E, float eps, int threads) {
  if (dtype == 0)
    rms_rows(static_cast<const float*>(x), x_s0, static_cast<const float*>(res), r_s0,
             static_cast<float*>(new_res), static_cast<const float*>(w), static_cast<float*>(out),
             rows, E, eps, threads);
  else
    rms_rows(static_cast<const uint16_t*>(x), x_s0, static_cast<const uint16_t*>(res), r_s0,
             static_cast<uint16_t*>(new_res), static_cast<const uint16_t*>(w),
             static_cast<uint16_t*>(out), rows, E, eps, threads);
}

// SiLU-and-mul rows (see silu_mul_rows); dtype as below.
void md_silu_and_mul(int dtype, const void* x, int64_t x_s0, void* out, int rows, int I,
                     int threads) {
  if (dtype == 0)
    silu_mul_rows(static_cast<const float*>(x), x_s0, static_cast<float*>(out), rows, I, threads);
  else
    silu_mul_rows(static_cast<const uint16_t*>(x), x_s0, static_cast<uint16_t*>(out), rows, I,
                  threads);
}

int md_abi_version() { return 5; }

// KV-cache write (twin: reference.write_kv): token t's k and v rows ([Hkv, D] packed, token
// strides k_s0 / v_s0 in elements) go to flat slot slots[t] of the caches; negative skips. A row
// copy per token, no boolean masks or index tensors.
// Returns the number of slots >= num_slots (not written: the caller raises).
int md_write_kv(int elem, const void* k, int64_t k_s0, const void* v, int64_t v_s0, void* kc,
                void* vc, const int64_t* slots, int T, int64_t width, int64_t num_slots) {
  int bad = 0;
  const char* kp = static_cast<const char*>(k);
  const char* vp = static_cast<const char*>(v);
  char* kcp = static_cast<char*>(kc);
  char* vcp = static_cast<char*>(vc);
  const int64_t row = width * elem;
  for (int t = 0; t < T; ++t) {
    const int64_t s = slots[t];
    if (s < 0) continue;
    if (s >= num_slots) {
      ++bad;
      continue;
    }
    std::memcpy(kcp + s * row, kp + t * k_s0 * elem, row);
    std::memcpy(vcp + s * row, vp + t * v_s0 * elem, row);
  }
  return bad;
}

// dtype: 0 float32, 1 bfloat16
void md_paged_decode(int dtype, const void* q, int64_t q_s0, const void* kc, const void* vc,
                     const int32_t* tables, int64_t t_s0, const int32_t* lens, void* out, int B,
                     int H, int Hkv, int D, int S, float scale, int threads) {
  if (dtype == 0)
    decode(static_cast<const float*>(q), q_s0, static_cast<const float*>(kc),
           static_cast<const float*>(vc), tables, t_s0, lens, static_cast<float*>(out), B, H, Hkv,
           D, S, scale, threads);
  else
    decode(static_cast<const uint16_t*>(q), q_s0, static_cast<const uint16_t*>(kc),
           static_cast<const uint16_t*>(vc), tables, t_s0, lens, static_cast<uint16_t*>(out), B,
           H, Hkv, D, S, scale, threads);
}

void md_paged_prefill(int dtype, const void* q, int64_t q_s0, const void* kc, const void* vc,
                      const int32_t* tables, int64_t t_s0, const int32_t* cu,
                      const int32_t* lens, void* out, int B, int H, int Hkv, int D, int S,
                      int tile, float scale, int threads) {
  if (dtype == 0)
    prefill(static_cast<const float*>(q), q_s0, static_cast<const float*>(kc),
            static_cast<const float*>(vc), tables, t_s0, cu, lens, static_cast<float*>(out), B, H,
            Hkv, D, S, tile, scale, threads);
  else
    prefill(static_cast<const uint16_t*>(q), q_s0, static_cast<const uint16_t*>(kc),
            static_cast<const uint16_t*>(vc), tables, t_s0, cu, lens,
            static_cast<uint16_t*>(out), B, H, Hkv, D, S, tile, scale, threads);
}

}  // extern "C"
