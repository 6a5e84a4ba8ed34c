/* The fake node's NVML: libnvidia-ml.so.1, the few entry points PyTorch asks for.
 *
 * Why it exists: torch's expandable-segments allocator (PYTORCH_CUDA_ALLOC_CONF=
 * expandable_segments:True) asks NVML about the GPU of each segment it maps (fabric access,
 * per-process memory for out-of-memory messages), and torch.cuda.device_count() counts
 * GPUs through NVML when it loads. Without a libnvidia-ml.so.1 torch calls nvmlInit_v2
 * through a NULL pointer. This library answers the way NVIDIA's does on a node without
 * NVLink or a fabric, for the node the fake driver describes.
 *
 * The node: the same FAKECUDA_* description as the fake driver (node.c is compiled in, so
 * GPUs, UUIDs and PCI bus ids are the driver's). Like NVIDIA's, it ignores
 * CUDA_VISIBLE_DEVICES: it lists every physical GPU, in PCI bus order (GPU i on bus
 * 0x18 + 0x10*i, domain 0, device 0). Signatures and return codes follow nvml.h's
 * documentation (NVML API Reference); constants are nvml.h's values. Decisions:
 *   N-init   nvmlInit/nvmlInit_v2 count references; nvmlShutdown undoes one. A bad
 *            FAKECUDA_* value fails init with NVML_ERROR_UNKNOWN (the fake driver prints why).
 *   N-proc   the fake has no view of other processes' GPU memory: the running-process
 *            queries answer SUCCESS with zero processes.
 *   N-link   no NVLink, no fabric: the NvLink and fabric queries answer
 *            NVML_ERROR_NOT_SUPPORTED, as NVIDIA's does on a PCIe GPU.
 *   N-ver    nvmlSystemGetCudaDriverVersion(_v2) is the fake driver's cuDriverGetVersion
 *            (FAKECUDA_DRIVER_VERSION), asked through dlopen("libcuda.so.1") like any client.
 * Anything else is absent: a caller that dlsym()s another name gets NULL, as it would from
 * an older NVML. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake.h"

#define NVML_API __attribute__((visibility("default")))

/* nvml.h's values (nvmlReturn_t). */
typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16

/* nvml.h: nvmlPciInfo_t. */
typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

/* nvml.h: nvmlProcessInfo_v1_t (the unversioned query) and nvmlProcessInfo_t (_v2, _v3). */
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* nvmlDevice_t is an opaque pointer: here one of these per physical GPU. */
struct nvmlDevice_st { int gpu; };
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef int nvmlIntNvLinkDeviceType_t;
typedef struct nvmlGpuFabricInfo_v nvmlGpuFabricInfoV_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refs;
static struct fake_node node;
static struct nvmlDevice_st devs[FAKE_MAX_GPUS];

NVML_API nvmlReturn_t nvmlInit_v2(void)
{
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (refs == 0) {
        if (fake_node_load(&node) != 0) {
            r = NVML_ERROR_UNKNOWN;
        } else {
            for (int i = 0; i < node.n_gpus; i++)
                devs[i].gpu = i;
        }
    }
    if (r == NVML_SUCCESS)
        refs++;
    pthread_mutex_unlock(&lock);
    return r;
}

NVML_API nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

NVML_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return nvmlInit_v2();
}

NVML_API nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (refs == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else
        refs--;
    pthread_mutex_unlock(&lock);
    return r;
}

static int initialised(void)
{
    pthread_mutex_lock(&lock);
    int ok = refs > 0;
    pthread_mutex_unlock(&lock);
    return ok;
}

static int valid(nvmlDevice_t d)
{
    return d != NULL && d >= devs && d < devs + node.n_gpus;
}

NVML_API const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "Unknown Error";
    }
}

NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)node.n_gpus;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= (unsigned int)node.n_gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devs[index];
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

NVML_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    unsigned char u[16];
    char s[96];
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || uuid == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    fake_gpu_uuid(device->gpu, u);
    fake_uuid_string("GPU-", u, s, sizeof s);
    if (strlen(s) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(uuid, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

/* A PCI bus id as nvml.h writes it ("%08X:%02X:%02X.0") or its legacy / short forms
 * ("%04X:%02X:%02X.0", "%02X:%02X.0"), hexadecimal, case-insensitive. */
static int parse_bus_id(const char *s, unsigned *domain, unsigned *bus, unsigned *dev, unsigned *fn)
{
    unsigned a, b, c, d;
    char tail;
    if (sscanf(s, "%x:%x:%x.%x%c", &a, &b, &c, &d, &tail) == 4) {
        *domain = a, *bus = b, *dev = c, *fn = d;
        return 0;
    }
    if (sscanf(s, "%x:%x.%x%c", &b, &c, &d, &tail) == 3) {
        *domain = 0, *bus = b, *dev = c, *fn = d;
        return 0;
    }
    return -1;
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    unsigned domain, bus, dev, fn;
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (pciBusId == NULL || device == NULL || parse_bus_id(pciBusId, &domain, &bus, &dev, &fn))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < node.n_gpus; i++) {
        if (domain == 0 && bus == (unsigned)fake_gpu_pci_bus(i) && dev == 0 && fn == 0) {
            *device = &devs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->bus = (unsigned)fake_gpu_pci_bus(device->gpu);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", 0, pci->bus, 0);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", 0, pci->bus, 0);
    return NVML_SUCCESS;
}

/* N-proc. */
static nvmlReturn_t no_processes(nvmlDevice_t device, unsigned int *infoCount, const void *infos)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || infoCount == NULL || (*infoCount != 0 && infos == NULL))
        return NVML_ERROR_INVALID_ARGUMENT;
    *infoCount = 0;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                           nvmlProcessInfo_v1_t *infos)
{
    return no_processes(device, infoCount, infos);
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                              nvmlProcessInfo_t *infos)
{
    return no_processes(device, infoCount, infos);
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                              nvmlProcessInfo_t *infos)
{
    return no_processes(device, infoCount, infos);
}

/* N-link. */
NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                          nvmlIntNvLinkDeviceType_t *type)
{
    (void)link;
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || type == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}

NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                          nvmlPciInfo_t *pci)
{
    (void)link;
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}

NVML_API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_SUPPORTED;
}

/* N-ver. */
NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    if (cudaDriverVersion == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUresult (*get)(int *) = h ? (CUresult (*)(int *))dlsym(h, "cuDriverGetVersion") : NULL;
    nvmlReturn_t r = (get != NULL && get(cudaDriverVersion) == CUDA_SUCCESS) ? NVML_SUCCESS
                                                                             : NVML_ERROR_UNKNOWN;
    if (h)
        dlclose(h);
    return r;
}

NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion);
}
