/* gpu_probe: does this machine have a usable CUDA GPU? Used by tests/gpu/run.sh before it
 * builds and runs anything else. Prints "gpus=N" and one line per device and exits 0, or
 * prints a SKIP line with the reason and exits 77 (no driver, no device). Links only the
 * static CUDA runtime. */
#include <stdio.h>

#include <cuda_runtime_api.h>

int main(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (e == cudaSuccess)
            printf("SKIP: no CUDA GPU (cudaGetDeviceCount: 0 devices)\n");
        else
            printf("SKIP: no usable CUDA GPU (cudaGetDeviceCount: %s, CUDA error %d)\n",
                   cudaGetErrorString(e), (int)e);
        return 77;
    }
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    printf("gpus=%d driver=%d runtime=%d\n", n, drv, rt);
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess)
            continue;
        char bus[32] = "?";
        cudaDeviceGetPCIBusId(bus, sizeof(bus), i);
        const unsigned char *u = (const unsigned char *)p.uuid.bytes;
        printf("gpu %d: %s sm_%d%d %zu MiB PCI %s UUID "
               "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
               i, p.name, p.major, p.minor, p.totalGlobalMem >> 20, bus, u[0], u[1], u[2], u[3],
               u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    }
    return 0;
}
