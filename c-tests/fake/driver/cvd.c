/* CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER resolution: the ONE place the fake decides
 * which devices a process enumerates, and in what order. Read once, at cuInit.
 *
 * Rules (docs/design.md §3: CUDA Programming Guide "CUDA Environment Variables";
 * PyTorch torch/cuda/__init__.py _parse_visible_devices, checked against a real driver in
 * pytorch#92315); every row of c-tests/cvd-vectors.tsv exercises one:
 *   R-unset   unset: every device, in CUDA_DEVICE_ORDER;
 *   R-empty   set but empty: none;
 *   R-list    comma-separated, enumerated in list order;
 *   R-trunc   the first invalid entry ends the list (`0,2,-1,1` -> 0,2; `-1` -> none);
 *   R-strtoul an index parses like strtoul: leading spaces and a sign accepted, trailing
 *             garbage ignored (`1gpu2` -> 1, ` +3` -> 3, `-0` -> 0, `one` invalid);
 *   R-dup     a device named twice makes the whole set empty (`0,1,2,1` -> none);
 *   R-range   an index >= the device count is invalid (truncates);
 *   R-uuid    `GPU-<uuid>` or any prefix of it (including `GPU-`) naming exactly one GPU;
 *             unknown or ambiguous prefixes are invalid;
 *   R-mig     `MIG-<uuid>` (prefix as above) or legacy `MIG-GPU-<gpu uuid>/<gi>/<ci>`;
 *   R-mode    the first entry's form decides the mode: after a `GPU-` first entry only
 *             `GPU-` entries are valid, after `MIG-` only `MIG-`, after an index only
 *             indices (`GPU-12,3` -> GPU 2; `3,GPU-12` -> 3);
 *   R-order   indices follow CUDA_DEVICE_ORDER: FASTEST_FIRST (default; also for an
 *             unknown value, which the driver ignores) or PCI_BUS_ID.
 * Decisions where the documentation is silent (listed in c-tests/README.md):
 *   D-fastest FASTEST_FIRST sorts by SM count x clock rate, descending; ties keep PCI bus
 *             order (the node's GPUs are identical by default, so both orders agree).
 *   D-migenum a GPU in MIG mode enumerates as its MIG instance 0 wherever the whole GPU
 *             would appear (unset CVD, an index, or its GPU- UUID).
 *   D-mig1    CUDA enumerates at most one MIG instance per process (NVIDIA MIG User Guide,
 *             "CUDA Device Enumeration"): after resolution, MIG devices after the first
 *             are dropped from the list (not a truncation: later whole GPUs stay).
 *   D-dupuuid two entries resolving to the same device (`GPU-12,GPU-12c0ffee...`) count as
 *             a duplicate (R-dup), like two equal indices.
 *   D-uuidsp  UUID entries are matched verbatim (no space stripping, case-sensitive); a
 *             leading space makes the first entry an index entry, which is then invalid.
 *   D-migleg  the legacy form names GPU instance <gi> = MIG instance number; <ci> must be 0.
 */
#include "fake.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum mode { MODE_INDEX, MODE_GPU, MODE_MIG };

static long long speed(const struct fake_node *node, const struct fake_dev *d)
{
    const struct fake_gpu *g = &node->gpu[d->gpu];
    long long sms = g->sm_count;
    if (d->mig >= 0)
        sms = sms / 8 * (7 / g->mig_count);      /* the instance's slice of the GPU */
    return sms * g->clock_khz;
}

/* All devices in CUDA_DEVICE_ORDER (R-order, D-fastest, D-migenum). */
static int base_list(const struct fake_node *node, const char *order, struct fake_dev *out)
{
    int n = node->n_gpus;
    for (int i = 0; i < n; i++) {
        out[i].gpu = i;
        out[i].mig = node->gpu[i].mig_count ? 0 : -1;
    }
    if (order && !strcmp(order, "PCI_BUS_ID"))
        return n;
    /* insertion sort: stable, so equal speeds keep PCI bus order */
    for (int i = 1; i < n; i++) {
        struct fake_dev d = out[i];
        int j = i - 1;
        while (j >= 0 && speed(node, &out[j]) < speed(node, &d)) {
            out[j + 1] = out[j];
            j--;
        }
        out[j + 1] = d;
    }
    return n;
}

/* R-strtoul: 0 and the value for a valid index, -1 otherwise (negatives are invalid
 * except -0, as strtoul turns -N into a huge value that R-range then rejects). */
static int parse_index(const char *s, size_t len, long *out)
{
    size_t i = 0;
    int neg = 0;
    while (i < len && isspace((unsigned char)s[i]))
        i++;
    if (i < len && (s[i] == '+' || s[i] == '-'))
        neg = s[i++] == '-';
    if (i >= len || !isdigit((unsigned char)s[i]))
        return -1;
    long v = 0;
    while (i < len && isdigit((unsigned char)s[i])) {
        if (v < 1000000)
            v = v * 10 + (s[i] - '0');
        i++;
    }
    if (neg && v != 0)
        return -1;
    *out = v;
    return 0;
}

static int starts(const char *s, size_t len, const char *prefix)
{
    size_t p = strlen(prefix);
    return len >= p && !memcmp(s, prefix, p);
}

/* R-uuid: the unique device of cands[] whose UUID string starts with the entry. */
static int match_prefix(const char *s, size_t len, const struct fake_dev *cands, int n,
                        const char *prefix, struct fake_dev *out)
{
    int found = 0;
    for (int k = 0; k < n; k++) {
        unsigned char u[16];
        char str[64];
        fake_dev_uuid(&cands[k], u);
        fake_uuid_string(prefix, u, str, sizeof str);
        if (len <= strlen(str) && !memcmp(str, s, len)) {
            if (found++)
                return -1;              /* ambiguous */
            *out = cands[k];
        }
    }
    return found == 1 ? 0 : -1;
}

static int resolve_entry(const struct fake_node *node, enum mode mode, const char *s,
                         size_t len, const struct fake_dev *base, int nbase,
                         struct fake_dev *out)
{
    if (mode == MODE_INDEX) {
        long idx;
        if (parse_index(s, len, &idx) || idx >= nbase)     /* R-strtoul, R-range */
            return -1;
        *out = base[idx];
        return 0;
    }
    if (mode == MODE_GPU) {
        if (!starts(s, len, "GPU-"))                        /* R-mode */
            return -1;
        struct fake_dev gpus[FAKE_MAX_GPUS];
        for (int i = 0; i < node->n_gpus; i++)
            gpus[i] = (struct fake_dev){i, -1};
        if (match_prefix(s, len, gpus, node->n_gpus, "GPU-", out))
            return -1;
        if (node->gpu[out->gpu].mig_count)                  /* D-migenum */
            out->mig = 0;
        return 0;
    }
    if (!starts(s, len, "MIG-"))                            /* R-mode */
        return -1;
    if (starts(s, len, "MIG-GPU-")) {                       /* R-mig legacy, D-migleg */
        const char *slash = memchr(s, '/', len);
        if (!slash)
            return -1;
        size_t ulen = (size_t)(slash - s) - 4;
        struct fake_dev gpus[FAKE_MAX_GPUS];
        for (int i = 0; i < node->n_gpus; i++)
            gpus[i] = (struct fake_dev){i, -1};
        struct fake_dev g;
        if (match_prefix(s + 4, ulen, gpus, node->n_gpus, "GPU-", &g))
            return -1;
        char tail[32];
        size_t tlen = len - (size_t)(slash - s);
        if (tlen >= sizeof tail)
            return -1;
        memcpy(tail, slash, tlen);
        tail[tlen] = 0;
        int gi, ci, used = 0;
        if (sscanf(tail, "/%d/%d%n", &gi, &ci, &used) != 2 || (size_t)used != tlen)
            return -1;
        if (gi < 0 || gi >= node->gpu[g.gpu].mig_count || ci != 0)
            return -1;
        *out = (struct fake_dev){g.gpu, gi};
        return 0;
    }
    struct fake_dev migs[FAKE_MAX_GPUS * FAKE_MAX_MIG];
    int n = 0;
    for (int i = 0; i < node->n_gpus; i++)
        for (int j = 0; j < node->gpu[i].mig_count; j++)
            migs[n++] = (struct fake_dev){i, j};
    return match_prefix(s, len, migs, n, "MIG-", out);
}

int fake_resolve_visible(const struct fake_node *node, const char *cvd, const char *order,
                         struct fake_dev *out)
{
    struct fake_dev base[FAKE_MAX_GPUS];
    int nbase = base_list(node, order, base);
    struct fake_dev list[FAKE_MAX_GPUS];
    int n = 0;

    if (!cvd) {                                             /* R-unset */
        memcpy(list, base, sizeof(struct fake_dev) * (size_t)nbase);
        n = nbase;
    } else {
        enum mode mode = MODE_INDEX;                        /* R-mode */
        if (!strncmp(cvd, "GPU-", 4))
            mode = MODE_GPU;
        else if (!strncmp(cvd, "MIG-", 4))
            mode = MODE_MIG;
        const char *p = cvd;
        while (*cvd) {                                      /* R-empty: loop never runs */
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            struct fake_dev d;
            if (resolve_entry(node, mode, p, len, base, nbase, &d))
                break;                                      /* R-trunc */
            for (int k = 0; k < n; k++)
                if (list[k].gpu == d.gpu && list[k].mig == d.mig)
                    return 0;                               /* R-dup, D-dupuuid */
            if (n == FAKE_MAX_GPUS)
                break;
            list[n++] = d;                                  /* R-list */
            if (!comma)
                break;
            p = comma + 1;
        }
    }
    int m = 0, seen_mig = 0;                                /* D-mig1 */
    for (int k = 0; k < n; k++) {
        if (list[k].mig >= 0) {
            if (seen_mig)
                continue;
            seen_mig = 1;
        }
        out[m++] = list[k];
    }
    return m;
}
