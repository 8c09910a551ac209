// Tiled matrix product: C (m x n) = op(A) (m x k) * op(B) (k x n), where op transposes a
// row-major operand when its flag is set. 16 x 16 tiles of A and B are staged in shared memory;
// accumulation is in f32. Mirrors `cpu::matmul` in kernels/src/cpu.rs.

#define VS_TILE 16

extern "C" __global__ void vs_matmul(const void* a, int da, const void* b, int db, void* c, int dc,
                                     int m, int n, int k, int trans_a, int trans_b) {
    __shared__ float tile_a[VS_TILE][VS_TILE];
    __shared__ float tile_b[VS_TILE][VS_TILE + 1];
    int row = blockIdx.y * VS_TILE + threadIdx.y;
    int col = blockIdx.x * VS_TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < k; t += VS_TILE) {
        int pa = t + threadIdx.x;
        int pb = t + threadIdx.y;
        float va = 0.0f;
        if (row < m && pa < k) {
            vs_u64 ia = trans_a ? (vs_u64)pa * m + row : (vs_u64)row * k + pa;
            va = vs_load(a, da, ia);
        }
        float vb = 0.0f;
        if (pb < k && col < n) {
            vs_u64 ib = trans_b ? (vs_u64)col * k + pb : (vs_u64)pb * n + col;
            vb = vs_load(b, db, ib);
        }
        tile_a[threadIdx.y][threadIdx.x] = va;
        tile_b[threadIdx.y][threadIdx.x] = vb;
        __syncthreads();
        for (int p = 0; p < VS_TILE; ++p) {
            acc += tile_a[threadIdx.y][p] * tile_b[p][threadIdx.x];
        }
        __syncthreads();
    }
    if (row < m && col < n) {
        vs_store(c, dc, (vs_u64)row * n + col, acc);
    }
}
