/* Prints what the fake driver enumerates under the current CUDA_VISIBLE_DEVICES /
 * CUDA_DEVICE_ORDER / FAKECUDA_* environment, for python-tests/test_fake_cvd.py, which
 * compares it with c-tests/cvd-vectors.tsv. Physical identity is recovered from the
 * UUIDs alone (the fixed scheme in the vectors' header), not from any fake-only API.
 *   init <CUresult>
 *   count <n>
 *   dev <ordinal> <uuid_v2> <v1 uuid> <pci bus id> <numa> <host numa> <sms> <name>
 *   enum <physical list as in the vectors' expected column, `-` for none>  */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

static void uuid_str(const char *prefix, const unsigned char *u, char *out, size_t len)
{
    snprintf(out, len, "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             prefix, u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
             u[12], u[13], u[14], u[15]);
}

int main(void)
{
    CUresult r = cuInit(0);
    printf("init %d\n", (int)r);
    if (r != CUDA_SUCCESS) {
        int n = -1;
        CUresult rc = cuDeviceGetCount(&n);
        printf("count-after-failed-init %d\n", (int)rc);
        printf("enum -\n");
        return 0;
    }
    int n = 0;
    if (cuDeviceGetCount(&n) != CUDA_SUCCESS)
        return 2;
    printf("count %d\n", n);
    char list[1024] = "";
    for (int i = 0; i < n; i++) {
        CUdevice d;
        CUuuid u2, u1;
        char name[128], pci[32], s2[64], s1[64];
        int numa = -9, hnuma = -9, sms = 0;
        if (cuDeviceGet(&d, i) || cuDeviceGetUuid_v2(&u2, d) || cuDeviceGetUuid(&u1, d) ||
            cuDeviceGetName(name, sizeof name, d) || cuDeviceGetPCIBusId(pci, sizeof pci, d) ||
            cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_NUMA_ID, d) ||
            cuDeviceGetAttribute(&hnuma, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, d) ||
            cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d))
            return 3;
        const unsigned char *b = (const unsigned char *)u2.bytes;
        int is_mig = b[2] == 0xa1 && b[3] == 0x1c;
        uuid_str(is_mig ? "MIG-" : "GPU-", b, s2, sizeof s2);
        uuid_str("GPU-", (const unsigned char *)u1.bytes, s1, sizeof s1);
        printf("dev %d %s %s %s %d %d %d %s\n", i, s2, s1, pci, numa, hnuma, sms, name);
        char item[16];
        if (is_mig)
            snprintf(item, sizeof item, "%d/%d", b[0] - 0x10, b[1]);
        else
            snprintf(item, sizeof item, "%d", b[0] - 0x10);
        if (i)
            strcat(list, ",");
        strcat(list, item);
    }
    CUdevice bad;
    printf("get-out-of-range %d\n", (int)cuDeviceGet(&bad, n));
    printf("enum %s\n", n ? list : "-");
    return 0;
}
