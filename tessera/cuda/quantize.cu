// The 8-bit forward's pre-pass on every GPU (tessera/quantize_launch.py launches it): Q and K
// smoothed, rotated and rounded to int8 a token at a time, V rounded to int8 a channel at a time
// and stored transposed (keys contiguous: the operand layout an 8-bit P . V product reads). The
// numbers are tessera/quantization.py's (quantized_operands), computed in float32.
// Variant parameters: Config::D, Config::BF16.
//
// Order: quant_channel_partials (per chunk of tokens: K's channel sums, V's channel maxima),
// quant_channel_finish (K's channel means, V's channel scales; fixed summation order, so the
// result is the same every run), then quant_rows for Q and for K, and quant_v_transposed.
#include "variant.cuh"
#include "common/element.cuh"

namespace {
constexpr int D = Config::D;
constexpr int E = D / 32;                      // values a lane holds in quant_rows
constexpr bool POW2 = (D & (D - 1)) == 0;      // one Walsh-Hadamard block, else blocks of 32
constexpr int THREADS = 256;
constexpr int LANES = THREADS / D;             // token lanes of the channel kernels
constexpr int V_TOKENS = 64;                   // tokens a quant_v_transposed tile
static_assert(D % 32 == 0 && (POW2 || D == 96), "head dim 64, 96 or 128");

// Channel of a lane's e-th value: consecutive channels where one block spans the head dim (its
// low bits then index the lane's own values, so the first butterflies stay in the thread),
// else one channel of each 32-channel block (a block's butterflies across the lanes).
__device__ __forceinline__ int channel(int lane, int e) {
  return POW2 ? lane * E + e : e * 32 + lane;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
  return x;
}

// x rounded to the nearest int8 code of step `scale` (inverse `inv`), within [-127, 127].
__device__ __forceinline__ int code(float x, float inv) {
  return max(-127, min(127, __float2int_rn(x * inv)));
}
}  // namespace

// Per (batch x head, chunk of `chunk` tokens): the sums of K's channels and the largest |V| of
// each channel, into partials [B*H, chunks, D]. Grid (chunks, B*H).
extern "C" __global__ void __launch_bounds__(THREADS)
quant_channel_partials(const u16* k_ptr, i64 k_sb, i64 k_sh, i64 k_sl, const u16* v_ptr,
                       i64 v_sb, i64 v_sh, i64 v_sl, int heads, int seq, int chunk,
                       float* k_sums, float* v_amax) {
  __shared__ float sums[LANES][D], maxima[LANES][D];
  const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const int lane = threadIdx.x / D, c = threadIdx.x % D;
  const int start = blockIdx.x * chunk, end = min(start + chunk, seq);
  float s = 0.f, m = 0.f;
  if (lane < LANES) {
    const u16* k = k_ptr + b * k_sb + h * k_sh + c;
    const u16* v = v_ptr + b * v_sb + h * v_sh + c;
    for (int t = start + lane; t < end; t += LANES) {
      s += to_float(k[t * k_sl]);
      m = fmaxf(m, fabsf(to_float(v[t * v_sl])));
    }
    sums[lane][c] = s;
    maxima[lane][c] = m;
  }
  __syncthreads();
  if (lane == 0) {
#pragma unroll
    for (int l = 1; l < LANES; ++l) {
      s += sums[l][c];
      m = fmaxf(m, maxima[l][c]);
    }
    const i64 at = ((i64)bh * gridDim.x + blockIdx.x) * D + c;
    k_sums[at] = s;
    v_amax[at] = m;
  }
}

// Per (batch x head, channel): K's mean over the `seq` tokens and V's scale (its largest
// magnitude / 127, 1 for a channel of zeros), from `chunks` partials summed in order.
extern "C" __global__ void __launch_bounds__(THREADS)
quant_channel_finish(const float* k_sums, const float* v_amax, int chunks, int seq, i64 n,
                     float* k_mean, float* v_scale) {
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const i64 bh = i / D, c = i % D;
  float s = 0.f, m = 0.f;
  for (int j = 0; j < chunks; ++j) {
    s += k_sums[(bh * chunks + j) * D + c];
    m = fmaxf(m, v_amax[(bh * chunks + j) * D + c]);
  }
  k_mean[i] = s / (float)seq;
  v_scale[i] = m > 0.f ? m / 127.f : 1.f;
}

// Q or K rounded a token at a time, one warp a row: the channel means subtracted (`mean`
// [B*H, D], or none), rotated (`factors` [D]: each channel's sign / sqrt(block) after the
// Walsh-Hadamard butterflies, or none), then int8 codes of step largest |x| / 127 into `out`
// (contiguous [B, H, L, D]) and that step into `scales` ([B, H, steps_len], steps_len >= L: K's
// rows padded as the transposed V's, which the 8-bit kernel copies a chunk at a time).
extern "C" __global__ void __launch_bounds__(THREADS)
quant_rows(const u16* x_ptr, i64 sb, i64 sh, i64 sl, int heads, int seq, i64 rows,
           const float* mean, const float* factors, signed char* out, float* scales,
           int steps_len) {
  const i64 row = (i64)blockIdx.x * (THREADS / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const FlatRow fr(row, heads, seq);
  const i64 bh = fr.bh;
  const u16* x = x_ptr + fr.b * sb + fr.h * sh + fr.tok * sl;
  float v[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int c = channel(lane, e);
    v[e] = to_float(x[c]) - (mean ? mean[bh * D + c] : 0.f);
  }
  if (factors) {
    // The butterflies of y = H x, H[i][j] = (-1)^popcount(i & j): pairs (i, i + s) for each
    // bit s of the channel index, (a, b) -> (a + b, a - b); the low bits within the thread.
#pragma unroll
    for (int s = 1; s < (POW2 ? E : 1); s *= 2)
#pragma unroll
      for (int e = 0; e < E; ++e)
        if (!(e & s)) {
          const float a = v[e], c = v[e + s];
          v[e] = a + c;
          v[e + s] = a - c;
        }
#pragma unroll
    for (int m = 1; m < 32; m *= 2)
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float p = __shfl_xor_sync(0xffffffffu, v[e], m);
        v[e] = (lane & m) ? p - v[e] : v[e] + p;
      }
#pragma unroll
    for (int e = 0; e < E; ++e) v[e] *= factors[channel(lane, e)];
  }
  float amax = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) amax = fmaxf(amax, fabsf(v[e]));
  amax = warp_max(amax);
  const float scale = amax > 0.f ? amax / 127.f : 1.f;
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  signed char* o = out + row * D;
  if constexpr (POW2) {  // the lane's E consecutive codes in one store
    u32 word = 0;
#pragma unroll
    for (int e = 0; e < E; ++e) word |= (u32)(code(v[e], inv) & 0xff) << (8 * e);
    if constexpr (E == 4)
      *reinterpret_cast<u32*>(o + lane * E) = word;
    else
      *reinterpret_cast<unsigned short*>(o + lane * E) = (unsigned short)word;
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) o[channel(lane, e)] = (signed char)code(v[e], inv);
  }
  if (lane == 0) scales[bh * steps_len + fr.tok] = scale;
}

// Which key of its 16-key group column f (0 .. 15) of the transposed V holds: 4q + e holds key
// 2q + e, or 8 + 2q + e - 2 for e >= 2 -- the keys a thread's S accumulator holds (columns 2q,
// 2q + 1 of two octets), in the order of its u8 A fragment's four bytes (4q .. 4q + 3), so the
// 8-bit P V takes P from S's registers without a shuffle (quantize_launch.v_key_order).
__device__ __forceinline__ int v_column_key(int f) {
  const int q = f / 4, e = f % 4;
  return e < 2 ? 2 * q + e : 8 + 2 * q + e - 2;
}

// V rounded a channel at a time (`v_scale` [B*H, D]) and stored transposed: `out` [B, H, D,
// seq_pad], keys contiguous in the order of v_column_key within each 16 keys, codes past `seq`
// zero. Grid (seq_pad / V_TOKENS, B*H); a tile of V_TOKENS tokens through shared memory.
extern "C" __global__ void __launch_bounds__(THREADS)
quant_v_transposed(const u16* v_ptr, i64 sb, i64 sh, i64 sl, int heads, int seq, int seq_pad,
                   const float* v_scale, signed char* out) {
  __shared__ signed char tile[D][V_TOKENS + 4];  // (+4: a row's stores spread over the banks)
  const int bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const int t0 = blockIdx.x * V_TOKENS;
  const u16* v = v_ptr + b * sb + h * sh;
  for (int i = threadIdx.x; i < V_TOKENS * D; i += THREADS) {
    const int r = i / D, c = i % D, t = t0 + r;
    tile[c][r] = t < seq ? (signed char)code(to_float(v[t * sl + c]),
                                             1.f / v_scale[(i64)bh * D + c]) : 0;
  }
  __syncthreads();
  constexpr int WORDS = V_TOKENS / 4;  // a channel row's 4-byte words
  for (int i = threadIdx.x; i < D * WORDS; i += THREADS) {
    const int c = i / WORDS, w = i % WORDS;
    u32 word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = 4 * w + j;  // (V_TOKENS is a multiple of 16: groups start at 16 k)
      word |= (u32)(unsigned char)tile[c][col / 16 * 16 + v_column_key(col % 16)] << (8 * j);
    }
    *reinterpret_cast<u32*>(out + ((i64)bh * D + c) * seq_pad + t0 + 4 * w) = word;
  }
}
