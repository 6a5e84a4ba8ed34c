/* fake_rt_basic: versions, device selection, attributes, errors, streams and events of
 * the fake libcudart.so.12, against the fake driver.
 *
 * Why it exists: these are the runtime calls whose ordinal and error semantics rankguard
 * reproduces and checks (cudaSetDevice's cudaErrorInvalidDevice, last-error rules,
 * primary-context binding); their expected values come from cuda_runtime_api.h's docs.
 * Usage: fake_rt_basic <expected device count>   (pytest sets FAKECUDA_GPUS to match)
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "fake_rt_check.h"

static void *thread_device(void *arg)
{
    int *out = arg;
    *out = -1;
    cudaGetDevice(out);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fake_rt_basic <expected device count>\n");
        return 2;
    }
    int expected = atoi(argv[1]);

    int v = 0;
    EXPECT_RT(cudaRuntimeGetVersion(&v), cudaSuccess);
    CHECK(v == 12090, "cudaRuntimeGetVersion = %d (want 12090)", v);
    EXPECT_RT(cudaRuntimeGetVersion(NULL), cudaErrorInvalidValue);
    v = 0;
    EXPECT_RT(cudaDriverGetVersion(&v), cudaSuccess);
    int drv_v = 0;
    cuDriverGetVersion(&drv_v);
    CHECK(v == drv_v && v >= 12000, "cudaDriverGetVersion = %d (driver says %d)", v, drv_v);
    EXPECT_RT(cudaGetLastError(), cudaErrorInvalidValue); /* from the NULL call above */
    EXPECT_RT(cudaGetLastError(), cudaSuccess);

    int count = -1;
    EXPECT_RT(cudaGetDeviceCount(&count), cudaSuccess);
    CHECK(count == expected, "cudaGetDeviceCount = %d (want %d)", count, expected);
    if (count != expected || count < 2) {
        printf("FAIL need at least 2 devices for the rest\n");
        return 1;
    }

    int dev = -1;
    EXPECT_RT(cudaGetDevice(&dev), cudaSuccess);
    CHECK(dev == 0, "default device is %d (want 0)", dev);

    /* cudaSetDevice: ordinal >= count and negative ones are cudaErrorInvalidDevice, the
     * device does not change, and the error is the thread's last error until read. */
    EXPECT_RT(cudaSetDevice(count), cudaErrorInvalidDevice);
    EXPECT_RT(cudaSetDevice(-1), cudaErrorInvalidDevice);
    EXPECT_RT(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    EXPECT_RT(cudaPeekAtLastError(), cudaErrorInvalidDevice);
    EXPECT_RT(cudaGetLastError(), cudaErrorInvalidDevice);
    EXPECT_RT(cudaGetLastError(), cudaSuccess);
    cudaGetDevice(&dev);
    CHECK(dev == 0, "device still %d after failed cudaSetDevice", dev);

    /* CUDA 12 cudaSetDevice makes the device's primary context current immediately. */
    int last = count - 1;
    EXPECT_RT(cudaSetDevice(last), cudaSuccess);
    cudaGetDevice(&dev);
    CHECK(dev == last, "cudaGetDevice = %d after cudaSetDevice(%d)", dev, last);
    CUcontext cur = NULL, prim = NULL;
    CUdevice cu_last, cu_cur = -1;
    EXPECT_CU(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    EXPECT_CU(cuDeviceGet(&cu_last, last), CUDA_SUCCESS);
    EXPECT_CU(cuDevicePrimaryCtxRetain(&prim, cu_last), CUDA_SUCCESS);
    CHECK(cur != NULL && cur == prim, "current context is device %d's primary context", last);
    EXPECT_CU(cuCtxGetDevice(&cu_cur), CUDA_SUCCESS);
    CHECK(cu_cur == cu_last, "cuCtxGetDevice = %d (want %d)", (int)cu_cur, (int)cu_last);
    cuDevicePrimaryCtxRelease(cu_last);

    /* The current device is per host thread. */
    pthread_t t;
    int other = -2;
    pthread_create(&t, NULL, thread_device, &other);
    pthread_join(t, NULL);
    CHECK(other == 0, "a new thread's device is %d (want 0)", other);

    /* cudaInitDevice: initializes the primary context without making it current. */
    EXPECT_RT(cudaInitDevice(count, 0, 0), cudaErrorInvalidDevice);
    EXPECT_RT(cudaInitDevice(1, 0, 2), cudaErrorInvalidValue);
    EXPECT_RT(cudaInitDevice(1, 0, 0), cudaSuccess);
    CUdevice cu1;
    cuDeviceGet(&cu1, 1);
    unsigned int pflags = 0;
    int active = 0;
    EXPECT_CU(cuDevicePrimaryCtxGetState(cu1, &pflags, &active), CUDA_SUCCESS);
    CHECK(active == 1, "device 1's primary context is active after cudaInitDevice");
    cuCtxGetCurrent(&cur);
    CHECK(cur == prim, "cudaInitDevice(1) left device %d's context current", last);
    cudaGetLastError();

    /* Attributes and PCI bus ids: runtime ordinals are driver ordinals. */
    for (int i = 0; i < count; i++) {
        int a = -1, b = -2, bus = -1;
        CUdevice cd;
        cuDeviceGet(&cd, i);
        EXPECT_RT(cudaDeviceGetAttribute(&a, cudaDevAttrMultiProcessorCount, i), cudaSuccess);
        cuDeviceGetAttribute(&b, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, cd);
        CHECK(a == b && a > 0, "device %d SM count %d = driver's %d", i, a, b);
        EXPECT_RT(cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, i), cudaSuccess);
        CHECK(bus == 0x18 + 0x10 * i, "device %d PCI bus 0x%x (want 0x%x)", i, bus, 0x18 + 0x10 * i);
        char id[64] = "", want[64];
        snprintf(want, sizeof want, "0000:%02x:00.0", 0x18 + 0x10 * i);
        EXPECT_RT(cudaDeviceGetPCIBusId(id, sizeof id, i), cudaSuccess);
        CHECK(strcasecmp(id, want) == 0, "device %d PCI bus id \"%s\" (want %s)", i, id, want);
    }
    EXPECT_RT(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, count), cudaErrorInvalidDevice);
    EXPECT_RT(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, -1), cudaErrorInvalidDevice);
    EXPECT_RT(cudaDeviceGetAttribute(NULL, cudaDevAttrMultiProcessorCount, 0), cudaErrorInvalidValue);
    EXPECT_RT(cudaDeviceGetAttribute(&v, (enum cudaDeviceAttr)100000, 0), cudaErrorInvalidValue);
    char small[64];
    EXPECT_RT(cudaDeviceGetPCIBusId(small, sizeof small, count), cudaErrorInvalidDevice);
    EXPECT_RT(cudaDeviceGetPCIBusId(NULL, 64, 0), cudaErrorInvalidValue);

    /* cudaGetDeviceProperties (cuda_runtime_api.h maps it to cudaGetDeviceProperties_v2). */
    for (int i = 0; i < count; i++) {
        struct cudaDeviceProp prop;
        memset(&prop, 0xff, sizeof prop);
        EXPECT_RT(cudaGetDeviceProperties(&prop, i), cudaSuccess);
        CUdevice cd;
        cuDeviceGet(&cd, i);
        char name[256] = "";
        CUuuid u;
        size_t mem = 0;
        int sms = 0, major = 0;
        cuDeviceGetName(name, sizeof name, cd);
        cuDeviceGetUuid_v2(&u, cd);
        cuDeviceTotalMem(&mem, cd);
        cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, cd);
        cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cd);
        CHECK(!strcmp(prop.name, name) && !memcmp(&prop.uuid, &u, sizeof u) &&
              prop.totalGlobalMem == mem && prop.multiProcessorCount == sms &&
              prop.major == major && prop.pciBusID == 0x18 + 0x10 * i && prop.pciDomainID == 0,
              "device %d properties: %s, %zu bytes, %d SMs, cc %d.%d, bus 0x%x", i, prop.name,
              prop.totalGlobalMem, prop.multiProcessorCount, prop.major, prop.minor, prop.pciBusID);
    }
    struct cudaDeviceProp prop;
    EXPECT_RT(cudaGetDeviceProperties(&prop, count), cudaErrorInvalidDevice);
    EXPECT_RT(cudaGetDeviceProperties(NULL, 0), cudaErrorInvalidValue);
    cudaGetLastError();

    /* Error names and strings. */
    CHECK(!strcmp(cudaGetErrorName(cudaErrorInvalidDevice), "cudaErrorInvalidDevice"), "name 101");
    CHECK(!strcmp(cudaGetErrorString(cudaErrorInvalidDevice), "invalid device ordinal"), "string 101");
    CHECK(!strcmp(cudaGetErrorName(cudaSuccess), "cudaSuccess"), "name 0");
    CHECK(!strcmp(cudaGetErrorString(cudaSuccess), "no error"), "string 0");
    CHECK(!strcmp(cudaGetErrorName(cudaErrorNotPermitted), "cudaErrorNotPermitted"), "name 800");
    CHECK(!strcmp(cudaGetErrorString(cudaErrorNotPermitted), "operation not permitted"), "string 800");
    CHECK(!strcmp(cudaGetErrorName(cudaErrorPeerAccessAlreadyEnabled),
                  "cudaErrorPeerAccessAlreadyEnabled"), "name 704");
    CHECK(!strcmp(cudaGetErrorString(cudaErrorNoDevice), "no CUDA-capable device is detected"),
          "string 100");
    CHECK(!strcmp(cudaGetErrorName((cudaError_t)123456), "unrecognized error code"), "unknown name");
    CHECK(!strcmp(cudaGetErrorString((cudaError_t)123456), "unrecognized error code"), "unknown string");

    /* Streams and events on the current device. */
    EXPECT_RT(cudaDeviceSynchronize(), cudaSuccess);
    cudaStream_t s = NULL;
    EXPECT_RT(cudaStreamCreate(&s), cudaSuccess);
    EXPECT_RT(cudaStreamCreate(NULL), cudaErrorInvalidValue);
    cudaEvent_t ev = NULL, ev2 = NULL;
    EXPECT_RT(cudaEventCreate(&ev), cudaSuccess);
    EXPECT_RT(cudaEventQuery(ev), cudaSuccess); /* never recorded: complete */
    EXPECT_RT(cudaEventRecord(ev, s), cudaSuccess);
    EXPECT_RT(cudaEventSynchronize(ev), cudaSuccess);
    EXPECT_RT(cudaEventQuery(ev), cudaSuccess);
    EXPECT_RT(cudaEventRecord(ev, 0), cudaSuccess);
    EXPECT_RT(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_RT(cudaStreamSynchronize(0), cudaSuccess);
    EXPECT_RT(cudaEventCreateWithFlags(&ev2, 0x100), cudaErrorInvalidValue);
    EXPECT_RT(cudaEventCreateWithFlags(&ev2, cudaEventInterprocess), cudaErrorInvalidValue);
    EXPECT_RT(cudaEventCreateWithFlags(&ev2, cudaEventInterprocess | cudaEventDisableTiming),
              cudaSuccess);
    EXPECT_RT(cudaEventDestroy(ev2), cudaSuccess);
    EXPECT_RT(cudaEventDestroy(ev), cudaSuccess);
    EXPECT_RT(cudaStreamDestroy(s), cudaSuccess);
    cudaGetLastError();

    /* cudaDeviceReset: the device comes back on the next call. */
    void *p = NULL;
    EXPECT_RT(cudaMalloc(&p, 4096), cudaSuccess);
    EXPECT_RT(cudaDeviceReset(), cudaSuccess);
    EXPECT_RT(cudaMalloc(&p, 4096), cudaSuccess);
    cuCtxGetCurrent(&cur);
    CUcontext prim2 = NULL;
    cuDevicePrimaryCtxRetain(&prim2, cu_last);
    CHECK(cur != NULL && cur == prim2, "after cudaDeviceReset the primary context is current again");
    cuDevicePrimaryCtxRelease(cu_last);
    EXPECT_RT(cudaFree(p), cudaSuccess);
    cudaGetDevice(&dev);
    CHECK(dev == last, "cudaDeviceReset keeps the current device (%d)", dev);

    return rt_done("fake_rt_basic");
}
