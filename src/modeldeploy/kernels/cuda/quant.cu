// Weight-only quantized GEMM for kernels.quant.QuantLinear, over its in-memory layout as it is:
//   groups of 32 along K (in_features); per (row n, group g) a float32 scale s (and zero z for 4-bit)
//   4-bit: qweight uint8 [N, K/2]; within a group's 16 bytes, byte j = q[j] | q[j + 16] << 4, q in 0..15;
//          w = q * s + z          (Q4_0, Q4_1, Q4_K all land here)
//   8-bit: qweight int8 [N, K];   w = q * s   (Q8_0)
// q * s is exact in float32 (kernels/quant.py), so the weights rebuilt here equal the torch twin's
// `dequantize()` bit for bit; only the summation order of the dot products differs.
//
//   quant_gemv_kernel:     out[m, n] = round_T(sum_k x[m, k] * w[n, k] + bias[n])   (few rows)
//   quant_dequant_kernel:  w as T [N, K] (= QuantLinear.dequantize(T)), for a torch GEMM on long chunks
//
// GEMV layout (decode steps, short chunks): a block of WARPS warps owns COLS * WARPS output columns and
// ROWS rows of x. K is walked in chunks of 32 groups: the block stages the chunk of its ROWS rows of x
// in shared memory as float (each x element leaves L2 once per block, not once per column); lane l of
// a warp takes group l of the chunk for each of its COLS columns (one 16-byte load of packed 4-bit
// weights, two of 8-bit: a warp reads 512 / 1024 contiguous bytes per column), rebuilds 8 weights of
// each column at a time in registers and multiplies them into every row, each x value read from
// shared memory (16-byte reads) feeding COLS FMAs: shared memory then keeps pace with the FMA units.
// float32 accumulation; one warp reduction per (column, row) at the end.
// Unverified on a GPU: checked only through the CPU emulation (modeldeploy_dev.kernel_emulate).
#include "common.cuh"

#define QGROUP 32
#define QCHUNK_GROUPS 32  // groups of K per staged chunk: one per lane
#define QSUB 8            // weights rebuilt per column at a time (registers: COLS * QSUB)
#define QPAD 36           // shared-memory floats per group: lanes l read 16 bytes at word 36 l + j, and
                          // 36 l = 4 l (mod 32 banks) gives each 8-lane phase of a 16-byte read all 32
                          // banks once (a stride of 32 would put every lane on the same banks)
#define QCHUNK (QCHUNK_GROUPS * QPAD)  // floats per staged row (a multiple of 4: rows stay 16-byte aligned)

// 0x4B000000 is 2^23 as a float: or-ing a small integer u into its mantissa gives 2^23 + u exactly, so
// (that - 2^23) is float(u) with one integer op and one float add (integer-to-float converts run at a
// fraction of the FMA rate).
__device__ __forceinline__ float small_uint_to_float(unsigned u) {
  return __int_as_float(0x4B000000u | u) - 8388608.f;
}

// Weight j (0..31, a compile-time constant once unrolled) of a group, as float32, from its packed words.
//   4-bit: byte j % 16 holds q[j] (j < 16) in its low nibble and q[j] (j >= 16) in its high one.
//   8-bit: signed byte j; q + 128 is read as an unsigned byte, then 128 is taken off.
// q * s is exact, so w equals the twin's float32 weight (one rounding, in the + z).
template <int BITS>
__device__ __forceinline__ float dequant_one(const unsigned (&p)[BITS], int j, float s, float z) {
  if constexpr (BITS == 4) {
    const unsigned byte = (p[(j % 16) / 4] >> (8 * (j % 4))) & 0xffu;
    return small_uint_to_float(j < 16 ? byte & 15u : byte >> 4) * s + z;
  } else {
    const unsigned u = ((p[j / 4] >> (8 * (j % 4))) & 0xffu) ^ 0x80u;
    return (small_uint_to_float(u) - 128.f) * s;
  }
}

// A group's packed bytes as 32-bit words: 16 bytes (4 words) for 4-bit, 32 (8 words) for 8-bit, i.e.
// BITS words. Loaded with 16-byte loads (callers check that qweight is 16-byte aligned).
template <int BITS>
__device__ __forceinline__ void load_group(const unsigned char* __restrict__ qweight, long long n,
                                           int groups, int g, unsigned (&p)[BITS]) {
  const Vec<unsigned, 4>* src =
      reinterpret_cast<const Vec<unsigned, 4>*>(qweight + (n * groups + g) * (long long)(BITS * 4));
#pragma unroll
  for (int v = 0; v < BITS / 4; ++v) {
    const Vec<unsigned, 4> x = src[v];
#pragma unroll
    for (int i = 0; i < 4; ++i) p[4 * v + i] = x.v[i];
  }
}

// Grid: (ceil(N / (COLS * warps)), ceil(M / ROWS)); block: a multiple of 32 threads.
// x rows are 16-byte aligned (pointer and stride); zeros is nullptr for 8-bit; bias may be nullptr.
template <typename T, int BITS, int ROWS, int COLS>
__global__ void quant_gemv_kernel(T* __restrict__ out, long long out_stride,       // [M, N]
                                  const T* __restrict__ x, long long x_stride,     // [M, K]
                                  const unsigned char* __restrict__ qweight,       // [N, K*BITS/8]
                                  const float* __restrict__ scales,                // [N, K/32]
                                  const float* __restrict__ zeros,                 // [N, K/32] or null
                                  const T* __restrict__ bias,                      // [N] or null
                                  int m_dim, int n_dim, int k_dim) {
  alignas(16) __shared__ float xs[ROWS * QCHUNK];  // read back 16 bytes at a time
  constexpr int V = 16 / sizeof(T);  // elements of x per 16-byte load
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int m0 = blockIdx.y * ROWS;
  const int rows = min(ROWS, m_dim - m0);
  const int n0 = (blockIdx.x * warps + warp) * COLS;
  const int groups = k_dim / QGROUP;

  float acc[COLS][ROWS];
#pragma unroll
  for (int c = 0; c < COLS; ++c)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[c][r] = 0.f;

  for (int g0 = 0; g0 < groups; g0 += QCHUNK_GROUPS) {
    const int chunk_groups = min(QCHUNK_GROUPS, groups - g0);
    // Stage x[m0 .. m0 + rows, chunk] as float, V elements per thread per step (16-byte loads).
    const int per_row = chunk_groups * QGROUP / V;
    __syncthreads();  // the previous chunk's readers are done
    for (int i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
      const int r = i / per_row, e = (i % per_row) * V;  // e: element within the chunk
      float v[V];
      load_vec<T, V>(x + (long long)(m0 + r) * x_stride + (long long)g0 * QGROUP + e, v);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int k = e + j;  // V divides 32: the V elements share one group
        xs[r * QCHUNK + (k / QGROUP) * QPAD + k % QGROUP] = v[j];
      }
    }
    __syncthreads();
    const int g = g0 + lane;
    if (lane < chunk_groups) {
      // Issue every column's loads before any arithmetic: COLS independent 16/32-byte loads in flight.
      unsigned p[COLS][BITS];
      float s[COLS], z[COLS];
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        const int n = min(n0 + c, n_dim - 1);  // past the end: re-read the last column, never stored
        load_group<BITS>(qweight, n, groups, g, p[c]);
        s[c] = scales[(long long)n * groups + g];
        z[c] = BITS == 4 ? zeros[(long long)n * groups + g] : 0.f;
      }
      const Vec<float, 4>* xg = reinterpret_cast<const Vec<float, 4>*>(xs + lane * QPAD);  // group, row 0
#pragma unroll
      for (int j0 = 0; j0 < QGROUP; j0 += QSUB) {
        float w[COLS][QSUB];
#pragma unroll
        for (int c = 0; c < COLS; ++c)
#pragma unroll
          for (int j = 0; j < QSUB; ++j) w[c][j] = dequant_one<BITS>(p[c], j0 + j, s[c], z[c]);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          if (r < rows) {
#pragma unroll
            for (int h = 0; h < QSUB / 4; ++h) {
              const Vec<float, 4> xv = xg[(r * QCHUNK + j0) / 4 + h];
#pragma unroll
              for (int c = 0; c < COLS; ++c)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[c][r] += w[c][4 * h + j] * xv.v[j];
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < COLS; ++c) {
    const int n = n0 + c;
    const float b = bias == nullptr || n >= n_dim ? 0.f : to_float(bias[n]);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float v = warp_sum(acc[c][r]);  // every lane takes part: no early return above
      if (lane == 0 && r < rows && n < n_dim) out[(long long)(m0 + r) * out_stride + n] = from_float<T>(v + b);
    }
  }
}

// Grid: ceil(N * K/32 / blockDim.x); one thread per (row n, group g): 32 weights out with 16-byte stores.
// out is 16-byte aligned; equals QuantLinear.dequantize(T) bit for bit (float32 rebuild, one rounding).
template <typename T, int BITS>
__global__ void quant_dequant_kernel(T* __restrict__ out,                         // [N, K]
                                     const unsigned char* __restrict__ qweight,   // [N, K*BITS/8]
                                     const float* __restrict__ scales,            // [N, K/32]
                                     const float* __restrict__ zeros,             // [N, K/32] or null
                                     int n_dim, int k_dim) {
  constexpr int V = 16 / sizeof(T);
  const int groups = k_dim / QGROUP;
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)n_dim * groups) return;
  const long long n = i / groups;
  const int g = (int)(i % groups);
  unsigned p[BITS];
  load_group<BITS>(qweight, n, groups, g, p);
  const float s = scales[i], z = BITS == 4 ? zeros[i] : 0.f;
  T* o = out + i * QGROUP;  // row n, group g of a contiguous [N, K]
#pragma unroll
  for (int v = 0; v < QGROUP / V; ++v) {
    float part[V];
#pragma unroll
    for (int j = 0; j < V; ++j) part[j] = dequant_one<BITS>(p, v * V + j, s, z);
    store_vec<T, V>(o + v * V, part);
  }
}
