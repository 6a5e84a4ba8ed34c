/* VMM export/import across real processes on the fake driver: the exporter creates an
 * allocation (device or host location), maps it, fills it, exports a POSIX fd and passes
 * it over a unix socket (SCM_RIGHTS) to a child exec'd with its own CUDA_VISIBLE_DEVICES;
 * the child checks the fd is the same inode, imports, maps, reads and writes the bytes.
 * Driven by python-tests/test_fake_driver.py.
 *   fake_drv_vmm <dev:N|host|hostnuma:K|hostcur> <child CVD | <unset>>
 *   fake_drv_vmm child <socket fd> <st_dev> <st_ino>        (internal)
 * Prints `child-prop <type> <id>`, `child-ordinal N`, `child-physical N`. */
#include <cuda.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakecuda_drvtest.h"

#define SIZE (2u << 20)

static CUdeviceptr map(CUmemGenericAllocationHandle h, int access_ordinal)
{
    CUdeviceptr va;
    MUST(cuMemAddressReserve(&va, SIZE, 0, 0, 0));
    MUST(cuMemMap(va, SIZE, 0, h, 0));
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, access_ordinal}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    MUST(cuMemSetAccess(va, SIZE, &a, 1));
    return va;
}

static void unmap(CUdeviceptr va)
{
    MUST(cuMemUnmap(va, SIZE));
    MUST(cuMemAddressFree(va, SIZE));
}

static int child(int sock, unsigned long long dev, unsigned long long ino)
{
    char cbuf[CMSG_SPACE(sizeof(int))];
    char byte;
    struct iovec iov = {&byte, 1};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    if (recvmsg(sock, &msg, 0) != 1) {
        printf("FAIL recvmsg\n");
        return 2;
    }
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    int fd;
    memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    struct stat st;
    fstat(fd, &st);
    EXPECT((unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino,
           "the received fd is the exporter's inode (%llu)", ino);
    CUcontext c;
    MUST(cuInit(0));
    MUST(cuDevicePrimaryCtxRetain(&c, 0));
    MUST(cuCtxSetCurrent(c));
    CUmemGenericAllocationHandle h;
    MUST(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);                       /* the imported handle does not need the fd any more */
    CUmemAllocationProp prop;
    MUST(cuMemGetAllocationPropertiesFromHandle(&prop, h));
    printf("child-prop %d %d\n", (int)prop.location.type, prop.location.id);
    CUdeviceptr va = map(h, 0);
    static unsigned char buf[SIZE];
    MUST(cuMemcpyDtoH(buf, va, SIZE));
    int same = 1;
    for (unsigned i = 0; i < SIZE; i++)
        same &= buf[i] == (unsigned char)(i * 13 + 1);
    EXPECT(same, "importer reads the exporter's %u bytes", SIZE);
    int ord = -9;
    MUST(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va));
    printf("child-ordinal %d\n", ord);
    printf("child-physical %d\n", fakecuda_pointer_physical_gpu(va));
    MUST(cuMemsetD8(va + SIZE - 10, 0xee, 10));
    unmap(va);
    MUST(cuMemRelease(h));
    if (write(sock, "k", 1) != 1)
        return 2;
    return drvtest_done();
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "child"))
        return child(atoi(argv[2]), strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
    if (argc != 3) {
        fprintf(stderr, "usage: fake_drv_vmm <dev:N|host|hostnuma:K|hostcur> <child CVD|<unset>>\n");
        return 2;
    }
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    int access = 0;
    if (!strncmp(argv[1], "dev:", 4)) {
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = access = atoi(argv[1] + 4);
    } else if (!strcmp(argv[1], "host")) {
        prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    } else if (!strncmp(argv[1], "hostnuma:", 9)) {
        prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        prop.location.id = atoi(argv[1] + 9);
    } else if (!strcmp(argv[1], "hostcur")) {
        prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
    } else {
        fprintf(stderr, "fake_drv_vmm: unknown location %s\n", argv[1]);
        return 2;
    }
    CUcontext c;
    MUST(cuInit(0));
    MUST(cuDevicePrimaryCtxRetain(&c, access));
    MUST(cuCtxSetCurrent(c));
    CUmemGenericAllocationHandle h;
    MUST(cuMemCreate(&h, SIZE, &prop, 0));
    CUdeviceptr va = map(h, access);
    static unsigned char buf[SIZE];
    for (unsigned i = 0; i < SIZE; i++)
        buf[i] = (unsigned char)(i * 13 + 1);
    MUST(cuMemcpyHtoD(va, buf, SIZE));
    printf("exporter-physical %d\n", fakecuda_pointer_physical_gpu(va));
    int fd = -1;
    MUST(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    struct stat st;
    fstat(fd, &st);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
        return 2;
    if (!strcmp(argv[2], "<unset>"))
        unsetenv("CUDA_VISIBLE_DEVICES");
    else
        setenv("CUDA_VISIBLE_DEVICES", argv[2], 1);
    char sfd[16], sdev[32], sino[32];
    snprintf(sfd, sizeof sfd, "%d", sv[1]);
    snprintf(sdev, sizeof sdev, "%llu", (unsigned long long)st.st_dev);
    snprintf(sino, sizeof sino, "%llu", (unsigned long long)st.st_ino);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        execl("/proc/self/exe", "fake_drv_vmm", "child", sfd, sdev, sino, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    char byte = 'f', cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&byte, 1};
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
    EXPECT(sendmsg(sv[0], &msg, 0) == 1, "fd sent over a unix socket (SCM_RIGHTS)");
    close(fd);
    int status = 0;
    char ack = 0;
    ssize_t got = read(sv[0], &ack, 1);
    waitpid(pid, &status, 0);
    EXPECT(got == 1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "importer process passed (exit %d)", WEXITSTATUS(status));
    MUST(cuMemcpyDtoH(buf, va + SIZE - 11, 11));
    EXPECT(buf[0] == (unsigned char)((SIZE - 11) * 13 + 1) && buf[1] == 0xee && buf[10] == 0xee,
           "exporter sees the importer's writes");
    unmap(va);
    MUST(cuMemRelease(h));
    return drvtest_done();
}
