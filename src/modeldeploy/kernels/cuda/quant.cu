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
// ROWS rows of x. K is walked in chunks of CHUNK = 32 groups: the block stages the chunk of its ROWS rows
// of x in shared memory as float (each x element leaves L2 once per block, not once per column), then
// lane l of a warp de-quantizes group l of the chunk for each of its COLS columns in registers (one
// 16-byte load of packed 4-bit weights, two of 8-bit: a warp reads 512 / 1024 contiguous bytes) and
// multiplies it into every row. float32 accumulation; one warp reduction per (column, row) at the end.
// Unverified on a GPU: checked only through the CPU emulation (modeldeploy_dev.kernel_emulate).
#include "common.cuh"

#define QGROUP 32
#define QCHUNK_GROUPS 32             // groups of K per staged chunk: one per lane
#define QPAD (QGROUP + 1)            // shared-memory stride per group: lanes read group l, word j -> no
                                     // bank conflict (a stride of 32 floats would put all lanes on one bank)
#define QCHUNK (QCHUNK_GROUPS * QPAD)  // floats per staged row

// 0x4B000000 is 2^23 as a float: or-ing a small integer u into its mantissa gives 2^23 + u exactly, so
// (that - 2^23) is float(u) with one integer op and one float add (integer-to-float converts run at a
// fraction of the FMA rate).
__device__ __forceinline__ float small_uint_to_float(unsigned u) {
  return __int_as_float(0x4B000000u | u) - 8388608.f;
}

// The 32 weights of one group, as float32: 4-bit from its 16 packed bytes (four 32-bit words).
__device__ __forceinline__ void dequant_group4(const unsigned (&p)[4], float s, float z, float (&w)[QGROUP]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const unsigned byte = (p[j / 4] >> (8 * (j % 4))) & 0xffu;
    w[j] = small_uint_to_float(byte & 15u) * s + z;
    w[j + 16] = small_uint_to_float(byte >> 4) * s + z;
  }
}

// 8-bit: 32 signed bytes (eight words); q + 128 is read as an unsigned byte, then 128 is taken off.
__device__ __forceinline__ void dequant_group8(const unsigned (&p)[8], float s, float (&w)[QGROUP]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const unsigned u = ((p[j / 4] >> (8 * (j % 4))) & 0xffu) ^ 0x80u;
    w[j] = (small_uint_to_float(u) - 128.f) * s;
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

template <int BITS>
__device__ __forceinline__ void dequant_group(const unsigned (&p)[BITS], float s, float z, float (&w)[QGROUP]) {
  if constexpr (BITS == 4) {
    dequant_group4(p, s, z, w);
  } else {
    dequant_group8(p, s, w);
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
  __shared__ float xs[ROWS * QCHUNK];
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
      const float* xg = xs + lane * QPAD;
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        float w[QGROUP];
        dequant_group<BITS>(p[c], s[c], z[c], w);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          if (r < rows) {
            float a = 0.f;
#pragma unroll
            for (int j = 0; j < QGROUP; ++j) a += w[j] * xg[r * QCHUNK + j];
            acc[c][r] += a;
          }
        }
      }
    }
  }
#pragma unroll
  for (int c = 0; c < COLS; ++c) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float v = warp_sum(acc[c][r]);  // every lane takes part: no early return above
      const int n = n0 + c;
      if (lane == 0 && r < rows && n < n_dim) {
        const float b = bias == nullptr ? 0.f : to_float(bias[n]);
        out[(long long)(m0 + r) * out_stride + n] = from_float<T>(v + b);
      }
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
  float w[QGROUP];
  dequant_group<BITS>(p, scales[i], BITS == 4 ? zeros[i] : 0.f, w);
  T* o = out + i * QGROUP;  // row n, group g of a contiguous [N, K]
#pragma unroll
  for (int v = 0; v < QGROUP / V; ++v) {
    float part[V];
#pragma unroll
    for (int j = 0; j < V; ++j) part[j] = w[v * V + j];
    store_vec<T, V>(o + v * V, part);
  }
}
