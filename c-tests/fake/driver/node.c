/* The fake node: how many GPUs, what they are, their fixed identities (UUIDs, PCI bus ids,
 * NUMA nodes) and MIG layout, read from FAKECUDA_* variables once, at cuInit.
 * Identities follow c-tests/cvd-vectors.tsv's header; c-tests/README.md documents the
 * variables and the topology file format. */
#include "fake.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB (1024ull * 1024ull * 1024ull)

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static void default_gpu(struct fake_gpu *g, int i)
{
    memset(g, 0, sizeof *g);
    g->index = i;
    snprintf(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3");
    g->sm_count = 132;
    g->clock_khz = 1980000;
    g->cc_major = 9;
    g->cc_minor = 0;
    g->total_mem = 80 * GIB;
}

/* FAKECUDA_MIG=G:N[;G:N...] */
static int parse_mig(struct fake_node *node, const char *spec)
{
    char buf[512];
    if (strlen(spec) >= sizeof buf)
        goto bad;
    strcpy(buf, spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
        char *colon = strchr(tok, ':');
        long g, n;
        if (!colon)
            goto bad;
        *colon = 0;
        if (parse_int(tok, 0, node->n_gpus - 1, &g) || parse_int(colon + 1, 1, FAKE_MAX_MIG, &n))
            goto bad;
        if (node->gpu[g].mig_count)
            goto bad;
        node->gpu[g].mig_count = (int)n;
    }
    return 0;
bad:
    fprintf(stderr, "fakecuda: FAKECUDA_MIG=\"%s\" is invalid: expected G:N[;G:N...] with "
            "0 <= G < %d (FAKECUDA_GPUS), 1 <= N <= %d and each GPU once, e.g. "
            "FAKECUDA_MIG=\"1:2;3:7\"\n", spec, node->n_gpus, FAKE_MAX_MIG);
    return -1;
}

/* FAKECUDA_TOPOLOGY=file: lines `<gpu index> key=value ...`, keys name="...", sms=,
 * clock_khz=, mem_gib=, cc=M.m, numa=; `#` starts a comment. Overrides the defaults of
 * the named GPUs; the GPU count still comes from FAKECUDA_GPUS. */
static int parse_topology(struct fake_node *node, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "fakecuda: FAKECUDA_TOPOLOGY=\"%s\" cannot be read: %s; expected a "
                "readable topology file (c-tests/README.md), or unset the variable\n", path, strerror(errno));
        return -1;
    }
    char line[1024];
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (!*p)
            continue;
        char *end;
        long idx = strtol(p, &end, 10);
        if (end == p || idx < 0 || idx >= node->n_gpus)
            goto bad;
        struct fake_gpu *g = &node->gpu[idx];
        p = end;
        for (;;) {
            while (isspace((unsigned char)*p))
                p++;
            if (!*p)
                break;
            char *eq = strchr(p, '=');
            if (!eq)
                goto bad;
            *eq = 0;
            char *key = p, *val = eq + 1;
            if (*val == '"') {
                val++;
                char *q = strchr(val, '"');
                if (!q)
                    goto bad;
                *q = 0;
                p = q + 1;
            } else {
                p = val;
                while (*p && !isspace((unsigned char)*p))
                    p++;
                if (*p)
                    *p++ = 0;
            }
            long v;
            if (!strcmp(key, "name")) {
                snprintf(g->name, sizeof g->name, "%s", val);
            } else if (!strcmp(key, "sms")) {
                if (parse_int(val, 1, 1024, &v)) goto bad;
                g->sm_count = (int)v;
            } else if (!strcmp(key, "clock_khz")) {
                if (parse_int(val, 1, 10000000, &v)) goto bad;
                g->clock_khz = (int)v;
            } else if (!strcmp(key, "mem_gib")) {
                if (parse_int(val, 1, 4096, &v)) goto bad;
                g->total_mem = (size_t)v * GIB;
            } else if (!strcmp(key, "numa")) {
                if (parse_int(val, 0, node->numa_nodes - 1, &v)) goto bad;
                g->numa_node = (int)v;
            } else if (!strcmp(key, "cc")) {
                int ma, mi;
                if (sscanf(val, "%d.%d", &ma, &mi) != 2 || ma < 1 || ma > 20 || mi < 0 || mi > 9)
                    goto bad;
                g->cc_major = ma;
                g->cc_minor = mi;
            } else {
                goto bad;
            }
        }
    }
    fclose(f);
    return 0;
bad:
    fclose(f);
    fprintf(stderr, "fakecuda: FAKECUDA_TOPOLOGY=\"%s\" line %d is invalid: expected "
            "`<gpu index 0..%d> [name=\"...\"] [sms=N] [clock_khz=N] [mem_gib=N] [cc=M.m] "
            "[numa=0..%d]`\n", path, lineno, node->n_gpus - 1, node->numa_nodes - 1);
    return -1;
}

int fake_node_load(struct fake_node *node)
{
    long v;
    const char *s;
    memset(node, 0, sizeof *node);
    node->n_gpus = 8;
    node->numa_nodes = 2;
    if ((s = getenv("FAKECUDA_GPUS")) != NULL) {
        if (parse_int(s, 1, FAKE_MAX_GPUS, &v)) {
            fprintf(stderr, "fakecuda: FAKECUDA_GPUS=\"%s\" is invalid: expected an integer "
                    "from 1 to %d (default 8)\n", s, FAKE_MAX_GPUS);
            return -1;
        }
        node->n_gpus = (int)v;
    }
    if ((s = getenv("FAKECUDA_NUMA_NODES")) != NULL) {
        if (parse_int(s, 1, FAKE_MAX_GPUS, &v)) {
            fprintf(stderr, "fakecuda: FAKECUDA_NUMA_NODES=\"%s\" is invalid: expected an "
                    "integer from 1 to %d (default 2)\n", s, FAKE_MAX_GPUS);
            return -1;
        }
        node->numa_nodes = (int)v;
    }
    for (int i = 0; i < node->n_gpus; i++) {
        default_gpu(&node->gpu[i], i);
        node->gpu[i].numa_node = i * node->numa_nodes / node->n_gpus;
    }
    if ((s = getenv("FAKECUDA_TOPOLOGY")) != NULL && *s && parse_topology(node, s))
        return -1;
    if ((s = getenv("FAKECUDA_MIG")) != NULL && *s && parse_mig(node, s))
        return -1;
    return 0;
}

static void put_tail(unsigned char out[16], unsigned long long v)
{
    for (int k = 0; k < 6; k++)
        out[15 - k] = (unsigned char)(v >> (8 * k));
}

/* GPU i: GPU-{0x10+i:02x}c0ffee-0000-4000-8000-{i:012x} (cvd-vectors.tsv header). */
void fake_gpu_uuid(int gpu, unsigned char out[16])
{
    static const unsigned char tmpl[16] = {0, 0xc0, 0xff, 0xee, 0, 0, 0x40, 0, 0x80, 0};
    memcpy(out, tmpl, 16);
    out[0] = (unsigned char)(0x10 + gpu);
    put_tail(out, (unsigned long long)gpu);
}

/* MIG j on GPU i: MIG-{0x10+i:02x}{j:02x}a11c-0000-4000-8000-{i*256+j:012x}. */
void fake_mig_uuid(int gpu, int mig, unsigned char out[16])
{
    static const unsigned char tmpl[16] = {0, 0, 0xa1, 0x1c, 0, 0, 0x40, 0, 0x80, 0};
    memcpy(out, tmpl, 16);
    out[0] = (unsigned char)(0x10 + gpu);
    out[1] = (unsigned char)mig;
    put_tail(out, (unsigned long long)gpu * 256 + (unsigned long long)mig);
}

void fake_dev_uuid(const struct fake_dev *d, unsigned char out[16])
{
    if (d->mig < 0)
        fake_gpu_uuid(d->gpu, out);
    else
        fake_mig_uuid(d->gpu, d->mig, out);
}

void fake_uuid_string(const char *prefix, const unsigned char u[16], char *out, size_t len)
{
    snprintf(out, len, "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             prefix, u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
             u[12], u[13], u[14], u[15]);
}

int fake_gpu_pci_bus(int gpu)
{
    return 0x18 + 0x10 * gpu;
}
