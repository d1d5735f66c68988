/* Pure helpers of the CUDA backend: CUDA error -> -errno translation, PCI bus id
 * normalisation, GPU -> NUMA node from sysfs, UUID formatting. They touch no CUDA state
 * (cudart is not even initialised by them), so unit tests run them on machines without a
 * driver. The translation is one table: every code the backend can meet is listed with
 * the errno the HAL contract wants; anything else is -EIO. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

static const struct {
    cudaError_t code;
    int err; /* positive errno */
} cuda_errno_table[] = {
    {cudaErrorInvalidValue, EINVAL},
    {cudaErrorMemoryAllocation, ENOMEM},
    {cudaErrorInitializationError, ENODEV},
    {cudaErrorCudartUnloading, ESHUTDOWN},
    {cudaErrorInvalidConfiguration, EINVAL},
    {cudaErrorInvalidPitchValue, EINVAL},
    {cudaErrorInvalidSymbol, EINVAL},
    {cudaErrorInvalidHostPointer, EFAULT},
    {cudaErrorInvalidDevicePointer, EFAULT},
    {cudaErrorInvalidMemcpyDirection, EINVAL},
    {cudaErrorNotYetImplemented, EOPNOTSUPP},
    {cudaErrorStubLibrary, ENODEV},
    {cudaErrorInsufficientDriver, ENODEV},
    {cudaErrorCallRequiresNewerDriver, EOPNOTSUPP},
    {cudaErrorDevicesUnavailable, ENODEV},
    {cudaErrorIncompatibleDriverContext, ENODEV},
    {cudaErrorMissingConfiguration, EINVAL},
    {cudaErrorPriorLaunchFailure, EIO},
    {cudaErrorInvalidDeviceFunction, ENOEXEC},
    {cudaErrorNoDevice, ENODEV},
    {cudaErrorInvalidDevice, ENODEV},
    {cudaErrorDeviceNotLicensed, ENODEV},
    {cudaErrorStartupFailure, ENODEV},
    {cudaErrorInvalidKernelImage, ENOEXEC},
    {cudaErrorDeviceUninitialized, ENODEV},
    {cudaErrorMapBufferObjectFailed, ENOMEM},
    {cudaErrorUnmapBufferObjectFailed, EIO},
    {cudaErrorAlreadyMapped, EEXIST},
    {cudaErrorNoKernelImageForDevice, ENOEXEC},
    {cudaErrorNotMapped, ENOENT},
    {cudaErrorECCUncorrectable, EIO},
    {cudaErrorUnsupportedLimit, EOPNOTSUPP},
    {cudaErrorDeviceAlreadyInUse, EBUSY},
    {cudaErrorPeerAccessUnsupported, EOPNOTSUPP},
    {cudaErrorInvalidPtx, ENOEXEC},
    {cudaErrorNvlinkUncorrectable, EIO},
    {cudaErrorJitCompilerNotFound, ENOEXEC},
    {cudaErrorUnsupportedPtxVersion, ENOEXEC},
    {cudaErrorJitCompilationDisabled, ENOEXEC},
    {cudaErrorFileNotFound, ENOENT},
    {cudaErrorOperatingSystem, EIO},
    {cudaErrorInvalidResourceHandle, ENOENT},
    {cudaErrorIllegalState, EINVAL},
    {cudaErrorSymbolNotFound, ENOENT},
    {cudaErrorNotReady, EAGAIN},
    {cudaErrorIllegalAddress, EFAULT},
    {cudaErrorLaunchOutOfResources, ENOMEM},
    {cudaErrorLaunchTimeout, ETIMEDOUT},
    {cudaErrorPeerAccessAlreadyEnabled, EEXIST},
    {cudaErrorPeerAccessNotEnabled, EPERM},
    {cudaErrorContextIsDestroyed, ENODEV},
    {cudaErrorTooManyPeers, ENOSPC},
    {cudaErrorHostMemoryAlreadyRegistered, EEXIST},
    {cudaErrorHostMemoryNotRegistered, ENOENT},
    {cudaErrorHardwareStackError, EIO},
    {cudaErrorIllegalInstruction, EIO},
    {cudaErrorMisalignedAddress, EFAULT},
    {cudaErrorInvalidAddressSpace, EFAULT},
    {cudaErrorInvalidPc, EIO},
    {cudaErrorLaunchFailure, EIO},
    {cudaErrorNotPermitted, EPERM},
    {cudaErrorNotSupported, EOPNOTSUPP},
    {cudaErrorSystemNotReady, ENODEV},
    {cudaErrorSystemDriverMismatch, ENODEV},
    {cudaErrorCompatNotSupportedOnDevice, ENODEV},
    {cudaErrorMpsConnectionFailed, ECONNREFUSED},
    {cudaErrorMpsServerNotReady, EAGAIN},
    {cudaErrorMpsMaxClientsReached, EBUSY},
    {cudaErrorTimeout, ETIMEDOUT},
    {cudaErrorUnknown, EIO},
};

int pf_cuda_errno(cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    for (size_t i = 0; i < sizeof(cuda_errno_table) / sizeof(cuda_errno_table[0]); i++)
        if (cuda_errno_table[i].code == e)
            return -cuda_errno_table[i].err;
    return -EIO;
}

bool pf_cuda_no_gpu(cudaError_t e)
{
    switch (e) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
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
