/* fakecuda-smi: the fake node's nvidia-smi, and the writer of its topology files.
 *
 * Why it exists: rankguard's launcher learns the node the way it would on a real one
 * (`nvidia-smi -L`, /proc/driver/nvidia/gpus/<bus>/information, sysfs NUMA files), and its
 * tests need those views of the fake node, consistent with what the fake driver
 * enumerates. Everything about a GPU (name, UUID, PCI bus id, NUMA node) comes from the
 * fake driver's public API (cuda.h), loaded with dlopen("libcuda.so.1") like any client.
 *
 * Like nvidia-smi (which goes through NVML), it ignores CUDA_VISIBLE_DEVICES and lists
 * physical GPUs in PCI bus order: it unsets CUDA_VISIBLE_DEVICES and sets
 * CUDA_DEVICE_ORDER=PCI_BUS_ID before cuInit. Decisions where nothing real applies:
 *   S-mig    a GPU in MIG mode enumerates through CUDA as its MIG instance 0 (driver
 *            decision D-migenum), and CUDA shows at most one MIG device per process, so
 *            fakecuda-smi reads FAKECUDA_MIG (the node's MIG layout; same syntax and rules
 *            as the driver) and unsets it before cuInit to see the whole GPUs; then it asks
 *            the driver about each MIG device in a child process of its own
 *            (`--probe-mig-device`, CUDA_VISIBLE_DEVICES=MIG-GPU-<gpu uuid>/<j>/0): the
 *            UUID is the driver's cuDeviceGetUuid_v2, the profile the part of the device
 *            name after " MIG " (the driver names MIG devices "<GPU name> MIG <profile>").
 *   S-numa   a GPU's NUMA node is the driver's CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID; CPUs of
 *            the node (FAKECUDA_CPUS, default this machine's online CPUs) are split into
 *            FAKECUDA_NUMA_NODES contiguous blocks, equal as possible, earlier blocks one
 *            larger; more NUMA nodes than CPUs is an error.
 *   S-info   `information` values the fake has no source for are fixed: IRQ 0, Video BIOS
 *            96.00.99.00.01, Bus Type PCIe, DMA Size 47 bits, DMA Mask 0x7fffffffffff,
 *            Device Minor = the GPU's PCI-order index (layout: open-gpu-kernel-modules
 *            kernel-open/nvidia/nv-procfs.c).
 * Exit status: 0 success, 1 the driver or the file system failed, 2 bad usage/input.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_GPUS 64
#define MAX_MIG 7
#define MAX_CPUS 8192
#define MAX_NUMA 64

static const char *prog = "fakecuda-smi";

static void usage(FILE *f)
{
    fprintf(f,
        "usage: %s -L | --sysroot DIR | --json | --help\n"
        "  -L, --list-gpus   list the node's GPUs (and MIG devices) like `nvidia-smi -L`\n"
        "  --sysroot DIR     write the topology files a launcher reads under DIR:\n"
        "                      DIR/proc/driver/nvidia/gpus/<bus id>/information\n"
        "                      DIR/sys/bus/pci/devices/<bus id>/{numa_node,local_cpulist}\n"
        "                      DIR/sys/devices/system/node/{online,node<N>/cpulist}\n"
        "  --json            print the GPUs as one JSON object\n"
        "Environment: FAKECUDA_GPUS, FAKECUDA_MIG, FAKECUDA_NUMA_NODES, FAKECUDA_TOPOLOGY\n"
        "(read by the fake driver) and FAKECUDA_CPUS (cpulist of the node's CPUs, default\n"
        "this machine's online CPUs). CUDA_VISIBLE_DEVICES is ignored, as by nvidia-smi.\n",
        prog);
}

__attribute__((format(printf, 2, 3)))
static int fail(int status, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return status;
}

/* ---- the driver --------------------------------------------------------------- */

static struct {
    CUresult (*init)(unsigned int);
    CUresult (*deviceGetCount)(int *);
    CUresult (*deviceGet)(CUdevice *, int);
    CUresult (*deviceGetName)(char *, int, CUdevice);
    CUresult (*deviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*deviceGetPCIBusId)(char *, int, CUdevice);
    CUresult (*deviceTotalMem)(size_t *, CUdevice);
    CUresult (*deviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*getErrorName)(CUresult, const char **);
} drv;

struct mig {
    char profile[64];
    char uuid[64];
};

struct gpu {
    char name[256];
    char uuid[64];
    char bus[32];          /* lowercase, as the kernel spells it in paths */
    size_t total_mem;
    int numa;
    int mig_count;
    struct mig mig[MAX_MIG];
};

static struct gpu gpus[MAX_GPUS];
static int n_gpus;

static const char *cu_name(CUresult r)
{
    const char *s = NULL;
    if (drv.getErrorName && drv.getErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "unknown CUresult";
}

static int load_sym(void *h, void *dst, const char *name)
{
    void *p = dlsym(h, name);
    memcpy(dst, &p, sizeof p);
    return p != NULL;
}

static void format_uuid(const char *prefix, const unsigned char *b, char *out, size_t len)
{
    snprintf(out, len,
             "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             prefix, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
             b[12], b[13], b[14], b[15]);
}

/* FAKECUDA_MIG=G:N[;G:N...] with the driver's rules (0 <= G < GPUs, 1 <= N <= 7, each GPU
 * once). `spec` was saved before FAKECUDA_MIG was unset (S-mig). */
static int parse_mig(const char *spec)
{
    char buf[512];
    if (strlen(spec) >= sizeof buf)
        goto bad;
    strcpy(buf, spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
        char *end1, *end2;
        errno = 0;
        long g = strtol(tok, &end1, 10);
        if (end1 == tok || *end1 != ':' || errno)
            goto bad;
        long n = strtol(end1 + 1, &end2, 10);
        if (end2 == end1 + 1 || *end2 || errno || g < 0 || g >= n_gpus || n < 1 || n > MAX_MIG)
            goto bad;
        if (gpus[g].mig_count)
            goto bad;
        gpus[g].mig_count = (int)n;
    }
    return 0;
bad:
    fprintf(stderr, "%s: FAKECUDA_MIG=\"%s\" is invalid: expected G:N[;G:N...] with "
            "0 <= G < %d (FAKECUDA_GPUS), 1 <= N <= %d and each GPU once, e.g. "
            "FAKECUDA_MIG=\"1:2;3:7\"\n", prog, spec, n_gpus, MAX_MIG);
    return -1;
}

static int numa_nodes_from_env(int *out)
{
    const char *s = getenv("FAKECUDA_NUMA_NODES");
    *out = 2;
    if (!s)
        return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > MAX_NUMA) {
        fprintf(stderr, "%s: FAKECUDA_NUMA_NODES=\"%s\" is invalid: expected an integer from "
                "1 to %d (default 2)\n", prog, s, MAX_NUMA);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* dlopen the driver and find the functions fakecuda-smi uses. 0, or an exit status. */
static int load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return fail(1, "cannot load the CUDA driver libcuda.so.1: %s; build the fake platform "
                    "(make -C c-tests) and put c-tests/build/fakecuda on LD_LIBRARY_PATH",
                    dlerror());
    int ok = load_sym(h, &drv.init, "cuInit") &&
             load_sym(h, &drv.deviceGetCount, "cuDeviceGetCount") &&
             load_sym(h, &drv.deviceGet, "cuDeviceGet") &&
             load_sym(h, &drv.deviceGetName, "cuDeviceGetName") &&
             load_sym(h, &drv.deviceGetPCIBusId, "cuDeviceGetPCIBusId") &&
             load_sym(h, &drv.deviceTotalMem, "cuDeviceTotalMem_v2") &&
             load_sym(h, &drv.deviceGetAttribute, "cuDeviceGetAttribute");
    if (!load_sym(h, &drv.deviceGetUuid, "cuDeviceGetUuid_v2"))
        ok = ok && load_sym(h, &drv.deviceGetUuid, "cuDeviceGetUuid");
    load_sym(h, &drv.getErrorName, "cuGetErrorName");
    if (!ok)
        return fail(1, "libcuda.so.1 lacks a function fakecuda-smi needs: %s", dlerror());
    return 0;

}

/* S-mig: `fakecuda-smi --probe-mig-device` runs in a child whose CUDA_VISIBLE_DEVICES names
 * one MIG device; it prints "<uuid>\t<name>" of the one device the driver enumerates. */
static int probe_mig_device(void)
{
    int rc = load_driver();
    if (rc)
        return rc;
    CUresult r = drv.init(0);
    int count = 0;
    if (r == CUDA_SUCCESS)
        r = drv.deviceGetCount(&count);
    if (r != CUDA_SUCCESS || count != 1)
        return fail(1, "MIG probe: the driver enumerates %d devices for CUDA_VISIBLE_DEVICES=%s "
                    "(%s), want 1", count, getenv("CUDA_VISIBLE_DEVICES"), cu_name(r));
    CUdevice d;
    CUuuid u;
    char name[256], uuid[64];
    if ((r = drv.deviceGet(&d, 0)) != CUDA_SUCCESS ||
        (r = drv.deviceGetName(name, sizeof name, d)) != CUDA_SUCCESS ||
        (r = drv.deviceGetUuid(&u, d)) != CUDA_SUCCESS)
        return fail(1, "MIG probe: querying the device failed: %s (%d)", cu_name(r), (int)r);
    format_uuid("MIG-", (const unsigned char *)u.bytes, uuid, sizeof uuid);
    printf("%s\t%s\n", uuid, name);
    return 0;
}

/* Ask a child (probe_mig_device) about MIG device j of GPU g. 0, or an exit status. */
static int query_mig(int g, int j, const char *mig_spec)
{
    struct gpu *gpu = &gpus[g];
    char cvd[128];
    snprintf(cvd, sizeof cvd, "MIG-GPU-%s/%d/0", gpu->uuid + 4, j);
    int fds[2];
    if (pipe(fds))
        return fail(1, "pipe: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return fail(1, "fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        setenv("CUDA_VISIBLE_DEVICES", cvd, 1);
        setenv("FAKECUDA_MIG", mig_spec, 1);
        execl("/proc/self/exe", prog, "--probe-mig-device", (char *)NULL);
        fprintf(stderr, "%s: cannot re-run itself: %s\n", prog, strerror(errno));
        _exit(1);
    }
    close(fds[1]);
    char out[512];
    size_t used = 0;
    ssize_t k;
    while (used < sizeof out - 1 && (k = read(fds[0], out + used, sizeof out - 1 - used)) > 0)
        used += (size_t)k;
    out[used] = 0;
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return fail(1, "could not query MIG device %d of GPU %d (CUDA_VISIBLE_DEVICES=%s)",
                    j, g, cvd);
    char *tab = strchr(out, '\t'), *nl = strchr(out, '\n');
    const char *marker = tab ? strstr(tab, " MIG ") : NULL;
    if (!tab || !nl || !marker || nl < tab)
        return fail(1, "unexpected MIG probe answer for %s: \"%s\"", cvd, out);
    *tab = 0;
    *nl = 0;
    snprintf(gpu->mig[j].uuid, sizeof gpu->mig[j].uuid, "%.63s", out);
    snprintf(gpu->mig[j].profile, sizeof gpu->mig[j].profile, "%.63s", marker + 5);
    return 0;
}

/* Load the driver and read every GPU. Returns 0, or an exit status. */
static int read_node(int numa_nodes)
{
    const char *mig_env = getenv("FAKECUDA_MIG");
    char mig_spec[512] = "";
    if (mig_env) {
        if (strlen(mig_env) >= sizeof mig_spec)
            return fail(2, "FAKECUDA_MIG is too long (%zu bytes)", strlen(mig_env));
        strcpy(mig_spec, mig_env);
    }
    /* nvidia-smi ignores CUDA_VISIBLE_DEVICES and lists GPUs in PCI bus order; S-mig. */
    unsetenv("CUDA_VISIBLE_DEVICES");
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
    unsetenv("FAKECUDA_MIG");

    int rc = load_driver();
    if (rc)
        return rc;

    CUresult r = drv.init(0);
    if (r == CUDA_ERROR_NO_DEVICE) {
        n_gpus = 0;
        return 0;
    }
    if (r != CUDA_SUCCESS)
        return fail(1, "cuInit failed: %s (%d)", cu_name(r), (int)r);
    int count = 0;
    if ((r = drv.deviceGetCount(&count)) != CUDA_SUCCESS)
        return fail(1, "cuDeviceGetCount failed: %s (%d)", cu_name(r), (int)r);
    if (count > MAX_GPUS)
        return fail(1, "the driver reports %d GPUs; fakecuda-smi handles at most %d",
                    count, MAX_GPUS);
    n_gpus = count;
    int warned = 0;
    for (int i = 0; i < count; i++) {
        struct gpu *g = &gpus[i];
        CUdevice d;
        CUuuid u;
        if ((r = drv.deviceGet(&d, i)) != CUDA_SUCCESS ||
            (r = drv.deviceGetName(g->name, sizeof g->name, d)) != CUDA_SUCCESS ||
            (r = drv.deviceGetUuid(&u, d)) != CUDA_SUCCESS ||
            (r = drv.deviceGetPCIBusId(g->bus, sizeof g->bus, d)) != CUDA_SUCCESS ||
            (r = drv.deviceTotalMem(&g->total_mem, d)) != CUDA_SUCCESS)
            return fail(1, "querying GPU %d failed: %s (%d)", i, cu_name(r), (int)r);
        format_uuid("GPU-", (const unsigned char *)u.bytes, g->uuid, sizeof g->uuid);
        for (char *p = g->bus; *p; p++)
            if (*p >= 'A' && *p <= 'F')
                *p = (char)(*p - 'A' + 'a');
        r = drv.deviceGetAttribute(&g->numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, d);
        if (r != CUDA_SUCCESS) {
            /* S-numa fallback: the node's default placement (cvd-vectors.tsv header). */
            g->numa = i * numa_nodes / count;
            if (!warned++)
                fprintf(stderr, "%s: note: the driver does not answer "
                        "CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID (%s); using NUMA node i*K/N\n",
                        prog, cu_name(r));
        }
        if (g->numa < 0 || g->numa >= numa_nodes)
            return fail(1, "GPU %d is on NUMA node %d, outside FAKECUDA_NUMA_NODES=%d",
                        i, g->numa, numa_nodes);
    }
    if (mig_env && parse_mig(mig_spec))
        return 2;
    for (int g = 0; g < n_gpus; g++)
        for (int j = 0; j < gpus[g].mig_count; j++)
            if ((rc = query_mig(g, j, mig_spec)))
                return rc;
    return 0;
}

/* ---- -L and --json ------------------------------------------------------------- */

static int list_gpus(void)
{
    for (int i = 0; i < n_gpus; i++) {
        const struct gpu *g = &gpus[i];
        printf("GPU %d: %s (UUID: %s)\n", i, g->name, g->uuid);
        for (int j = 0; j < g->mig_count; j++)
            printf("  MIG %-11s Device %2d: (UUID: %s)\n", g->mig[j].profile, j, g->mig[j].uuid);
    }
    if (n_gpus == 0)
        printf("No devices found.\n");
    return 0;
}

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static int print_json(void)
{
    printf("{\"gpus\": [");
    for (int i = 0; i < n_gpus; i++) {
        const struct gpu *g = &gpus[i];
        printf("%s{\"index\": %d, \"name\": ", i ? ", " : "", i);
        json_string(g->name);
        printf(", \"uuid\": \"%s\", \"pci_bus_id\": \"%s\", \"numa_node\": %d, "
               "\"memory_bytes\": %zu, \"mig\": [", g->uuid, g->bus, g->numa, g->total_mem);
        for (int j = 0; j < g->mig_count; j++) {
            printf("%s{\"index\": %d, \"profile\": ", j ? ", " : "", j);
            json_string(g->mig[j].profile);
            printf(", \"uuid\": \"%s\"}", g->mig[j].uuid);
        }
        printf("]}");
    }
    printf("]}\n");
    return 0;
}

/* ---- --sysroot ------------------------------------------------------------------ */

/* Parse a Linux cpulist ("0-3,8,10-11", whitespace around it allowed) into a bitmap.
 * Returns the number of CPUs, or -1 with `why` set. */
static int parse_cpulist(const char *s, unsigned char *set, const char **why)
{
    memset(set, 0, MAX_CPUS);
    const char *p = s;
    int n = 0;
    while (*p == ' ' || *p == '\t' || *p == '\n')
        p++;
    if (!*p) {
        *why = "it is empty";
        return -1;
    }
    for (;;) {
        char *end;
        if (*p < '0' || *p > '9') {
            *why = "expected a CPU number";
            return -1;
        }
        long a = strtol(p, &end, 10), b = a;
        p = end;
        if (*p == '-') {
            p++;
            if (*p < '0' || *p > '9') {
                *why = "expected a CPU number after '-'";
                return -1;
            }
            b = strtol(p, &end, 10);
            p = end;
        }
        if (a > b) {
            *why = "a range runs backwards";
            return -1;
        }
        if (b >= MAX_CPUS) {
            *why = "a CPU number is too large";
            return -1;
        }
        for (long c = a; c <= b; c++)
            if (!set[c]) {
                set[c] = 1;
                n++;
            }
        while (*p == ' ' || *p == '\t' || *p == '\n')
            p++;
        if (!*p)
            return n;
        if (*p != ',') {
            *why = "expected ',' between items";
            return -1;
        }
        p++;
    }
}

/* Write cpus[from, to) as a compact cpulist ("0-3,8"). */
static void format_cpulist(const int *cpus, int from, int to, char *out, size_t len)
{
    size_t used = 0;
    out[0] = 0;
    for (int i = from; i < to;) {
        int j = i;
        while (j + 1 < to && cpus[j + 1] == cpus[j] + 1)
            j++;
        int w = (j > i) ? snprintf(out + used, len - used, "%s%d-%d", used ? "," : "",
                                   cpus[i], cpus[j])
                        : snprintf(out + used, len - used, "%s%d", used ? "," : "", cpus[i]);
        if (w < 0 || (size_t)w >= len - used)
            return;
        used += (size_t)w;
        i = j + 1;
    }
}

static int mkdirs(const char *path)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST)
        return -1;
    struct stat st;
    if (stat(buf, &st) || !S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

__attribute__((format(printf, 3, 4)))
static int write_file(const char *dir, const char *name, const char *fmt, ...)
{
    char path[PATH_MAX];
    if (mkdirs(dir))
        return fail(1, "cannot create directory %s: %s", dir, strerror(errno));
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        return fail(1, "cannot write %s: %s", path, strerror(errno));
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    if (fclose(f))
        return fail(1, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

static int write_sysroot(const char *root, int numa_nodes)
{
    static unsigned char set[MAX_CPUS];
    static int cpus[MAX_CPUS];
    char online_buf[4096];
    const char *spec = getenv("FAKECUDA_CPUS"), *source = "FAKECUDA_CPUS", *why = NULL;
    if (!spec) {
        source = "/sys/devices/system/cpu/online";
        FILE *f = fopen(source, "r");
        if (!f || !fgets(online_buf, sizeof online_buf, f)) {
            if (f)
                fclose(f);
            return fail(1, "cannot read %s; set FAKECUDA_CPUS to the node's cpulist, "
                        "e.g. FAKECUDA_CPUS=0-15", source);
        }
        fclose(f);
        spec = online_buf;
    }
    int n = parse_cpulist(spec, set, &why);
    if (n < 0)
        return fail(2, "%s=\"%s\" is not a cpulist: %s; expected e.g. 0-15 or 0-7,16-23",
                    source, spec, why);
    if (n < numa_nodes)
        return fail(2, "%s names %d CPUs but FAKECUDA_NUMA_NODES=%d: every NUMA node needs "
                    "at least one CPU; name more CPUs or fewer NUMA nodes",
                    source, n, numa_nodes);
    int k = 0;
    for (int c = 0; c < MAX_CPUS; c++)
        if (set[c])
            cpus[k++] = c;

    /* S-numa: contiguous blocks, the first n % K one CPU larger. */
    static char node_list[MAX_NUMA][16384];
    int base = n / numa_nodes, extra = n % numa_nodes, from = 0;
    for (int node = 0; node < numa_nodes; node++) {
        int size = base + (node < extra ? 1 : 0);
        format_cpulist(cpus, from, from + size, node_list[node], sizeof node_list[node]);
        from += size;
    }

    char dir[PATH_MAX];
    int rc;
    for (int node = 0; node < numa_nodes; node++) {
        snprintf(dir, sizeof dir, "%s/sys/devices/system/node/node%d", root, node);
        if ((rc = write_file(dir, "cpulist", "%s\n", node_list[node])))
            return rc;
    }
    snprintf(dir, sizeof dir, "%s/sys/devices/system/node", root);
    if (numa_nodes == 1)
        rc = write_file(dir, "online", "0\n");
    else
        rc = write_file(dir, "online", "0-%d\n", numa_nodes - 1);
    if (rc)
        return rc;

    for (int i = 0; i < n_gpus; i++) {
        const struct gpu *g = &gpus[i];
        snprintf(dir, sizeof dir, "%s/proc/driver/nvidia/gpus/%s", root, g->bus);
        if ((rc = write_file(dir, "information",
                             "Model: \t\t %s\n"
                             "IRQ:   \t\t %d\n"
                             "GPU UUID: \t %s\n"
                             "Video BIOS: \t %s\n"
                             "Bus Type: \t %s\n"
                             "DMA Size: \t %d bits\n"
                             "DMA Mask: \t 0x%llx\n"
                             "Bus Location: \t %s\n"
                             "Device Minor: \t %u\n"
                             "GPU Excluded:\t %s\n",
                             g->name, 0, g->uuid, "96.00.99.00.01", "PCIe", 47,
                             (1ull << 47) - 1, g->bus, (unsigned)i, "No")))
            return rc;
        snprintf(dir, sizeof dir, "%s/sys/bus/pci/devices/%s", root, g->bus);
        if ((rc = write_file(dir, "numa_node", "%d\n", g->numa)) ||
            (rc = write_file(dir, "local_cpulist", "%s\n", node_list[g->numa])))
            return rc;
    }
    return 0;
}

int main(int argc, char **argv)
{
    enum { NONE, LIST, SYSROOT, JSON };
    int action = NONE;
    const char *root = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int next = NONE;
        if (!strcmp(a, "--probe-mig-device") && argc == 2) {
            return probe_mig_device();   /* internal: S-mig */
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-L") || !strcmp(a, "--list-gpus")) {
            next = LIST;
        } else if (!strcmp(a, "--json")) {
            next = JSON;
        } else if (!strcmp(a, "--sysroot")) {
            if (i + 1 >= argc)
                return fail(2, "--sysroot needs a directory: --sysroot DIR");
            root = argv[++i];
            next = SYSROOT;
        } else if (!strncmp(a, "--sysroot=", 10)) {
            root = a + 10;
            next = SYSROOT;
        } else {
            fprintf(stderr, "%s: unknown argument \"%s\"\n", prog, a);
            usage(stderr);
            return 2;
        }
        if (action != NONE && action != next)
            return fail(2, "give one of -L, --sysroot DIR, --json (got \"%s\" after another)", a);
        action = next;
    }
    if (action == NONE) {
        usage(stderr);
        return 2;
    }
    if (action == SYSROOT && !*root)
        return fail(2, "--sysroot needs a non-empty directory");

    int numa_nodes, rc;
    if (numa_nodes_from_env(&numa_nodes))
        return 2;
    if ((rc = read_node(numa_nodes)))
        return rc;
    switch (action) {
    case LIST:
        return list_gpus();
    case JSON:
        return print_json();
    case SYSROOT:
        return write_sysroot(root, numa_nodes);
    default:
        return 2;
    }
}
