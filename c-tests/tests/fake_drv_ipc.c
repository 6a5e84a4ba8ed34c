/* Legacy CUDA IPC across real processes on the fake driver: memory and events exported by
 * one process and opened by a child exec'd with its own CUDA_VISIBLE_DEVICES, with
 * byte-for-byte checks both ways. Driven by python-tests/test_fake_driver.py.
 *   fake_drv_ipc <exporter ordinal> <child CVD | <unset>>   full exchange (prints lines
 *        `exporter-gpu N`, `child-ordinal N`, `child-physical N` for the python side)
 *   fake_drv_ipc stale      opening a handle whose exporter has exited fails
 *   fake_drv_ipc child <memhandle hex> <eventhandle hex>    (internal) */
#include <cuda.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakecuda_drvtest.h"

#define SIZE (1u << 20)
#define OFFSET 4096

static void hex(const void *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", ((const unsigned char *)p)[i]);
}

static void unhex(const char *s, void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(s + 2 * i, "%2x", &v);
        ((unsigned char *)p)[i] = (unsigned char)v;
    }
}

static CUcontext ctx_on(int ordinal)
{
    CUcontext c;
    MUST(cuInit(0));
    MUST(cuDevicePrimaryCtxRetain(&c, ordinal));
    MUST(cuCtxSetCurrent(c));
    return c;
}

static int child(const char *mh, const char *eh)
{
    CUipcMemHandle m;
    CUipcEventHandle e;
    unhex(mh, &m, sizeof m);
    unhex(eh, &e, sizeof e);
    ctx_on(0);
    CUdeviceptr p;
    MUST(cuIpcOpenMemHandle(&p, m, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CUdeviceptr p2;
    MUST(cuIpcOpenMemHandle(&p2, m, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    EXPECT(p2 == p, "opening the same handle twice gives the same pointer");
    static unsigned char buf[SIZE];
    MUST(cuMemcpyDtoH(buf, p, SIZE));
    int same = 1;
    for (unsigned i = 0; i < SIZE; i++)
        same &= buf[i] == (unsigned char)(i * 31 + 7);
    EXPECT(same, "importer reads the exporter's %u bytes from the base (handle was of base+%d)",
           SIZE, OFFSET);
    int ord = -9;
    MUST(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
    printf("child-ordinal %d\n", ord);
    printf("child-physical %d\n", fakecuda_pointer_physical_gpu(p));
    for (unsigned i = 0; i < 4096; i++)
        buf[i] = (unsigned char)(255 - i % 256);
    MUST(cuMemcpyHtoD(p + 100, buf, 4096));
    CUevent ev;
    MUST(cuIpcOpenEventHandle(&ev, e));
    EXPECT_RC(cuEventQuery(ev), CUDA_SUCCESS);
    EXPECT_RC(cuEventSynchronize(ev), CUDA_SUCCESS);
    EXPECT_RC(cuStreamWaitEvent(NULL, ev, 0), CUDA_SUCCESS);
    EXPECT(fakecuda_ipc_event_records(ev) == 1, "the exporter's record is visible to the importer");
    MUST(cuEventRecord(ev, NULL));
    MUST(cuEventDestroy(ev));
    MUST(cuIpcCloseMemHandle(p));
    MUST(cuIpcCloseMemHandle(p2));
    EXPECT_RC(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
    return drvtest_done();
}

static int stale(void)
{
    int fds[2];
    if (pipe(fds))
        return 2;
    pid_t pid = fork();
    if (pid == 0) {
        CUipcMemHandle m;
        CUdeviceptr p;
        ctx_on(0);
        if (cuMemAlloc(&p, 4096) || cuIpcGetMemHandle(&m, p) || write(fds[1], &m, sizeof m) != sizeof m)
            _exit(1);
        _exit(0);
    }
    CUipcMemHandle m;
    int status;
    ssize_t got = read(fds[0], &m, sizeof m);
    waitpid(pid, &status, 0);
    EXPECT(got == sizeof m && WIFEXITED(status) && WEXITSTATUS(status) == 0, "exporter made a handle and exited");
    ctx_on(0);
    CUdeviceptr p;
    EXPECT_RC(cuIpcOpenMemHandle(&p, m, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_VALUE);
    return drvtest_done();
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "child"))
        return child(argv[2], argv[3]);
    if (argc == 2 && !strcmp(argv[1], "stale"))
        return stale();
    if (argc != 3) {
        fprintf(stderr, "usage: fake_drv_ipc <exporter ordinal> <child CVD|<unset>> | stale\n");
        return 2;
    }
    ctx_on(atoi(argv[1]));
    CUdeviceptr p;
    MUST(cuMemAlloc(&p, SIZE));
    static unsigned char buf[SIZE];
    for (unsigned i = 0; i < SIZE; i++)
        buf[i] = (unsigned char)(i * 31 + 7);
    MUST(cuMemcpyHtoD(p, buf, SIZE));
    printf("exporter-gpu %d\n", fakecuda_pointer_physical_gpu(p));
    CUipcMemHandle m;
    MUST(cuIpcGetMemHandle(&m, p + OFFSET));
    CUevent ev;
    MUST(cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
    MUST(cuEventRecord(ev, NULL));
    CUipcEventHandle e;
    MUST(cuIpcGetEventHandle(&e, ev));
    char mh[2 * sizeof m + 1], eh[2 * sizeof e + 1];
    hex(&m, sizeof m, mh);
    hex(&e, sizeof e, eh);
    if (!strcmp(argv[2], "<unset>"))
        unsetenv("CUDA_VISIBLE_DEVICES");
    else
        setenv("CUDA_VISIBLE_DEVICES", argv[2], 1);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "fake_drv_ipc", "child", mh, eh, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "importer process passed (exit %d)",
           WEXITSTATUS(status));
    MUST(cuMemcpyDtoH(buf, p, SIZE));
    int ok = buf[99] == (unsigned char)(99 * 31 + 7) && buf[4196] == (unsigned char)(4196 * 31 + 7);
    for (unsigned i = 0; i < 4096; i++)
        ok &= buf[100 + i] == (unsigned char)(255 - i % 256);
    EXPECT(ok, "exporter sees the importer's 4096 bytes at +100, and its own around them");
    EXPECT(fakecuda_ipc_event_records(ev) == 2, "the importer's record is visible to the exporter");
    MUST(cuEventDestroy(ev));
    MUST(cuMemFree(p));
    return drvtest_done();
}
