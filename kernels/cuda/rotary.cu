// Rotary embedding in place on q [T, Hq, D] and k [T, Hk, D] (NeoX layout: the two halves
// of each head rotate together). cos_sin [max_pos, D] float32 = [cos | sin]; llama3-style
// frequency scaling is already baked into those values.
//
//   o1 = x1*cos - x2*sin,  o2 = x2*cos + x1*sin      (each product and the sum rounded to T,
//                                                     cos/sin rounded to T first: the twin's order)
// One block per token; threads stride over (head, i < D/2) pairs of q then k.
#include "common.cuh"

template <typename T>
__global__ void rotary_kernel(T* __restrict__ q, long long q_stride,   // token strides
                              T* __restrict__ k, long long k_stride,
                              const long long* __restrict__ positions,  // [T]
                              const float* __restrict__ cos_sin,        // [max_pos, D]
                              int num_q_heads, int num_k_heads, int head_dim) {
  const long long t = blockIdx.x;
  const int half = head_dim / 2;
  const float* cs = cos_sin + positions[t] * head_dim;
  const int pairs = (num_q_heads + num_k_heads) * half;
  for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
    const int head = e / half, i = e % half;
    T* base = head < num_q_heads ? q + t * q_stride + (long long)head * head_dim
                                 : k + t * k_stride + (long long)(head - num_q_heads) * head_dim;
    const float c = round_to<T>(cs[i]), s = round_to<T>(cs[half + i]);
    const float x1 = to_float(base[i]), x2 = to_float(base[half + i]);
    const float o1 = round_to<T>(x1 * c) + round_to<T>(-x2 * s);
    const float o2 = round_to<T>(x2 * c) + round_to<T>(x1 * s);
    base[i] = from_float<T>(o1);
    base[half + i] = from_float<T>(o2);
  }
}
