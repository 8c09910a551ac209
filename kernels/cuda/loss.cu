// Softmax cross-entropy, one thread per row: the row's loss (log-sum-exp minus the label's
// logit) goes to loss_rows, and the gradient (softmax minus one-hot, times grad_scale) to grad.
// Labels are class indices stored as floats; an invalid label gives NaN for its row. Mirrors
// `cpu::softmax_cross_entropy` in kernels/src/cpu.rs.

extern "C" __global__ void vs_softmax_xent(const void* logits, int dl, const void* labels, int dlab,
                                           vs_u64 rows, vs_u64 cols, float* loss_rows, void* grad,
                                           int dg, float grad_scale) {
    VS_FOR_EACH(r, rows) {
        vs_u64 base = r * cols;
        float mx = vs_neg_inf();
        for (vs_u64 c = 0; c < cols; ++c) {
            mx = fmaxf(mx, vs_load(logits, dl, base + c));
        }
        float total = 0.0f;
        for (vs_u64 c = 0; c < cols; ++c) {
            total += expf(vs_load(logits, dl, base + c) - mx);
        }
        float lse = mx + logf(total);
        float label_f = vs_load(labels, dlab, r);
        bool valid = label_f >= 0.0f && label_f < (float)cols && floorf(label_f) == label_f;
        vs_u64 label = valid ? (vs_u64)label_f : 0;
        loss_rows[r] = valid ? lse - vs_load(logits, dl, base + label) : vs_nan();
        for (vs_u64 c = 0; c < cols; ++c) {
            float p = expf(vs_load(logits, dl, base + c) - lse);
            float g = (p - (c == label ? 1.0f : 0.0f)) * grad_scale;
            vs_store(grad, dg, base + c, valid ? g : vs_nan());
        }
    }
}
