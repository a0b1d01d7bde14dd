// KV-cache write: scatter k, v [T, Hkv, D] (token strides given, rows contiguous) into
// k_cache, v_cache [N, S, Hkv, D] at flat slot = block * S + offset. slot -1 = skip
// (padding tokens). One block per token; VEC elements per thread access.
#include "common.cuh"

template <typename T, int VEC>
__global__ void write_kv_kernel(const T* __restrict__ k, long long k_stride,
                                const T* __restrict__ v, long long v_stride,
                                T* __restrict__ k_cache, T* __restrict__ v_cache,
                                const long long* __restrict__ slot_mapping,  // [T]
                                int width) {                                 // Hkv * D
  const long long t = blockIdx.x;
  const long long slot = slot_mapping[t];
  if (slot < 0) return;
  for (int i = threadIdx.x * VEC; i < width; i += blockDim.x * VEC) {
    *reinterpret_cast<Vec<T, VEC>*>(k_cache + slot * width + i) =
        *reinterpret_cast<const Vec<T, VEC>*>(k + t * k_stride + i);
    *reinterpret_cast<Vec<T, VEC>*>(v_cache + slot * width + i) =
        *reinterpret_cast<const Vec<T, VEC>*>(v + t * v_stride + i);
  }
}
