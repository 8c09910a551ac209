// Element-wise kernels: fill, cast, axpy, scale, relu and its backward, bias add.
// Each mirrors the function of the same name in kernels/src/cpu.rs.

extern "C" __global__ void vs_fill(void* out, int dout, vs_u64 n, float value) {
    VS_FOR_EACH(i, n) { vs_store(out, dout, i, value); }
}

extern "C" __global__ void vs_cast(const void* x, int dx, void* out, int dout, vs_u64 n) {
    VS_FOR_EACH(i, n) { vs_store(out, dout, i, vs_load(x, dx, i)); }
}

// y = alpha * x + y
extern "C" __global__ void vs_axpy(vs_u64 n, float alpha, const void* x, int dx, void* y, int dy) {
    VS_FOR_EACH(i, n) { vs_store(y, dy, i, alpha * vs_load(x, dx, i) + vs_load(y, dy, i)); }
}

// y = alpha * y
extern "C" __global__ void vs_scale(vs_u64 n, float alpha, void* y, int dy) {
    VS_FOR_EACH(i, n) { vs_store(y, dy, i, alpha * vs_load(y, dy, i)); }
}

extern "C" __global__ void vs_relu(const void* x, int dx, void* out, int dout, vs_u64 n) {
    VS_FOR_EACH(i, n) {
        float v = vs_load(x, dx, i);
        vs_store(out, dout, i, v > 0.0f ? v : 0.0f);
    }
}

// out = grad where input > 0, else 0
extern "C" __global__ void vs_relu_backward(const void* grad, int dg, const void* input, int di,
                                            void* out, int dout, vs_u64 n) {
    VS_FOR_EACH(i, n) {
        float g = vs_load(grad, dg, i);
        vs_store(out, dout, i, vs_load(input, di, i) > 0.0f ? g : 0.0f);
    }
}

// out[r][c] = x[r][c] + bias[c]
extern "C" __global__ void vs_add_bias(const void* x, int dx, const void* bias, int db, void* out,
                                       int dout, vs_u64 rows, vs_u64 cols) {
    VS_FOR_EACH(i, rows * cols) {
        vs_store(out, dout, i, vs_load(x, dx, i) + vs_load(bias, db, i % cols));
    }
}
