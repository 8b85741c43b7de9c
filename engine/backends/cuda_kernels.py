"""The CUDA backend's fused kernels, as CUDA C sources compiled at run time (CuPy's RawModule on the
device, NVRTC alone in CI: every source here must compile for sm_90 without a GPU).

No CUDA headers are included (NVRTC has none of the toolkit's), so half and bfloat16 bits are
widened by hand. Activations, the KV cache and every accumulation are float32. Each reduction of a
row runs in an order fixed by that row's own data and the launch shape, never by the batch width:
a decode row, a verify row and a recomputed row give the same bits.
"""

from __future__ import annotations

GEMV_MAX_ROWS = 8
"""Rows of x the weight-streaming GEMV takes at once; larger batches dequantize the matrix to
float32 and go through cuBLAS (`cupy.matmul`)."""

BLOCK_FORMATS: dict[str, tuple[int, int]] = {
    "Q4_0": (0, 18),
    "Q4_1": (1, 20),
    "Q8_0": (2, 34),
    "BF16": (3, 64),
    "F16": (4, 64),
    "F32": (5, 128),
}
"""Storage format -> (kernel format id, bytes per 32 weights). GGUF blocks and dense rows alike are
read 32 weights at a time."""

_COMMON = r"""
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf16_to_f32(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}

__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short load_u16(const unsigned char* p) {
    return (unsigned short)(p[0] | (p[1] << 8));
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum (or max) over the whole thread block, in a fixed order; every thread gets the result.
__device__ float block_reduce(float v, bool take_max) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = take_max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float r = lane < warps ? partial[lane] : (take_max ? NEG_INF : 0.0f);
    r = take_max ? warp_max(r) : warp_sum(r);
    return r;
}

// The 32 weights of one block (GGUF) or one 32-wide run of a dense row, as float32.
template <int FMT>
__device__ __forceinline__ void decode32(const unsigned char* __restrict__ blk, float* w) {
    if (FMT == 0) {  // Q4_0: d, 16 bytes of nibbles; weight j = d * (nibble - 8)
        const float d = f16_to_f32(load_u16(blk));
        #pragma unroll
        for (int j = 0; j < 16; ++j) {
            const unsigned char q = blk[2 + j];
            w[j] = d * (float)((int)(q & 15) - 8);
            w[j + 16] = d * (float)((int)(q >> 4) - 8);
        }
    } else if (FMT == 1) {  // Q4_1: d, m, nibbles; weight = d * nibble + m
        const float d = f16_to_f32(load_u16(blk));
        const float m = f16_to_f32(load_u16(blk + 2));
        #pragma unroll
        for (int j = 0; j < 16; ++j) {
            const unsigned char q = blk[4 + j];
            w[j] = fmaf(d, (float)(q & 15), m);
            w[j + 16] = fmaf(d, (float)(q >> 4), m);
        }
    } else if (FMT == 2) {  // Q8_0: d, 32 int8
        const float d = f16_to_f32(load_u16(blk));
        #pragma unroll
        for (int j = 0; j < 32; ++j) w[j] = d * (float)((const signed char*)blk)[2 + j];
    } else if (FMT == 3) {  // BF16
        #pragma unroll
        for (int j = 0; j < 32; ++j) w[j] = bf16_to_f32(load_u16(blk + 2 * j));
    } else if (FMT == 4) {  // F16
        #pragma unroll
        for (int j = 0; j < 32; ++j) w[j] = f16_to_f32(load_u16(blk + 2 * j));
    } else {  // F32
        #pragma unroll
        for (int j = 0; j < 32; ++j) w[j] = ((const float*)blk)[j];
    }
}
"""

_GEMV = r"""
// y[r, o] = sum_i x[r, i] * W[o, i] for r < rows <= 8: one warp per output row o; lane l takes the
// 32-weight runs l, l + 32, ...; each run is decoded once and used for every row of x.
template <int FMT>
__device__ void gemv(const unsigned char* __restrict__ W, const float* __restrict__ x,
                     float* __restrict__ y, int out, int in, int rows, int row_bytes, int run_bytes) {
    const int o = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (o >= out) return;
    float acc[8];
    #pragma unroll
    for (int r = 0; r < 8; ++r) acc[r] = 0.0f;
    const unsigned char* row = W + (size_t)o * row_bytes;
    float w[32];
    for (int b = lane; b < in / 32; b += 32) {
        decode32<FMT>(row + (size_t)b * run_bytes, w);
        #pragma unroll
        for (int r = 0; r < 8; ++r) {
            if (r < rows) {
                const float* xr = x + (size_t)r * in + b * 32;
                float s = 0.0f;
                #pragma unroll
                for (int j = 0; j < 32; ++j) s = fmaf(w[j], xr[j], s);
                acc[r] += s;
            }
        }
    }
    #pragma unroll
    for (int r = 0; r < 8; ++r) {
        const float v = warp_sum(acc[r]);
        if (r < rows && lane == 0) y[(size_t)r * out + o] = v;
    }
}

// Every run of `count` rows of W as float32 [count, in]: one thread per 32-weight run.
template <int FMT>
__device__ void dequantize(const unsigned char* __restrict__ W, float* __restrict__ out, int count,
                           int in, int row_bytes, int run_bytes) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int per_row = in / 32;
    if (i >= (long long)count * per_row) return;
    const long long r = i / per_row;
    const int b = (int)(i % per_row);
    float w[32];
    decode32<FMT>(W + r * row_bytes + (size_t)b * run_bytes, w);
    float* o = out + r * in + b * 32;
    #pragma unroll
    for (int j = 0; j < 32; ++j) o[j] = w[j];
}

#define FORMAT_KERNELS(NAME, FMT)                                                                   \
extern "C" __global__ void gemv_##NAME(const unsigned char* W, const float* x, float* y, int out,   \
                                       int in, int rows, int row_bytes, int run_bytes) {            \
    gemv<FMT>(W, x, y, out, in, rows, row_bytes, run_bytes);                                        \
}                                                                                                   \
extern "C" __global__ void dequantize_##NAME(const unsigned char* W, float* out, int count, int in, \
                                             int row_bytes, int run_bytes) {                        \
    dequantize<FMT>(W, out, count, in, row_bytes, run_bytes);                                       \
}

FORMAT_KERNELS(q4_0, 0)
FORMAT_KERNELS(q4_1, 1)
FORMAT_KERNELS(q8_0, 2)
FORMAT_KERNELS(bf16, 3)
FORMAT_KERNELS(f16, 4)
FORMAT_KERNELS(f32, 5)
"""

_ELEMENTWISE = r"""
// y = x / sqrt(mean(x^2) + eps) * weight: one block per row.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ weight,
                                    float* __restrict__ y, int cols, float eps, int has_weight) {
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s = fmaf(xr[j], xr[j], s);
    s = block_reduce(s, false);
    const float scale = 1.0f / sqrtf(s / (float)cols + eps);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float v = xr[j] * scale;
        yr[j] = has_weight ? v * weight[j] : v;
    }
}

// Rotate adjacent pairs of x [rows, heads, 2 * half] in place by rot [rows, half] (cos, sin).
extern "C" __global__ void rope(float* __restrict__ x, const float* __restrict__ rot, int rows,
                                int heads, int half) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * heads * half) return;
    const long long t = i / ((long long)heads * half);
    const int p = (int)(i % half);
    const float c = rot[(t * half + p) * 2], s = rot[(t * half + p) * 2 + 1];
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
}

// out[r, j] = silu(gate[r, j]) * up[r, j] for gate_up = [gate | up], each `width` wide.
extern "C" __global__ void silu_mul(const float* __restrict__ gate_up, float* __restrict__ out,
                                    int rows, int width) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * width) return;
    const long long r = i / width;
    const int j = (int)(i % width);
    const float g = gate_up[r * 2 * width + j], u = gate_up[r * 2 * width + width + j];
    out[i] = g / (1.0f + expf(-g)) * u;
}
"""

_KV = r"""
// Store k, v [rows, kv_heads, head_dim] of `layer` at (slots[r], positions[r]) of the cache
// [layers, slots, kv_heads, capacity, head_dim].
extern "C" __global__ void write_kv(float* __restrict__ keys, float* __restrict__ values,
                                    const float* __restrict__ k, const float* __restrict__ v,
                                    const long long* __restrict__ slots,
                                    const long long* __restrict__ positions, int layer, int num_slots,
                                    int kv_heads, int capacity, int head_dim, int rows) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * kv_heads * head_dim) return;
    const long long r = i / ((long long)kv_heads * head_dim);
    const int h = (int)((i / head_dim) % kv_heads);
    const int j = (int)(i % head_dim);
    const size_t dst =
        ((((size_t)layer * num_slots + slots[r]) * kv_heads + h) * capacity + positions[r]) * head_dim + j;
    keys[dst] = k[i];
    values[dst] = v[i];
}

// One (row, head) per block: the row's query against positions [0, visible) of its slot, softmax in
// float32 with the row max subtracted, the weighted values summed in position order. Every row (decode,
// verify or prefill) runs alone, so its result never depends on the rows beside it.
extern "C" __global__ void row_attention(const float* __restrict__ q, const float* __restrict__ keys,
                                         const float* __restrict__ values, float* __restrict__ out,
                                         float* __restrict__ scores,
                                         const long long* __restrict__ row_slots,
                                         const long long* __restrict__ row_visible, int layer,
                                         int num_slots, int heads, int kv_heads, int capacity,
                                         int head_dim) {
    const int row = blockIdx.x, h = blockIdx.y;
    const int kvh = h / (heads / kv_heads);
    const int n = (int)row_visible[row];
    const size_t base = (((size_t)layer * num_slots + row_slots[row]) * kv_heads + kvh) * capacity;
    const float* K = keys + base * head_dim;
    const float* V = values + base * head_dim;
    const float* qr = q + ((size_t)row * heads + h) * head_dim;
    float* sc = scores + ((size_t)row * heads + h) * capacity;
    float top = NEG_INF;
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        float s = 0.0f;
        for (int j = 0; j < head_dim; ++j) s = fmaf(qr[j], K[(size_t)p * head_dim + j], s);
        sc[p] = s;
        top = fmaxf(top, s);
    }
    top = block_reduce(top, true);
    float total = 0.0f;
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        const float e = expf(sc[p] - top);
        sc[p] = e;
        total += e;
    }
    total = block_reduce(total, false);
    __syncthreads();
    float* o = out + ((size_t)row * heads + h) * head_dim;
    for (int j = threadIdx.x; j < head_dim; j += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < n; ++p) acc = fmaf(sc[p], V[(size_t)p * head_dim + j], acc);
        o[j] = acc / total;
    }
}
"""

SOURCES: dict[str, str] = {
    "matmul": _COMMON + _GEMV,
    "elementwise": _COMMON + _ELEMENTWISE,
    "attention": _COMMON + _KV,
}
"""Every kernel source by module name; each compiles on its own."""

KERNELS: dict[str, tuple[str, ...]] = {
    "matmul": tuple(
        f"{kind}_{name}"
        for name in ("q4_0", "q4_1", "q8_0", "bf16", "f16", "f32")
        for kind in ("gemv", "dequantize")
    ),
    "elementwise": ("rms_norm", "rope", "silu_mul"),
    "attention": ("write_kv", "row_attention"),
}
"""The extern "C" kernel names each module exports."""

COMPILE_OPTIONS: tuple[str, ...] = ("--std=c++17",)
"""NVRTC options shared by CuPy's compile and the CI check (which adds --gpu-architecture=sm_90)."""
