// Reductions: the sum of every element (one block of 256 threads, tree reduction in shared
// memory, times a scale so a mean is one launch) and the sum over rows (one thread per column).
// Mirror `cpu::sum` and `cpu::sum_rows` in kernels/src/cpu.rs.

#define VS_SUM_THREADS 256

extern "C" __global__ void vs_sum(const void* x, int dx, vs_u64 n, void* out, int dout, float scale) {
    __shared__ float partial[VS_SUM_THREADS];
    float acc = 0.0f;
    for (vs_u64 i = threadIdx.x; i < n; i += blockDim.x) {
        acc += vs_load(x, dx, i);
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            partial[threadIdx.x] += partial[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        vs_store(out, dout, 0, partial[0] * scale);
    }
}

// out[c] = sum over r of x[r][c]
extern "C" __global__ void vs_sum_rows(const void* x, int dx, vs_u64 rows, vs_u64 cols, void* out,
                                       int dout) {
    VS_FOR_EACH(c, cols) {
        float acc = 0.0f;
        for (vs_u64 r = 0; r < rows; ++r) {
            acc += vs_load(x, dx, r * cols + c);
        }
        vs_store(out, dout, c, acc);
    }
}
