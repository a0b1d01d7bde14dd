// Rotary embedding in place on q [T, Hq, D] and k [T, Hk, D] (NeoX layout: the two halves
// of each head rotate together). cos_sin [max_pos, D] float32 = [cos | sin]; llama3-style
// frequency scaling is already baked into those values.
//
//   o1 = x1*cos - x2*sin,  o2 = x2*cos + x1*sin      (each product and the sum rounded to T,
//                                                     cos/sin rounded to T first: the twin's order)
// One block per token; each thread takes VEC consecutive pairs (i .. i+VEC-1, i+D/2 ..) of
// one head, q heads first then k heads, with vector loads when VEC > 1.
#include "common.cuh"

template <typename T, int VEC>
__global__ void rotary_kernel(T* __restrict__ q, long long q_stride,   // token strides
                              T* __restrict__ k, long long k_stride,
                              const long long* __restrict__ positions,  // [T]
                              const float* __restrict__ cos_sin,        // [max_pos, D]
                              int num_q_heads, int num_k_heads, int head_dim) {
  const long long t = blockIdx.x;
  const int half = head_dim / 2, groups = half / VEC;
  const float* cs = cos_sin + positions[t] * head_dim;
  const int work = (num_q_heads + num_k_heads) * groups;
  for (int e = threadIdx.x; e < work; e += blockDim.x) {
    const int head = e / groups, i = (e % groups) * VEC;
    T* base = head < num_q_heads ? q + t * q_stride + (long long)head * head_dim
                                 : k + t * k_stride + (long long)(head - num_q_heads) * head_dim;
    float c[VEC], s[VEC], x1[VEC], x2[VEC], o1[VEC], o2[VEC];
    load_vec<float, VEC>(cs + i, c);
    load_vec<float, VEC>(cs + half + i, s);
    load_vec<T, VEC>(base + i, x1);
    load_vec<T, VEC>(base + half + i, x2);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float cj = round_to<T>(c[j]), sj = round_to<T>(s[j]);
      o1[j] = round_to<T>(x1[j] * cj) + round_to<T>(-x2[j] * sj);
      o2[j] = round_to<T>(x2[j] * cj) + round_to<T>(x1[j] * sj);
    }
    store_vec<T, VEC>(base + i, o1);
    store_vec<T, VEC>(base + half + i, o2);
  }
}
