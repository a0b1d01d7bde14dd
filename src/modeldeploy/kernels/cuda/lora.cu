// LoRA delta for a batch whose tokens use different adapters (BGMV style: each token
// gathers its own adapter's matrices by slot index, so one launch serves every adapter).
//   shrink: y[t, r]  = round_T(sum_k A[slot_t, r, k] * x[t, k])                (float out)
//   expand: out[t, n] += round_T(round_T(sum_r Bt[slot_t, r, n] * y[t, r]) * scale[slot_t])
// Bt is lora_B transposed ([L, R, N]): consecutive threads (columns n) read consecutive addresses.
// Tokens with slot < 0 (base model) are skipped by both kernels: out is left untouched.
// Roundings follow the torch twin (reference.lora_apply): F.linear rounds each product's
// result to T, then the scale multiply, then the add.
#include "common.cuh"

// Grid: (T, ceil(R / warps per block)); one warp per (token, rank row): a dot product over K.
template <typename T>
__global__ void lora_shrink_kernel(float* __restrict__ y,                  // [T, R]
                                   const T* __restrict__ x, long long x_stride,  // [T, K]
                                   const T* __restrict__ a,                // [L, R, K]
                                   const int* __restrict__ slots,          // [T]
                                   int rank, int k_dim) {
  const int t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = blockIdx.y * (blockDim.x / 32) + warp;
  const int slot = slots[t];
  if (r >= rank || slot < 0) return;
  const T* ar = a + ((long long)slot * rank + r) * k_dim;
  const T* xr = x + (long long)t * x_stride;
  float acc = 0.f;
  for (int k = lane; k < k_dim; k += 32) acc += to_float(ar[k]) * to_float(xr[k]);
  acc = warp_sum(acc);
  if (lane == 0) y[(long long)t * rank + r] = round_to<T>(acc);
}

// Grid: (T, ceil(N / blockDim.x)); one thread per output column; y[t] is staged in shared
// memory (rank <= 1024 floats) because every thread of the block reads all of it.
template <typename T>
__global__ void lora_expand_kernel(T* __restrict__ out, long long out_stride,  // [T, N]
                                   const float* __restrict__ y,                // [T, R]
                                   const T* __restrict__ b,                    // [L, R, N]
                                   const float* __restrict__ scales,           // [L]
                                   const int* __restrict__ slots,              // [T]
                                   int n_dim, int rank) {
  __shared__ float ys[1024];
  const int t = blockIdx.x;
  const int slot = slots[t];
  if (slot < 0) return;  // uniform across the block: no barrier is skipped by some threads only
  for (int r = threadIdx.x; r < rank; r += blockDim.x) ys[r] = y[(long long)t * rank + r];
  __syncthreads();
  const int n = blockIdx.y * blockDim.x + threadIdx.x;
  if (n >= n_dim) return;
  const T* bn = b + (long long)slot * rank * n_dim + n;
  float acc = 0.f;
  for (int r = 0; r < rank; ++r) acc += to_float(bn[(long long)r * n_dim]) * ys[r];
  const float delta = round_to<T>(round_to<T>(acc) * scales[slot]);
  T* o = out + (long long)t * out_stride + n;
  *o = from_float<T>(to_float(*o) + delta);
}
