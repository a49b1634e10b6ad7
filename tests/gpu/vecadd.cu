// A plain CUDA C program (runtime API) that checks its own result: exit 0 only when correct.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

int main() {
    const int n = 1 << 24;
    float *a, *b, *c;
    float *ha = new float[n], *hb = new float[n], *hc = new float[n];
    for (int i = 0; i < n; i++) { ha[i] = i * 0.5f; hb[i] = 3.0f - i; }
    if (cudaMalloc(&a, n * 4) || cudaMalloc(&b, n * 4) || cudaMalloc(&c, n * 4)) { puts("malloc failed"); return 1; }
    cudaMemcpy(a, ha, n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb, n * 4, cudaMemcpyHostToDevice);
    for (int rep = 0; rep < 100; rep++) add<<<(n + 255) / 256, 256>>>(a, b, c, n);
    cudaError_t err = cudaMemcpy(hc, c, n * 4, cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) { printf("error %s\n", cudaGetErrorString(err)); return 1; }
    for (int i = 0; i < n; i++)
        if (hc[i] != ha[i] + hb[i]) { printf("wrong at %d: %f\n", i, hc[i]); return 1; }
    size_t freeb, totalb;
    cudaMemGetInfo(&freeb, &totalb);
    printf("vecadd ok: %d elements, cudaMemGetInfo free=%zu total=%zu\n", n, freeb, totalb);
    return 0;
}
