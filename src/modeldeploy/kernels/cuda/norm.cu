// Fused residual-add + RMSNorm (Llama). One block per row; VEC elements per thread access.
//
//   x, residual [rows, hidden] (row strides given)  weight [hidden]
//   residual_out = round(x + residual)                       (only when residual != nullptr)
//   out          = round(round(h * rsqrt(mean(h^2) + eps)) * weight),  h = residual_out or x
//
// The two roundings reproduce HF LlamaRMSNorm (normalise in fp32, cast, then multiply the
// weight in the model dtype), so greedy decoding matches the torch twin bit-for-bit in fp32.
#include "common.cuh"

template <typename T, int VEC>
__global__ void rms_norm_kernel(T* __restrict__ out,                 // [rows, hidden] contiguous
                                T* __restrict__ residual_out,        // [rows, hidden] or nullptr
                                const T* __restrict__ x, long long x_stride,
                                const T* __restrict__ residual, long long res_stride,
                                const T* __restrict__ weight,        // [hidden]
                                float eps, int hidden) {
  const long long row = blockIdx.x;
  const T* xr = x + row * x_stride;
  T* outr = out + row * hidden;
  T* hr = residual != nullptr ? residual_out + row * hidden : nullptr;

  // Pass 1: h = x (+ residual), sum of squares in fp32.
  float ss = 0.f;
  for (int i = threadIdx.x * VEC; i < hidden; i += blockDim.x * VEC) {
    float h[VEC];
    load_vec<T, VEC>(xr + i, h);
    if (hr != nullptr) {
      float r[VEC];
      load_vec<T, VEC>(residual + row * res_stride + i, r);
#pragma unroll
      for (int j = 0; j < VEC; ++j) h[j] = round_to<T>(h[j] + r[j]);
      store_vec<T, VEC>(hr + i, h);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) ss += h[j] * h[j];
  }
  const float inv_rms = rsqrtf(block_sum(ss) / hidden + eps);

  // Pass 2: each thread re-reads only what it touched in pass 1 (L1/L2 hits).
  const T* src = hr != nullptr ? hr : xr;
  for (int i = threadIdx.x * VEC; i < hidden; i += blockDim.x * VEC) {
    float h[VEC], w[VEC], o[VEC];
    load_vec<T, VEC>(src + i, h);
    load_vec<T, VEC>(weight + i, w);
#pragma unroll
    for (int j = 0; j < VEC; ++j) o[j] = round_to<T>(h[j] * inv_rms) * w[j];
    store_vec<T, VEC>(outr + i, o);
  }
}
