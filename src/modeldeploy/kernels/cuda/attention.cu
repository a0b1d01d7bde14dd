// Paged attention for decode and prefill, one kernel for both.
//
// Shapes: Q query tokens, H = Hkv * GROUP query heads, D head dim, N cache blocks of S tokens,
//   q [Q, H, D] (token stride q_stride), k_cache/v_cache [N, S, Hkv, D], block_tables [B, M],
//   context_lens [B] (tokens in the cache, new ones included), cu_seqlens_q [B+1] or nullptr.
// Decode: cu_seqlens_q == nullptr, query i belongs to sequence i and sees all its keys.
// Prefill: query i of sequence b (cu[b] <= i < cu[b+1]) sees keys [0, L_b - (cu[b+1] - i)].
//
// Grid (Q, Hkv, P): a block handles one query token, one kv head and one partition of the
// keys (split-K, for long contexts at small batch). Its WARPS warps take UNROLL consecutive
// keys at a time; a lane holds D/32 dims. Each warp keeps an online softmax (log2 domain,
// fp32) for the GROUP query heads of its kv head, so each K/V byte is read once per kv head.
// Warps merge in shared memory; with P > 1 the partials go to part_* and
// paged_attention_reduce_kernel merges them.
#include "common.cuh"

constexpr int WARPS = 4;

template <typename T, int D, int GROUP, int UNROLL>   // UNROLL: keys per warp per step (4 or 8)
__global__ void __launch_bounds__(WARPS * 32)
paged_attention_kernel(T* __restrict__ out,                 // [Q, H, D]       (P == 1)
                       float* __restrict__ part_out,        // [Q, H, P, D]    (P > 1)
                       float* __restrict__ part_max,        // [Q, H, P] log2-domain max
                       float* __restrict__ part_sum,        // [Q, H, P]
                       const T* __restrict__ q, long long q_stride,
                       const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                       const int* __restrict__ block_tables, int table_stride,
                       const int* __restrict__ context_lens,
                       const int* __restrict__ cu_seqlens_q, int num_seqs,
                       int block_size, int partition_size, float scale_log2) {
  constexpr int VEC = D / 32;
  const int qi = blockIdx.x, kvh = blockIdx.y, part = blockIdx.z, P = gridDim.z;
  const int num_kv_heads = gridDim.y, H = num_kv_heads * GROUP;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  // Which sequence this query belongs to and how many keys it sees (causal).
  int seq = qi, kv_len;
  if (cu_seqlens_q != nullptr) {
    int lo = 0, hi = num_seqs - 1;  // last b with cu[b] <= qi
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (cu_seqlens_q[mid] <= qi) lo = mid; else hi = mid - 1;
    }
    seq = lo;
    kv_len = context_lens[seq] - (cu_seqlens_q[seq + 1] - qi) + 1;
  } else {
    kv_len = context_lens[seq];
  }
  const int start = part * partition_size;
  const int end = min(start + partition_size, kv_len);

  // Query heads of this kv head, pre-scaled so that scores are already log2-domain logits.
  float qf[GROUP][VEC];
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    load_vec<T, VEC>(q + qi * q_stride + (long long)(kvh * GROUP + g) * D + lane * VEC, qf[g]);
#pragma unroll
    for (int i = 0; i < VEC; ++i) qf[g][i] *= scale_log2;
  }

  float m[GROUP], l[GROUP], acc[GROUP][VEC];
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    m[g] = neg_inf();
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.f;
  }

  const int* table = block_tables + (long long)seq * table_stride;
  const long long token_stride = (long long)num_kv_heads * D;  // between tokens of a block
  for (int base = start + warp * UNROLL; base < end; base += WARPS * UNROLL) {
    // Issue all UNROLL key/value loads before any math, to keep memory busy.
    float kf[UNROLL][VEC], vf[UNROLL][VEC];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int t = base + u;
      if (t < end) {
        const long long slot = (long long)table[t / block_size] * block_size + t % block_size;
        const long long off = slot * token_stride + (long long)kvh * D + lane * VEC;
        load_vec<T, VEC>(k_cache + off, kf[u]);
        load_vec<T, VEC>(v_cache + off, vf[u]);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) kf[u][i] = vf[u][i] = 0.f;
      }
    }
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
      float s[UNROLL];
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) dot += qf[g][i] * kf[u][i];
        dot = warp_sum(dot);                       // all lanes take part: base + u is warp-uniform
        s[u] = base + u < end ? dot : neg_inf();
        mx = fmaxf(mx, s[u]);
      }
      const float alpha = exp2f(m[g] - mx);        // mx is finite: key `base` is valid
      l[g] *= alpha;
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[g][i] *= alpha;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const float p = exp2f(s[u] - mx);
        l[g] += p;
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] += p * vf[u][i];
      }
      m[g] = mx;
    }
  }

  // Merge the warps' states.
  __shared__ float sm_max[WARPS][GROUP], sm_sum[WARPS][GROUP];
  __shared__ float sm_acc[WARPS][GROUP][D];
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    if (lane == 0) {
      sm_max[warp][g] = m[g];
      sm_sum[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) sm_acc[warp][g][lane * VEC + i] = acc[g][i];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < GROUP * D; e += blockDim.x) {
    const int g = e / D, d = e % D;
    float mx = neg_inf();
#pragma unroll
    for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, sm_max[w][g]);
    float sum = 0.f, o = 0.f;
    if (mx != neg_inf()) {  // else: empty partition (or empty context)
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const float f = exp2f(sm_max[w][g] - mx);
        sum += sm_sum[w][g] * f;
        o += sm_acc[w][g][d] * f;
      }
    }
    const long long row = (long long)qi * H + kvh * GROUP + g;  // (query, head)
    if (P == 1) {
      out[row * D + d] = from_float<T>(sum > 0.f ? o / sum : 0.f);
    } else {
      const long long r = row * P + part;
      part_out[r * D + d] = o;
      if (d == 0) {
        part_max[r] = mx;
        part_sum[r] = sum;
      }
    }
  }
}

// Merge P partitions: grid (Q * H), block D threads, one output element each.
template <typename T>
__global__ void paged_attention_reduce_kernel(T* __restrict__ out,              // [Q, H, D]
                                              const float* __restrict__ part_out,  // [Q, H, P, D]
                                              const float* __restrict__ part_max,  // [Q, H, P]
                                              const float* __restrict__ part_sum,  // [Q, H, P]
                                              int num_partitions, int head_dim) {
  const long long row = blockIdx.x;
  const int d = threadIdx.x;
  const float* pm = part_max + row * num_partitions;
  const float* ps = part_sum + row * num_partitions;
  float mx = neg_inf();
  for (int p = 0; p < num_partitions; ++p) mx = fmaxf(mx, pm[p]);
  float sum = 0.f, o = 0.f;
  if (mx != neg_inf()) {
    for (int p = 0; p < num_partitions; ++p) {
      const float f = exp2f(pm[p] - mx);
      sum += ps[p] * f;
      o += part_out[(row * num_partitions + p) * head_dim + d] * f;
    }
  }
  out[row * head_dim + d] = from_float<T>(sum > 0.f ? o / sum : 0.f);
}
