/* R3 (no cross-device IPC inside a rank) across real processes under librankguard.so: one
 * program plays exporter or importer, each started by python-tests/test_ipc.py with its own
 * environment (CUDA_VISIBLE_DEVICES, RANK, RANKGUARD_*), so every pairing of GPUs and ranks
 * is a real two-process exchange on the fake driver.
 *
 *   ipc_peer export <kind> <dir>
 *       allocate on device 0, fill with a pattern, export; write the handle (hex) to
 *       <dir>/handle, serve VMM fds on <dir>/sock (SCM_RIGHTS); print "ready"; stay alive
 *       until stdin closes (a legacy handle needs its exporter alive).
 *   ipc_peer import <kind> <dir> <allow|deny> [times]
 *       import (<times> times, default once); allow: success and every byte the exporter wrote reads back; deny: the
 *       guard's CUDA_ERROR_NOT_PERMITTED / cudaErrorNotPermitted (800) and no mapping.
 *   ipc_peer many <n> <dir>
 *       export <n> small allocations by cuIpcGetMemHandle (a caching allocator exports one
 *       handle per segment), write the last handle to <dir>/handle, print "ready", stay
 *       alive until stdin closes.
 *   ipc_peer storm <index> <count> <gpus> <dir> <handles>
 *       one of <count> concurrent processes (CUDA_VISIBLE_DEVICES = index % gpus, all the
 *       same rank): export <handles> allocations, then import every other process's; a
 *       handle of the same GPU must open with its bytes intact, of another GPU must be
 *       denied. A lost or torn provenance record shows as a wrong decision.
 *
 * kinds: mem (cuIpcGetMemHandle/cuIpcOpenMemHandle), rtmem (cudaIpc*MemHandle), event
 * (cuIpc*EventHandle), rtevent (cudaIpc*EventHandle), vmm (cuMemCreate on the device,
 * POSIX fd), vmmhost (cuMemCreate on the host), pool (an exportable memory pool's fd, then
 * one of its allocations by cuMemPoolExportPointer data), dmabuf (cuMemAlloc memory exported
 * as a dma-buf fd by cuMemGetHandleForAddressRange, imported by cuImportExternalMemory),
 * rtdmabuf (the same, imported by cudaImportExternalMemory), extvmm (the vmm export,
 * imported by cuImportExternalMemory). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda_drvtest.h"

#define SIZE (1u << 20)
#define VMM_SIZE (2u << 20)
#define DENIED 800

static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)(i * 31 + seed * 7 + 5); }

static void hex(const void *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", ((const unsigned char *)p)[i]);
}

static int unhex(const char *s, void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        ((unsigned char *)p)[i] = (unsigned char)v;
    }
    return 0;
}

/* Write a file atomically (tmp + rename) so a reader never sees half of it. */
static void write_file(const char *dir, const char *name, const char *text)
{
    char tmp[512], path[512];
    snprintf(tmp, sizeof tmp, "%s/.%s.%d", dir, name, (int)getpid());
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(tmp, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) || rename(tmp, path)) {
        printf("FAIL cannot write %s: %s\n", path, strerror(errno));
        exit(2);
    }
}

static char *read_file(const char *dir, const char *name)
{
    static char buf[1 << 16];
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static void ctx0(void)
{
    CUcontext c;
    MUST(cuInit(0));
    MUST(cuDevicePrimaryCtxRetain(&c, 0));
    MUST(cuCtxSetCurrent(c));
}

static int check_bytes(const unsigned char *buf, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (buf[i] != pattern(i, seed))
            return 0;
    return 1;
}

/* ------------------------------------------------------------------ VMM fd passing */

static int listen_on(const char *dir)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/sock", dir);
    unlink(a.sun_path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 16)) {
        printf("FAIL listen %s: %s\n", a.sun_path, strerror(errno));
        exit(2);
    }
    return s;
}

static void send_fd(int conn, int fd)
{
    char cbuf[CMSG_SPACE(sizeof(int))] = {0};
    char byte = 'f';
    struct iovec iov = {&byte, 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    if (sendmsg(conn, &msg, 0) != 1)
        printf("FAIL sendmsg: %s\n", strerror(errno));
}

static int recv_fd(const char *dir)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/sock", dir);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a)) {
        printf("FAIL connect %s: %s\n", a.sun_path, strerror(errno));
        exit(2);
    }
    char cbuf[CMSG_SPACE(sizeof(int))];
    char byte;
    struct iovec iov = {&byte, 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    if (recvmsg(s, &msg, 0) != 1 || !CMSG_FIRSTHDR(&msg)) {
        printf("FAIL recvmsg\n");
        exit(2);
    }
    int fd;
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof fd);
    close(s);
    return fd;
}

static CUdeviceptr vmm_map(CUmemGenericAllocationHandle h)
{
    CUdeviceptr va;
    MUST(cuMemAddressReserve(&va, VMM_SIZE, 0, 0, 0));
    MUST(cuMemMap(va, VMM_SIZE, 0, h, 0));
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    MUST(cuMemSetAccess(va, VMM_SIZE, &acc, 1));
    return va;
}

/* ------------------------------------------------------------------ export */

static int do_export(const char *kind, const char *dir)
{
    static unsigned char buf[VMM_SIZE];
    char text[256] = {0};
    int vmm_fd = -1;
    ctx0();
    if (!strcmp(kind, "mem") || !strcmp(kind, "rtmem")) {
        for (size_t i = 0; i < SIZE; i++)
            buf[i] = pattern(i, 1);
        if (!strcmp(kind, "mem")) {
            CUdeviceptr d;
            CUipcMemHandle h;
            MUST(cuMemAlloc(&d, SIZE));
            MUST(cuMemcpyHtoD(d, buf, SIZE));
            MUST(cuIpcGetMemHandle(&h, d));
            hex(&h, sizeof h, text);
        } else {
            void *d;
            cudaIpcMemHandle_t h;
            EXPECT(cudaMalloc(&d, SIZE) == cudaSuccess, "cudaMalloc");
            EXPECT(cudaMemcpy(d, buf, SIZE, cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy H2D");
            EXPECT(cudaIpcGetMemHandle(&h, d) == cudaSuccess, "cudaIpcGetMemHandle");
            hex(&h, sizeof h, text);
        }
    } else if (!strcmp(kind, "event")) {
        CUevent e;
        CUipcEventHandle h;
        MUST(cuEventCreate(&e, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
        MUST(cuEventRecord(e, 0));
        MUST(cuIpcGetEventHandle(&h, e));
        hex(&h, sizeof h, text);
    } else if (!strcmp(kind, "rtevent")) {
        cudaEvent_t e;
        cudaIpcEventHandle_t h;
        EXPECT(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming) == cudaSuccess, "cudaEventCreateWithFlags");
        EXPECT(cudaEventRecord(e, 0) == cudaSuccess, "cudaEventRecord");
        EXPECT(cudaIpcGetEventHandle(&h, e) == cudaSuccess, "cudaIpcGetEventHandle");
        hex(&h, sizeof h, text);
    } else if (!strcmp(kind, "dmabuf") || !strcmp(kind, "rtdmabuf")) {
        CUdeviceptr d;
        MUST(cuMemAlloc(&d, SIZE));
        for (size_t i = 0; i < SIZE; i++)
            buf[i] = pattern(i, 4);
        MUST(cuMemcpyHtoD(d, buf, SIZE));
        MUST(cuMemGetHandleForAddressRange(&vmm_fd, d, SIZE, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
        struct stat st;
        fstat(vmm_fd, &st);
        snprintf(text, sizeof text, "%llx.%llx", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    } else if (!strcmp(kind, "vmm") || !strcmp(kind, "vmmhost") || !strcmp(kind, "extvmm")) {
        CUmemAllocationProp prop = {0};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location.type = strcmp(kind, "vmmhost") ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
        prop.location.id = 0;
        CUmemGenericAllocationHandle h;
        MUST(cuMemCreate(&h, VMM_SIZE, &prop, 0));
        CUdeviceptr va = vmm_map(h);
        for (size_t i = 0; i < VMM_SIZE; i++)
            buf[i] = pattern(i, 2);
        MUST(cuMemcpyHtoD(va, buf, VMM_SIZE));
        MUST(cuMemExportToShareableHandle(&vmm_fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        struct stat st;
        fstat(vmm_fd, &st);
        snprintf(text, sizeof text, "%llx.%llx", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    } else if (!strcmp(kind, "pool")) {
        CUmemPoolProps pp = {0};
        pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        pp.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        pp.location.id = 0;
        CUmemoryPool pool;
        CUdeviceptr d;
        CUmemPoolPtrExportData data;
        MUST(cuMemPoolCreate(&pool, &pp));
        MUST(cuMemAllocFromPoolAsync(&d, SIZE, pool, 0));
        for (size_t i = 0; i < SIZE; i++)
            buf[i] = pattern(i, 3);
        MUST(cuMemcpyHtoD(d, buf, SIZE));
        MUST(cuMemPoolExportToShareableHandle(&vmm_fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        MUST(cuMemPoolExportPointer(&data, d));
        hex(&data, sizeof data, text);
    } else {
        printf("FAIL unknown kind %s\n", kind);
        return 2;
    }
    int ls = vmm_fd >= 0 ? listen_on(dir) : -1;
    strcat(text, "\n");
    write_file(dir, "handle", text);
    printf("ready\n");
    fflush(stdout);
    /* Serve fds until stdin closes. */
    for (;;) {
        struct pollfd p[2] = {{0, POLLIN, 0}, {ls, POLLIN, 0}};
        if (poll(p, ls >= 0 ? 2 : 1, -1) < 0 && errno != EINTR)
            break;
        if (p[0].revents) {
            char c;
            if (read(0, &c, 1) <= 0)
                break;
        }
        if (ls >= 0 && p[1].revents) {
            int conn = accept(ls, NULL, NULL);
            if (conn >= 0) {
                send_fd(conn, vmm_fd);
                close(conn);
            }
        }
    }
    return drvtest_done();
}

/* ------------------------------------------------------------------ import */

static int do_import(const char *kind, const char *dir, const char *expect)
{
    static unsigned char buf[VMM_SIZE];
    int allow = !strcmp(expect, "allow");
    char *text = read_file(dir, "handle");
    if (!text) {
        printf("FAIL no handle in %s\n", dir);
        return 2;
    }
    ctx0();
    if (!strcmp(kind, "mem")) {
        CUipcMemHandle h;
        unhex(text, &h, sizeof h);
        CUdeviceptr d = 0;
        CUresult r = cuIpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        printf("import-rc %d\n", (int)r);
        if (allow) {
            EXPECT(r == CUDA_SUCCESS, "cuIpcOpenMemHandle allowed (rc %d)", (int)r);
            if (r == CUDA_SUCCESS) {
                MUST(cuMemcpyDtoH(buf, d, SIZE));
                EXPECT(check_bytes(buf, SIZE, 1), "the importer reads every one of the exporter's %u bytes", SIZE);
                EXPECT_RC(cuIpcCloseMemHandle(d), CUDA_SUCCESS);
            }
        } else {
            EXPECT(r == DENIED && d == 0, "cuIpcOpenMemHandle denied with 800, no mapping (rc %d)", (int)r);
        }
    } else if (!strcmp(kind, "rtmem")) {
        cudaIpcMemHandle_t h;
        unhex(text, &h, sizeof h);
        void *d = NULL;
        cudaError_t r = cudaIpcOpenMemHandle(&d, h, cudaIpcMemLazyEnablePeerAccess);
        printf("import-rc %d\n", (int)r);
        if (allow) {
            EXPECT(r == cudaSuccess, "cudaIpcOpenMemHandle allowed (rc %d)", (int)r);
            if (r == cudaSuccess) {
                EXPECT(cudaMemcpy(buf, d, SIZE, cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy D2H");
                EXPECT(check_bytes(buf, SIZE, 1), "the importer reads every one of the exporter's %u bytes", SIZE);
                EXPECT(cudaIpcCloseMemHandle(d) == cudaSuccess, "cudaIpcCloseMemHandle");
            }
        } else {
            EXPECT(r == DENIED && d == NULL, "cudaIpcOpenMemHandle denied with 800, no mapping (rc %d)", (int)r);
        }
    } else if (!strcmp(kind, "event")) {
        CUipcEventHandle h;
        unhex(text, &h, sizeof h);
        CUevent e = NULL;
        CUresult r = cuIpcOpenEventHandle(&e, h);
        printf("import-rc %d\n", (int)r);
        if (allow) {
            EXPECT(r == CUDA_SUCCESS, "cuIpcOpenEventHandle allowed (rc %d)", (int)r);
            if (r == CUDA_SUCCESS)
                EXPECT_RC(cuEventSynchronize(e), CUDA_SUCCESS);
        } else {
            EXPECT(r == DENIED && e == NULL, "cuIpcOpenEventHandle denied with 800 (rc %d)", (int)r);
        }
    } else if (!strcmp(kind, "rtevent")) {
        cudaIpcEventHandle_t h;
        unhex(text, &h, sizeof h);
        cudaEvent_t e = NULL;
        cudaError_t r = cudaIpcOpenEventHandle(&e, h);
        printf("import-rc %d\n", (int)r);
        if (allow) {
            EXPECT(r == cudaSuccess, "cudaIpcOpenEventHandle allowed (rc %d)", (int)r);
            if (r == cudaSuccess)
                EXPECT(cudaEventSynchronize(e) == cudaSuccess, "cudaEventSynchronize");
        } else {
            EXPECT(r == DENIED && e == NULL, "cudaIpcOpenEventHandle denied with 800 (rc %d)", (int)r);
        }
    } else if (!strcmp(kind, "vmm") || !strcmp(kind, "vmmhost")) {
        int fd = recv_fd(dir);
        struct stat st;
        fstat(fd, &st);
        char ident[64];
        snprintf(ident, sizeof ident, "%llx.%llx\n", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
        EXPECT(!strcmp(ident, text), "the received fd is the exported file (%s)", strtok(ident, "\n"));
        CUmemGenericAllocationHandle h = 0;
        CUresult r = cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(fd);
        printf("import-rc %d\n", (int)r);
        if (allow) {
            EXPECT(r == CUDA_SUCCESS, "cuMemImportFromShareableHandle allowed (rc %d)", (int)r);
            if (r == CUDA_SUCCESS) {
                CUdeviceptr va = vmm_map(h);
                MUST(cuMemcpyDtoH(buf, va, VMM_SIZE));
                EXPECT(check_bytes(buf, VMM_SIZE, 2), "the importer reads every one of the exporter's %u bytes", VMM_SIZE);
                MUST(cuMemUnmap(va, VMM_SIZE));
                MUST(cuMemAddressFree(va, VMM_SIZE));
                EXPECT_RC(cuMemRelease(h), CUDA_SUCCESS);
            }
        } else {
            EXPECT(r == DENIED && h == 0, "cuMemImportFromShareableHandle denied with 800, handle released (rc %d)", (int)r);
        }
    } else if (!strcmp(kind, "dmabuf") || !strcmp(kind, "rtdmabuf") || !strcmp(kind, "extvmm")) {
        int vmm = !strcmp(kind, "extvmm");
        size_t size = vmm ? VMM_SIZE : SIZE;
        int fd = recv_fd(dir);
        struct stat st;
        fstat(fd, &st);
        char ident[64];
        snprintf(ident, sizeof ident, "%llx.%llx\n", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
        EXPECT(!strcmp(ident, text), "the received fd is the exported file (%s)", strtok(ident, "\n"));
        int r;
        void *ext = NULL;
        if (!strcmp(kind, "rtdmabuf")) {
            struct cudaExternalMemoryHandleDesc d = {0};
            d.type = cudaExternalMemoryHandleTypeOpaqueFd;
            d.handle.fd = fd;
            d.size = size;
            r = cudaImportExternalMemory((cudaExternalMemory_t *)&ext, &d);
        } else {
            CUDA_EXTERNAL_MEMORY_HANDLE_DESC d = {0};
            d.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
            d.handle.fd = fd;
            d.size = size;
            r = cuImportExternalMemory((CUexternalMemory *)&ext, &d);
        }
        printf("import-rc %d\n", r);
        if (r != 0)
            close(fd);                /* on success the fd belongs to the driver (cuda.h) */
        if (allow) {
            EXPECT(r == 0, "%s import allowed (rc %d)", kind, r);
            if (r == 0) {
                CUDA_EXTERNAL_MEMORY_BUFFER_DESC b = {0};
                b.size = size;
                CUdeviceptr p;
                MUST(cuExternalMemoryGetMappedBuffer(&p, (CUexternalMemory)ext, &b));
                MUST(cuMemcpyDtoH(buf, p, size));
                EXPECT(check_bytes(buf, size, vmm ? 2 : 4), "the importer reads every one of the exporter's %zu bytes", size);
                EXPECT_RC(cuMemFree(p), CUDA_SUCCESS);
                EXPECT_RC(cuDestroyExternalMemory((CUexternalMemory)ext), CUDA_SUCCESS);
            }
        } else {
            EXPECT(r == DENIED && ext == NULL, "%s import denied with 800 (rc %d)", kind, r);
        }
    } else if (!strcmp(kind, "pool")) {
        CUmemPoolPtrExportData data;
        unhex(text, &data, sizeof data);
        int fd = recv_fd(dir);
        CUmemoryPool pool = NULL;
        CUresult r = cuMemPoolImportFromShareableHandle(&pool, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        close(fd);
        printf("import-rc %d\n", (int)r);
        if (allow) {
            EXPECT(r == CUDA_SUCCESS, "cuMemPoolImportFromShareableHandle allowed (rc %d)", (int)r);
            CUdeviceptr p = 0;
            CUresult r2 = r ? r : cuMemPoolImportPointer(&p, pool, &data);
            EXPECT(r2 == CUDA_SUCCESS, "cuMemPoolImportPointer allowed (rc %d)", (int)r2);
            if (r2 == CUDA_SUCCESS) {
                MUST(cuMemcpyDtoH(buf, p, SIZE));
                EXPECT(check_bytes(buf, SIZE, 3), "the importer reads every one of the exporter's %u bytes", SIZE);
                /* cuda.h allows cuMemFree too; the fake accepts only the async form. */
                EXPECT_RC(cuMemFreeAsync(p, 0), CUDA_SUCCESS);
                EXPECT_RC(cuStreamSynchronize(0), CUDA_SUCCESS);
            }
        } else {
            EXPECT(r == DENIED && pool == NULL, "cuMemPoolImportFromShareableHandle denied with 800 (rc %d)", (int)r);
        }
    } else {
        printf("FAIL unknown kind %s\n", kind);
        return 2;
    }
    return drvtest_done();
}

/* ------------------------------------------------------------------ storm */

static int wait_for(const char *dir, const char *prefix, int count)
{
    char name[512];
    for (int tries = 0; tries < 6000; tries++) {
        int have = 0;
        for (int j = 0; j < count; j++) {
            snprintf(name, sizeof name, "%s/%s.%d", dir, prefix, j);
            have += access(name, F_OK) == 0;
        }
        if (have == count)
            return 0;
        usleep(10000);
    }
    printf("FAIL timed out waiting for %s.* in %s\n", prefix, dir);
    return -1;
}

static int do_storm(int me, int count, int gpus, const char *dir, int handles)
{
    static unsigned char buf[SIZE / 16];
    const size_t n = sizeof buf;
    ctx0();
    char *text = malloc((size_t)handles * 130 + 1), *t = text;
    for (int k = 0; k < handles; k++) {
        CUdeviceptr d;
        CUipcMemHandle h;
        for (size_t i = 0; i < n; i++)
            buf[i] = pattern(i, (unsigned)(me * 64 + k));
        MUST(cuMemAlloc(&d, n));
        MUST(cuMemcpyHtoD(d, buf, n));
        MUST(cuIpcGetMemHandle(&h, d));
        hex(&h, sizeof h, t);
        t += 128;
        *t++ = '\n';
    }
    *t = 0;
    char name[64];
    snprintf(name, sizeof name, "h.%d", me);
    write_file(dir, name, text);
    if (wait_for(dir, "h", count))
        return 2;
    int allowed = 0, denied = 0;
    for (int j = 0; j < count; j++) {
        if (j == me)
            continue;
        snprintf(name, sizeof name, "h.%d", j);
        char *peer = strdup(read_file(dir, name));
        int same = (j % gpus) == (me % gpus);
        for (int k = 0; k < handles; k++) {
            CUipcMemHandle h;
            if (strlen(peer) < (size_t)(k + 1) * 129 || unhex(peer + k * 129, &h, sizeof h)) {
                EXPECT(0, "handle %d of process %d is readable", k, j);
                continue;
            }
            CUdeviceptr d = 0;
            CUresult r = cuIpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
            if (same) {
                if (r != CUDA_SUCCESS) {
                    EXPECT(0, "process %d handle %d (same GPU) opens: rc %d", j, k, (int)r);
                    continue;
                }
                MUST(cuMemcpyDtoH(buf, d, n));
                if (!check_bytes(buf, n, (unsigned)(j * 64 + k)))
                    EXPECT(0, "process %d handle %d reads back intact", j, k);
                MUST(cuIpcCloseMemHandle(d));
                allowed++;
            } else {
                if (r != DENIED || d != 0) {
                    EXPECT(0, "process %d handle %d (other GPU) is denied: rc %d", j, k, (int)r);
                    continue;
                }
                denied++;
            }
        }
        free(peer);
    }
    EXPECT(1, "storm %d: %d imports allowed with intact bytes, %d denied", me, allowed, denied);
    snprintf(name, sizeof name, "done.%d", me);
    write_file(dir, name, "done\n");
    /* Exporters stay alive until every importer is done with their handles. */
    if (wait_for(dir, "done", count))
        return 2;
    free(text);
    return drvtest_done();
}

static int do_many(int count, const char *dir)
{
    char text[256] = {0};
    ctx0();
    for (int k = 0; k < count; k++) {
        CUdeviceptr d;
        CUipcMemHandle h;
        MUST(cuMemAlloc(&d, 256));
        MUST(cuIpcGetMemHandle(&h, d));
        if (k == count - 1)
            hex(&h, sizeof h, text);
    }
    strcat(text, "\n");
    write_file(dir, "handle", text);
    printf("ready\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0)
        ;
    return drvtest_done();
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && !strcmp(argv[1], "export"))
        return do_export(argv[2], argv[3]);
    if ((argc == 5 || argc == 6) && !strcmp(argv[1], "import")) {
        /* An optional repeat count: the same import several times in one process (the
         * guard says each registry problem once per process). */
        int times = argc == 6 ? atoi(argv[5]) : 1, rc = 0;
        for (int i = 0; i < times; i++)
            rc = do_import(argv[2], argv[3], argv[4]);
        return rc;
    }
    if (argc == 4 && !strcmp(argv[1], "many"))
        return do_many(atoi(argv[2]), argv[3]);
    if (argc == 7 && !strcmp(argv[1], "storm"))
        return do_storm(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), argv[5], atoi(argv[6]));
    fprintf(stderr,
            "usage: ipc_peer export <kind> <dir> | import <kind> <dir> <allow|deny> [times] |\n"
            "       many <n> <dir> |\n"
            "       storm <index> <count> <gpus> <dir> <handles>\n"
            "kinds: mem rtmem event rtevent vmm vmmhost pool dmabuf rtdmabuf extvmm\n");
    return 2;
}
