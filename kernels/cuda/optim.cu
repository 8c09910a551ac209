// Optimizer updates, element-wise. SGD with weight decay: w -= lr * (g + wd * w). AdamW with
// decoupled weight decay (w -= lr * wd * w, then the Adam step with bias corrections bc1 and
// bc2 precomputed on the host). Mirror `cpu::sgd` and `cpu::adamw` in kernels/src/cpu.rs.

extern "C" __global__ void vs_sgd(vs_u64 n, void* w, int dw, const void* g, int dg, float lr, float wd) {
    VS_FOR_EACH(i, n) {
        float wi = vs_load(w, dw, i);
        vs_store(w, dw, i, wi - lr * (vs_load(g, dg, i) + wd * wi));
    }
}

extern "C" __global__ void vs_adamw(vs_u64 n, void* w, int dw, const void* g, int dg, void* m, int dm,
                                    void* v, int dv, float lr, float beta1, float beta2, float eps,
                                    float wd, float bc1, float bc2) {
    VS_FOR_EACH(i, n) {
        float gi = vs_load(g, dg, i);
        float mi = beta1 * vs_load(m, dm, i) + (1.0f - beta1) * gi;
        float vi = beta2 * vs_load(v, dv, i) + (1.0f - beta2) * gi * gi;
        float wi = vs_load(w, dw, i);
        wi -= lr * wd * wi;
        wi -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
        vs_store(m, dm, i, mi);
        vs_store(v, dv, i, vi);
        vs_store(w, dw, i, wi);
    }
}
