// Shared helpers for every vramscope kernel: element types and their conversions.
//
// The kernels are compiled with NVRTC and no include paths, so nothing here may include a
// header. Every kernel takes its operands as untyped pointers with a dtype code per operand
// (0 = f32, 1 = f16, 2 = bf16, matching `DType::code` in kernels/src/dtype.rs), loads them as
// f32, computes in f32 and stores in the output's dtype. The f16 conversions are written out by
// hand, rounding to nearest even like the `half` crate the CPU path uses.

typedef unsigned long long vs_u64;

#define VS_F32 0
#define VS_F16 1
#define VS_BF16 2

__device__ __forceinline__ float vs_nan() { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ float vs_neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float vs_f16_to_f32(unsigned short h) {
    unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    unsigned int exp = ((unsigned int)h >> 10) & 0x1fu;
    unsigned int man = (unsigned int)h & 0x3ffu;
    if (exp == 0u) {
        // Zero or subnormal: the value is man * 2^-24.
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 0x1fu) {
        return __uint_as_float(sign | 0x7f800000u | (man << 13));
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

__device__ __forceinline__ unsigned short vs_f32_to_f16(float f) {
    unsigned int x = __float_as_uint(f);
    unsigned int sign = (x >> 16) & 0x8000u;
    unsigned int exp = (x >> 23) & 0xffu;
    unsigned int man = x & 0x7fffffu;
    if (exp == 0xffu) {
        // Infinity stays infinity; NaN stays a quiet NaN.
        return (unsigned short)(sign | 0x7c00u | (man ? (0x200u | (man >> 13)) : 0u));
    }
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f) {
        return (unsigned short)(sign | 0x7c00u);
    }
    if (e <= 0) {
        if (e < -10) {
            return (unsigned short)sign;
        }
        // Subnormal half: shift the full 24-bit significand into place and round to even.
        unsigned int full = man | 0x800000u;
        unsigned int shift = (unsigned int)(14 - e);
        unsigned int m = full >> shift;
        unsigned int rem = full & ((1u << shift) - 1u);
        unsigned int half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (m & 1u))) {
            m += 1u;
        }
        return (unsigned short)(sign | m);
    }
    unsigned int h = sign | ((unsigned int)e << 10) | (man >> 13);
    unsigned int rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h += 1u;
    }
    return (unsigned short)h;
}

__device__ __forceinline__ float vs_bf16_to_f32(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}

__device__ __forceinline__ unsigned short vs_f32_to_bf16(float f) {
    unsigned int x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)((x >> 16) | 0x40u);
    }
    x += 0x7fffu + ((x >> 16) & 1u);
    return (unsigned short)(x >> 16);
}

__device__ __forceinline__ float vs_load(const void* p, int dt, vs_u64 i) {
    if (dt == VS_F32) {
        return ((const float*)p)[i];
    }
    unsigned short bits = ((const unsigned short*)p)[i];
    return dt == VS_F16 ? vs_f16_to_f32(bits) : vs_bf16_to_f32(bits);
}

__device__ __forceinline__ void vs_store(void* p, int dt, vs_u64 i, float v) {
    if (dt == VS_F32) {
        ((float*)p)[i] = v;
    } else if (dt == VS_F16) {
        ((unsigned short*)p)[i] = vs_f32_to_f16(v);
    } else {
        ((unsigned short*)p)[i] = vs_f32_to_bf16(v);
    }
}

// A grid-stride loop over [0, n).
#define VS_FOR_EACH(i, n) \
    for (vs_u64 i = (vs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (vs_u64)blockDim.x * gridDim.x)
