/* fake_rt_ipc: cross-process CUDA IPC through the fake libcudart.so.12 (memory and
 * events), exporter and importer as separate processes.
 *
 * Why it exists: rule R3 is about exactly this traffic; the unguarded path must work
 * byte for byte before a guard may deny part of it.
 *
 *   fake_rt_ipc export <device> <bytes>
 *       allocates and fills pattern A, exports the memory and an interprocess event,
 *       prints "MEM <hex>" and "EVT <hex>" lines, then waits for a line on stdin; the
 *       importer has by then written pattern B and recorded the event: checks both.
 *   fake_rt_ipc import <device> <bytes> <mem hex> <evt hex>
 *       opens both handles on <device>, checks pattern A, writes pattern B, records and
 *       synchronizes the event, closes the handles.
 * The handle is opaque (runtime docs): the test passes it as hex, through pipes.
 */
#include <string.h>

#include "fake_rt_check.h"

static unsigned char pattern(int which, size_t i)
{
    return which == 'A' ? (unsigned char)(i * 13 + 1) : (unsigned char)(255 - i * 3);
}

static int check_pattern(const unsigned char *b, size_t n, int which)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != pattern(which, i))
            return 0;
    return 1;
}

static void to_hex(const void *p, size_t n, char *out)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

static int from_hex(const char *s, void *p, size_t n)
{
    unsigned char *b = p;
    if (strlen(s) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned int v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        b[i] = (unsigned char)v;
    }
    return 0;
}

static int do_export(int dev, size_t n)
{
    unsigned char *host = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++)
        host[i] = pattern('A', i);
    MUST_RT(cudaSetDevice(dev));
    void *d = NULL;
    MUST_RT(cudaMalloc(&d, n));
    MUST_RT(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice));

    cudaIpcMemHandle_t mh;
    cudaIpcEventHandle_t eh;
    cudaEvent_t ev, plain;
    EXPECT_RT(cudaIpcGetMemHandle(&mh, d), cudaSuccess);
    cudaIpcMemHandle_t again;
    EXPECT_RT(cudaIpcGetMemHandle(&again, d), cudaSuccess);
    CHECK(!memcmp(&mh, &again, sizeof mh), "the handle of one allocation is stable");
    EXPECT_RT(cudaIpcGetMemHandle(NULL, d), cudaErrorInvalidValue);
    MUST_RT(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
    EXPECT_RT(cudaIpcGetEventHandle(&eh, ev), cudaSuccess);
    MUST_RT(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming));
    cudaIpcEventHandle_t bad;
    CHECK(cudaIpcGetEventHandle(&bad, plain) != cudaSuccess,
          "an event without cudaEventInterprocess has no IPC handle");
    cudaGetLastError();

    char hex[2 * 64 + 1];
    to_hex(&mh, sizeof mh, hex);
    printf("MEM %s\n", hex);
    to_hex(&eh, sizeof eh, hex);
    printf("EVT %s\n", hex);
    fflush(stdout);

    char line[64];
    if (!fgets(line, sizeof line, stdin)) {
        printf("FAIL no go-ahead line on stdin\n");
        return 1;
    }
    EXPECT_RT(cudaEventSynchronize(ev), cudaSuccess);
    EXPECT_RT(cudaEventQuery(ev), cudaSuccess);
    memset(back, 0, n);
    MUST_RT(cudaMemcpy(back, d, n, cudaMemcpyDeviceToHost));
    CHECK(check_pattern(back, n, 'B'), "exporter sees the importer's %zu bytes", n);
    EXPECT_RT(cudaEventDestroy(ev), cudaSuccess);
    EXPECT_RT(cudaEventDestroy(plain), cudaSuccess);
    EXPECT_RT(cudaFree(d), cudaSuccess);
    free(host);
    free(back);
    return rt_done("fake_rt_ipc export");
}

static int do_import(int dev, size_t n, const char *mem_hex, const char *evt_hex)
{
    cudaIpcMemHandle_t mh;
    cudaIpcEventHandle_t eh;
    if (from_hex(mem_hex, &mh, sizeof mh) || from_hex(evt_hex, &eh, sizeof eh)) {
        printf("FAIL handles must be %zu and %zu bytes of hex\n", sizeof mh, sizeof eh);
        return 2;
    }
    unsigned char *host = malloc(n), *back = malloc(n);
    MUST_RT(cudaSetDevice(dev));
    void *p = NULL;
    EXPECT_RT(cudaIpcOpenMemHandle(&p, mh, 0), cudaErrorInvalidValue);
    EXPECT_RT(cudaIpcOpenMemHandle(&p, mh, 2), cudaErrorInvalidValue);
    EXPECT_RT(cudaIpcOpenMemHandle(NULL, mh, cudaIpcMemLazyEnablePeerAccess), cudaErrorInvalidValue);
    cudaGetLastError();
    EXPECT_RT(cudaIpcOpenMemHandle(&p, mh, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
    if (!p) {
        printf("FAIL no pointer from cudaIpcOpenMemHandle\n");
        return 1;
    }
    memset(back, 0, n);
    EXPECT_RT(cudaMemcpy(back, p, n, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(check_pattern(back, n, 'A'), "importer reads the exporter's %zu bytes", n);
    for (size_t i = 0; i < n; i++)
        host[i] = pattern('B', i);
    EXPECT_RT(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice), cudaSuccess);

    cudaEvent_t ev = NULL;
    EXPECT_RT(cudaIpcOpenEventHandle(&ev, eh), cudaSuccess);
    EXPECT_RT(cudaEventRecord(ev, 0), cudaSuccess);
    EXPECT_RT(cudaEventSynchronize(ev), cudaSuccess);
    EXPECT_RT(cudaEventQuery(ev), cudaSuccess);
    EXPECT_RT(cudaEventDestroy(ev), cudaSuccess);
    EXPECT_RT(cudaIpcCloseMemHandle(p), cudaSuccess);
    free(host);
    free(back);
    return rt_done("fake_rt_ipc import");
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "export"))
        return do_export(atoi(argv[2]), (size_t)strtoul(argv[3], NULL, 10));
    if (argc == 6 && !strcmp(argv[1], "import"))
        return do_import(atoi(argv[2]), (size_t)strtoul(argv[3], NULL, 10), argv[4], argv[5]);
    fprintf(stderr, "usage: fake_rt_ipc export <device> <bytes>\n"
                    "       fake_rt_ipc import <device> <bytes> <mem hex> <evt hex>\n");
    return 2;
}
