/* Stream-ordered memory pools on the fake driver: local rules (default pool,
 * cuMemAllocAsync/cuMemFreeAsync, access, export restrictions) and a pool exported as a
 * POSIX fd over a unix socket to a child exec'd with its own CUDA_VISIBLE_DEVICES, which
 * imports the pool and one exported pointer and checks the bytes both ways.
 * Driven by python-tests/test_fake_driver.py.
 *   fake_drv_pool <dev:N|hostnuma:K> <child CVD | <unset>>
 *   fake_drv_pool child <socket fd>                         (internal)
 * Prints `exporter-physical N`, `child-ordinal N`, `child-physical N`. */
#include <cuda.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakecuda_drvtest.h"

#define N (1u << 20)

static int send_fd(int sock, int fd, const void *data, size_t len)
{
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {(void *)data, len};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    return sendmsg(sock, &msg, 0) == (ssize_t)len ? 0 : -1;
}

static int recv_fd(int sock, void *data, size_t len)
{
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {data, len};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    if (recvmsg(sock, &msg, MSG_WAITALL) != (ssize_t)len)
        return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof fd);
    return fd;
}

static void setup(int ordinal)
{
    CUcontext c;
    MUST(cuInit(0));
    MUST(cuDevicePrimaryCtxRetain(&c, ordinal));
    MUST(cuCtxSetCurrent(c));
}

static int child(int sock)
{
    CUmemPoolPtrExportData data;
    int fd = recv_fd(sock, &data, sizeof data);
    EXPECT(fd >= 0, "received the pool fd and a pointer's export data");
    setup(0);
    CUmemoryPool pool;
    MUST(cuMemPoolImportFromShareableHandle(&pool, (void *)(uintptr_t)fd,
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    close(fd);
    CUdeviceptr p;
    EXPECT_RC(cuMemAllocFromPoolAsync(&p, 4096, pool, NULL), CUDA_ERROR_INVALID_VALUE);
    MUST(cuMemPoolImportPointer(&p, pool, &data));
    static unsigned char buf[N];
    MUST(cuMemcpyDtoH(buf, p, N));
    int same = 1;
    for (unsigned i = 0; i < N; i++)
        same &= buf[i] == (unsigned char)(i * 5 + 3);
    EXPECT(same, "importer reads the exported pointer's %u bytes", N);
    int ord = -9;
    CUmemoryPool owner = NULL;
    MUST(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
    MUST(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p));
    EXPECT(owner == pool, "imported pointer reports the imported pool");
    printf("child-ordinal %d\n", ord);
    printf("child-physical %d\n", fakecuda_pointer_physical_gpu(p));
    MUST(cuMemsetD8(p, 0xcd, 32));
    MUST(cuMemFreeAsync(p, NULL));
    MUST(cuStreamSynchronize(NULL));
    CUmemPoolPtrExportData junk;
    memset(&junk, 0, sizeof junk);
    EXPECT_RC(cuMemPoolImportPointer(&p, pool, &junk), CUDA_ERROR_INVALID_VALUE);
    if (write(sock, "k", 1) != 1)
        return 2;
    return drvtest_done();
}

static void local_rules(void)
{
    CUmemoryPool def, cur;
    CUdevice me;
    MUST(cuCtxGetDevice(&me));
    MUST(cuDeviceGetDefaultMemPool(&def, me));
    MUST(cuDeviceGetMemPool(&cur, me));
    EXPECT(def == cur, "the current pool starts as the default pool");
    EXPECT_RC(cuDeviceGetDefaultMemPool(&def, 8), CUDA_ERROR_INVALID_DEVICE);
    CUdeviceptr a;
    MUST(cuMemAllocAsync(&a, 1000, NULL));
    CUmemoryPool owner = NULL;
    MUST(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a));
    EXPECT(owner == cur, "cuMemAllocAsync allocates from the current pool");
    CUipcMemHandle h;
    EXPECT_RC(cuIpcGetMemHandle(&h, a), CUDA_ERROR_INVALID_VALUE);
    CUmemPoolPtrExportData d;
    EXPECT_RC(cuMemPoolExportPointer(&d, a), CUDA_ERROR_INVALID_VALUE);   /* pool not exportable */
    int fd;
    EXPECT_RC(cuMemPoolExportToShareableHandle(&fd, def, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
    MUST(cuMemFreeAsync(a, NULL));
    EXPECT_RC(cuMemFreeAsync(a, NULL), CUDA_ERROR_INVALID_VALUE);
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 8;
    CUmemoryPool bad;
    EXPECT_RC(cuMemPoolCreate(&bad, &props), CUDA_ERROR_INVALID_DEVICE);
    props.location.id = 1;
    props.handleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    EXPECT_RC(cuMemPoolCreate(&bad, &props), CUDA_ERROR_NOT_SUPPORTED);
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    CUmemoryPool p1;
    MUST(cuMemPoolCreate(&p1, &props));
    EXPECT_RC(cuDeviceSetMemPool(0, p1), CUDA_ERROR_INVALID_VALUE);   /* p1 lives on ordinal 1 */
    MUST(cuDeviceSetMemPool(1, p1));
    CUmemLocation l0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
    CUmemAccess_flags fl;
    MUST(cuMemPoolGetAccess(&fl, p1, &l1));
    EXPECT(fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "a pool's own device has read-write access");
    MUST(cuMemPoolGetAccess(&fl, p1, &l0));
    EXPECT(fl == CU_MEM_ACCESS_FLAGS_PROT_NONE, "other devices start without access");
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    MUST(cuMemPoolSetAccess(p1, &acc, 1));
    MUST(cuMemPoolGetAccess(&fl, p1, &l0));
    EXPECT(fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "cuMemPoolSetAccess grants ordinal 0");
    acc.location.id = 8;
    EXPECT_RC(cuMemPoolSetAccess(p1, &acc, 1), CUDA_ERROR_INVALID_DEVICE);
    MUST(cuMemAllocFromPoolAsync(&a, 64, p1, NULL));
    int ord = -1;
    MUST(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a));
    EXPECT(ord == 1, "allocation from a pool on ordinal 1 reports ordinal 1");
    MUST(cuMemFreeAsync(a, NULL));
    MUST(cuMemPoolDestroy(p1));
    EXPECT_RC(cuMemPoolDestroy(p1), CUDA_ERROR_INVALID_VALUE);
    MUST(cuDeviceGetMemPool(&cur, 1));
    EXPECT(cur != p1, "destroying the current pool restores the default");
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "child"))
        return child(atoi(argv[2]));
    if (argc != 3) {
        fprintf(stderr, "usage: fake_drv_pool <dev:N|hostnuma:K> <child CVD|<unset>>\n");
        return 2;
    }
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    int ordinal = 0;
    if (!strncmp(argv[1], "dev:", 4)) {
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ordinal = atoi(argv[1] + 4);
    } else {
        props.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        props.location.id = atoi(argv[1] + 9);
    }
    setup(ordinal);
    local_rules();
    CUmemoryPool pool;
    MUST(cuMemPoolCreate(&pool, &props));
    CUdeviceptr first, p;
    MUST(cuMemAllocFromPoolAsync(&first, 4096, pool, NULL));
    MUST(cuMemAllocFromPoolAsync(&p, N, pool, CU_STREAM_PER_THREAD));
    static unsigned char buf[N];
    for (unsigned i = 0; i < N; i++)
        buf[i] = (unsigned char)(i * 5 + 3);
    MUST(cuMemcpyHtoD(p, buf, N));
    printf("exporter-physical %d\n", fakecuda_pointer_physical_gpu(p));
    CUmemPoolPtrExportData data;
    MUST(cuMemPoolExportPointer(&data, p));
    int fd = -1;
    MUST(cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
        return 2;
    if (!strcmp(argv[2], "<unset>"))
        unsetenv("CUDA_VISIBLE_DEVICES");
    else
        setenv("CUDA_VISIBLE_DEVICES", argv[2], 1);
    char sfd[16];
    snprintf(sfd, sizeof sfd, "%d", sv[1]);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        execl("/proc/self/exe", "fake_drv_pool", "child", sfd, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    EXPECT(send_fd(sv[0], fd, &data, sizeof data) == 0, "pool fd and pointer data sent (SCM_RIGHTS)");
    close(fd);
    char ack = 0;
    ssize_t got = read(sv[0], &ack, 1);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(got == 1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "importer process passed (exit %d)", WEXITSTATUS(status));
    MUST(cuMemcpyDtoH(buf, p, 33));
    EXPECT(buf[0] == 0xcd && buf[31] == 0xcd && buf[32] == (unsigned char)(32 * 5 + 3),
           "exporter sees the importer's writes");
    MUST(cuMemFreeAsync(p, NULL));
    MUST(cuMemFreeAsync(first, NULL));
    MUST(cuMemPoolDestroy(pool));
    return drvtest_done();
}
