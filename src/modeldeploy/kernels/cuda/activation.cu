// SiLU-and-mul (SwiGLU gate): x [rows, 2I] -> out [rows, I] = round(silu(gate)) * up.
// silu is rounded to T before the multiply, as torch does for F.silu(gate) * up.
// Grid: (rows, ceil(I / (blockDim.x * VEC))).
#include "common.cuh"

template <typename T, int VEC>
__global__ void silu_and_mul_kernel(T* __restrict__ out,             // [rows, I] contiguous
                                    const T* __restrict__ x, long long x_stride,  // [rows, 2I]
                                    int inter) {
  const long long row = blockIdx.x;
  const int i = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
  if (i >= inter) return;
  float g[VEC], u[VEC], o[VEC];
  load_vec<T, VEC>(x + row * x_stride + i, g);
  load_vec<T, VEC>(x + row * x_stride + inter + i, u);
#pragma unroll
  for (int j = 0; j < VEC; ++j) o[j] = round_to<T>(g[j] / (1.f + expf(-g[j]))) * u[j];
  store_vec<T, VEC>(out + row * inter + i, o);
}
