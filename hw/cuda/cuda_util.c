/* Pure helpers of the CUDA backend: CUDA error -> -errno translation, PCI bus id
 * normalisation, GPU -> NUMA node from sysfs, UUID formatting. They touch no CUDA state
 * (the driver is not even loaded by them), so unit tests run them on machines without a
 * driver. The translation is one table: every code the backend can meet is listed with
 * the errno the HAL contract wants; anything else is -EIO. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* CUresult codes as cuda.h (CUDA 13.0) defines them, with the errno the HAL wants. */
static const struct {
    CUresult code;
    int err; /* positive errno */
} cuda_errno_table[] = {
    {CUDA_ERROR_INVALID_VALUE, EINVAL},
    {CUDA_ERROR_OUT_OF_MEMORY, ENOMEM},
    {CUDA_ERROR_NOT_INITIALIZED, ENODEV},
    {CUDA_ERROR_DEINITIALIZED, ESHUTDOWN},
    {CUDA_ERROR_STUB_LIBRARY, ENODEV},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, ENODEV},
    {CUDA_ERROR_NO_DEVICE, ENODEV},
    {CUDA_ERROR_INVALID_DEVICE, ENODEV},
    {CUDA_ERROR_DEVICE_NOT_LICENSED, ENODEV},
    {CUDA_ERROR_INVALID_IMAGE, ENOEXEC},
    {CUDA_ERROR_INVALID_CONTEXT, ENODEV},
    {CUDA_ERROR_MAP_FAILED, ENOMEM},
    {CUDA_ERROR_UNMAP_FAILED, EIO},
    {CUDA_ERROR_ALREADY_MAPPED, EEXIST},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, ENOEXEC},
    {CUDA_ERROR_NOT_MAPPED, ENOENT},
    {CUDA_ERROR_ECC_UNCORRECTABLE, EIO},
    {CUDA_ERROR_UNSUPPORTED_LIMIT, EOPNOTSUPP},
    {CUDA_ERROR_CONTEXT_ALREADY_IN_USE, EBUSY},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, EOPNOTSUPP},
    {CUDA_ERROR_INVALID_PTX, ENOEXEC},
    {CUDA_ERROR_NVLINK_UNCORRECTABLE, EIO},
    {CUDA_ERROR_JIT_COMPILER_NOT_FOUND, ENOEXEC},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, ENOEXEC},
    {CUDA_ERROR_JIT_COMPILATION_DISABLED, ENOEXEC},
    {CUDA_ERROR_FILE_NOT_FOUND, ENOENT},
    {CUDA_ERROR_OPERATING_SYSTEM, EIO},
    {CUDA_ERROR_INVALID_HANDLE, ENOENT},
    {CUDA_ERROR_ILLEGAL_STATE, EINVAL},
    {CUDA_ERROR_NOT_FOUND, ENOENT},
    {CUDA_ERROR_NOT_READY, EAGAIN},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, ENOMEM},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, EEXIST},
    {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, EPERM},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, ENODEV},
    {CUDA_ERROR_TOO_MANY_PEERS, ENOSPC},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, EEXIST},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, ENOENT},
    {CUDA_ERROR_NOT_PERMITTED, EPERM},
    {CUDA_ERROR_NOT_SUPPORTED, EOPNOTSUPP},
    {CUDA_ERROR_SYSTEM_NOT_READY, ENODEV},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, ENODEV},
    {CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, ENODEV},
    {CUDA_ERROR_MPS_CONNECTION_FAILED, ECONNREFUSED},
    {CUDA_ERROR_MPS_SERVER_NOT_READY, EAGAIN},
    {CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, EBUSY},
    {CUDA_ERROR_TIMEOUT, ETIMEDOUT},
    {CUDA_ERROR_UNKNOWN, EIO},
};

bool pf_cuda_sticky(CUresult e)
{
    switch (e) {
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_EXTERNAL_DEVICE:
        return true;
    default:
        return false;
    }
}

int pf_cuda_errno(CUresult e)
{
    if (e == CUDA_SUCCESS)
        return 0;
    if (pf_cuda_sticky(e))
        return -ENOTRECOVERABLE;
    for (size_t i = 0; i < sizeof(cuda_errno_table) / sizeof(cuda_errno_table[0]); i++)
        if (cuda_errno_table[i].code == e)
            return -cuda_errno_table[i].err;
    return -EIO;
}

bool pf_cuda_no_gpu(CUresult e)
{
    switch (e) {
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_SYSTEM_NOT_READY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
        return true;
    default:
        return false;
    }
}

/* Parses 1..maxdigits hex digits at *pp followed by sep (or the end when sep is 0). */
static bool parse_hex_field(const char **pp, size_t maxdigits, char sep, unsigned *v_p)
{
    const char *p = *pp;
    unsigned v = 0;
    size_t n = 0;
    for (; isxdigit((unsigned char)p[n]); n++) {
        if (n == maxdigits)
            return false;
        v = v * 16 + (unsigned)(isdigit((unsigned char)p[n])
                                    ? p[n] - '0'
                                    : tolower((unsigned char)p[n]) - 'a' + 10);
    }
    if (n == 0 || p[n] != sep)
        return false;
    *pp = p + n + (sep != '\0');
    *v_p = v;
    return true;
}

int pf_cuda_busid_normalize(const char *busid, char *out, size_t outlen)
{
    unsigned dom, bus, dev, fn;
    const char *p = busid;
    if (!p || !parse_hex_field(&p, 8, ':', &dom) || !parse_hex_field(&p, 2, ':', &bus) ||
        !parse_hex_field(&p, 2, '.', &dev) || !parse_hex_field(&p, 1, '\0', &fn) || dom > 0xffff ||
        dev > 0x1f || fn > 7)
        return -EINVAL;
    int n = snprintf(out, outlen, "%04x:%02x:%02x.%x", dom, bus, dev, fn);
    if (n < 0 || (size_t)n >= outlen)
        return -EINVAL;
    return 0;
}

int pf_cuda_numa_node(const char *sysfs_root, const char *busid)
{
    char norm[32], path[512], buf[32];
    if (pf_cuda_busid_normalize(busid, norm, sizeof(norm)) != 0)
        return -1;
    snprintf(path, sizeof(path), "%s/bus/pci/devices/%s/numa_node", sysfs_root, norm);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    char *line = fgets(buf, sizeof(buf), f);
    fclose(f);
    if (!line)
        return -1;
    char *end;
    errno = 0;
    long v = strtol(buf, &end, 10);
    if (end == buf || errno || (*end != '\0' && *end != '\n') || v < 0 || v > 4095)
        return -1;
    return (int)v;
}

void pf_cuda_uuid_format(const uint8_t uuid[16], char *out, size_t outlen)
{
    const uint8_t *u = uuid;
    snprintf(out, outlen,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
             u[15]);
}
