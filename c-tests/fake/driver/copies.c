/* Fake driver batch and attribute copies: cuMemcpyBatchAsync (12.8, with failIdx; 13.0's
 * _v2 without), cuMemcpy3DBatchAsync (likewise), 13.2's cuMemcpyWithAttributesAsync and
 * cuMemcpy3DWithAttributesAsync, 13.5's cuFabricCpyBatchAsync, each with its per-thread
 * (_ptsz) export. Compiled against the CUDA 13 cuda.h (driver.mk), which declares every one
 * of them and their operand structs; the routing table (gen_routes.py) points at these.
 *
 * Semantics of cuda.h 13.x; where it is silent (tagged D-xxx, listed in c-tests/README.md):
 *   D-copyhint   a location hint is validated like any location (a DEVICE hint must name a
 *                visible device, HOST_NUMA an existing node) and an invalid one refused with
 *                CUDA_ERROR_INVALID_VALUE, the only error these functions document;
 *   D-copyorder  the copies of a batch run in order, each through the fake's one copy
 *                routine (unified addressing: any mapped address); every argument is checked
 *                before the first byte moves;
 *   D-copyarray  the fake has no CUDA arrays: an array operand is CUDA_ERROR_INVALID_VALUE (as
 *                an invalid array handle);
 *   D-fabriccpy  the fake node has no fabric: a logical-endpoint operand is
 *                CUDA_ERROR_NOT_SUPPORTED; pointer-to-pointer fabric copies are copies.
 * The stream must not be the legacy NULL stream (cuda.h: "Must not be legacy NULL stream");
 * through the _ptsz exports NULL is the per-thread stream, which is allowed. */
#include "fake.h"

#include <stdint.h>
#include <string.h>

#define CHECK_INIT()                         \
    do {                                     \
        CUresult r_ = fake_check_init();     \
        if (r_ != CUDA_SUCCESS)              \
            return r_;                       \
    } while (0)

static CUresult stream_ok(CUstream s, int per_thread)
{
    if (s == CU_STREAM_LEGACY || (s == NULL && !per_thread))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    CUresult r = fake_stream_check(s);
    pthread_mutex_unlock(&fake_lock);
    return r;
}

static CUresult hint_ok(const CUmemLocation *l)
{
    return fake_check_location(l, 1) == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult attr_ok(const CUmemcpyAttributes *a)
{
    if (a->srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
        a->srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY ||
        (a->flags & ~(unsigned)CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hint_ok(&a->srcLocHint);
    return r != CUDA_SUCCESS ? r : hint_ok(&a->dstLocHint);
}

/* ---------------------------------------------------------------- 1D batches */

static CUresult batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                      CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
                      size_t *failIdx, CUstream s, int per_thread)
{
    if (failIdx)
        *failIdx = SIZE_MAX;
    CHECK_INIT();
    CUresult r = stream_ok(s, per_thread);
    if (r != CUDA_SUCCESS)
        return r;
    if (!dsts || !srcs || !sizes || !attrs || !attrsIdxs || count == 0 || numAttrs == 0 ||
        numAttrs > count || attrsIdxs[0] != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; k < numAttrs; k++) {
        if ((k > 0 && attrsIdxs[k] <= attrsIdxs[k - 1]) || attrsIdxs[k] >= count)
            return CUDA_ERROR_INVALID_VALUE;
        if ((r = attr_ok(&attrs[k])) != CUDA_SUCCESS) {
            if (failIdx)
                *failIdx = attrsIdxs[k];
            return r;
        }
    }
    for (size_t i = 0; i < count; i++) {
        r = fake_copy(dsts[i], 0, srcs[i], 0, sizes[i], s, 1);
        if (r != CUDA_SUCCESS) {
            if (failIdx)
                *failIdx = i;
            return r;
        }
    }
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                             size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
                                             size_t numAttrs, size_t *failIdx, CUstream hStream)
{
    return batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, hStream, 0);
}
FAKE_API CUresult CUDAAPI cuMemcpyBatchAsync_ptsz(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                                  size_t count, CUmemcpyAttributes *attrs,
                                                  size_t *attrsIdxs, size_t numAttrs, size_t *failIdx,
                                                  CUstream hStream)
{
    return batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, hStream, 1);
}
FAKE_API CUresult CUDAAPI cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                                size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
                                                size_t numAttrs, CUstream hStream)
{
    return batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, NULL, hStream, 0);
}
FAKE_API CUresult CUDAAPI cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                                     size_t count, CUmemcpyAttributes *attrs,
                                                     size_t *attrsIdxs, size_t numAttrs, CUstream hStream)
{
    return batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, NULL, hStream, 1);
}

static CUresult with_attributes(CUdeviceptr dst, CUdeviceptr src, size_t size, CUmemcpyAttributes *attr,
                                CUstream s, int per_thread)
{
    CHECK_INIT();
    CUresult r = stream_ok(s, per_thread);
    if (r != CUDA_SUCCESS)
        return r;
    if (!attr)
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = attr_ok(attr)) != CUDA_SUCCESS)
        return r;
    return fake_copy(dst, 0, src, 0, size, s, 1);
}

FAKE_API CUresult CUDAAPI cuMemcpyWithAttributesAsync(CUdeviceptr dst, CUdeviceptr src, size_t size,
                                                      CUmemcpyAttributes *attr, CUstream hStream)
{
    return with_attributes(dst, src, size, attr, hStream, 0);
}
FAKE_API CUresult CUDAAPI cuMemcpyWithAttributesAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t size,
                                                           CUmemcpyAttributes *attr, CUstream hStream)
{
    return with_attributes(dst, src, size, attr, hStream, 1);
}

/* ---------------------------------------------------------------- 3D batches */

/* A pointer operand's row and layer pitch (bytes: the element size of a pointer-to-pointer
 * copy is 1); zero means tightly packed (cuda.h). */
static CUresult operand_ok(const CUmemcpy3DOperand *o, const CUextent3D *e)
{
    if (o->type == CU_MEMCPY_OPERAND_TYPE_ARRAY)
        return CUDA_ERROR_INVALID_VALUE; /* D-copyarray */
    if (o->type != CU_MEMCPY_OPERAND_TYPE_POINTER || !o->op.ptr.ptr)
        return CUDA_ERROR_INVALID_VALUE;
    if ((o->op.ptr.rowLength && o->op.ptr.rowLength < e->width) ||
        (o->op.ptr.layerHeight && o->op.ptr.layerHeight < e->height))
        return CUDA_ERROR_INVALID_VALUE;
    return hint_ok(&o->op.ptr.locHint);
}

static CUresult op_ok(const CUDA_MEMCPY3D_BATCH_OP *op)
{
    if (!op->extent.width || !op->extent.height || !op->extent.depth ||
        op->srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
        op->srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY ||
        (op->flags & ~(unsigned)CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = operand_ok(&op->src, &op->extent);
    return r != CUDA_SUCCESS ? r : operand_ok(&op->dst, &op->extent);
}

static CUresult op_copy(const CUDA_MEMCPY3D_BATCH_OP *op, CUstream s)
{
    const CUextent3D *e = &op->extent;
    size_t srow = op->src.op.ptr.rowLength ? op->src.op.ptr.rowLength : e->width;
    size_t drow = op->dst.op.ptr.rowLength ? op->dst.op.ptr.rowLength : e->width;
    size_t slayer = srow * (op->src.op.ptr.layerHeight ? op->src.op.ptr.layerHeight : e->height);
    size_t dlayer = drow * (op->dst.op.ptr.layerHeight ? op->dst.op.ptr.layerHeight : e->height);
    for (size_t z = 0; z < e->depth; z++)
        for (size_t y = 0; y < e->height; y++) {
            CUresult r = fake_copy(op->dst.op.ptr.ptr + z * dlayer + y * drow, 0,
                                   op->src.op.ptr.ptr + z * slayer + y * srow, 0, e->width, s, 1);
            if (r != CUDA_SUCCESS)
                return r;
        }
    return CUDA_SUCCESS;
}

static CUresult batch3d(size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, size_t *failIdx,
                        unsigned long long flags, CUstream s, int per_thread)
{
    if (failIdx)
        *failIdx = SIZE_MAX;
    CHECK_INIT();
    CUresult r = stream_ok(s, per_thread);
    if (r != CUDA_SUCCESS)
        return r;
    if (!opList || numOps == 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < numOps; i++)
        if ((r = op_ok(&opList[i])) != CUDA_SUCCESS) {
            if (failIdx)
                *failIdx = i;
            return r;
        }
    for (size_t i = 0; i < numOps; i++)
        if ((r = op_copy(&opList[i], s)) != CUDA_SUCCESS) {
            if (failIdx)
                *failIdx = i;
            return r;
        }
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuMemcpy3DBatchAsync(size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList,
                                               size_t *failIdx, unsigned long long flags, CUstream hStream)
{
    return batch3d(numOps, opList, failIdx, flags, hStream, 0);
}
FAKE_API CUresult CUDAAPI cuMemcpy3DBatchAsync_ptsz(size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList,
                                                    size_t *failIdx, unsigned long long flags,
                                                    CUstream hStream)
{
    return batch3d(numOps, opList, failIdx, flags, hStream, 1);
}
FAKE_API CUresult CUDAAPI cuMemcpy3DBatchAsync_v2(size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList,
                                                  unsigned long long flags, CUstream hStream)
{
    return batch3d(numOps, opList, NULL, flags, hStream, 0);
}
FAKE_API CUresult CUDAAPI cuMemcpy3DBatchAsync_v2_ptsz(size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList,
                                                       unsigned long long flags, CUstream hStream)
{
    return batch3d(numOps, opList, NULL, flags, hStream, 1);
}
FAKE_API CUresult CUDAAPI cuMemcpy3DWithAttributesAsync(CUDA_MEMCPY3D_BATCH_OP *op, unsigned long long flags,
                                                        CUstream hStream)
{
    return batch3d(1, op, NULL, flags, hStream, 0);
}
FAKE_API CUresult CUDAAPI cuMemcpy3DWithAttributesAsync_ptsz(CUDA_MEMCPY3D_BATCH_OP *op,
                                                             unsigned long long flags, CUstream hStream)
{
    return batch3d(1, op, NULL, flags, hStream, 1);
}

/* ---------------------------------------------------------------- fabric copies */

static CUresult fabric_operand_ok(const CUfabricCpyOperand *o)
{
    if (o->type == CU_FABRIC_COPY_OPERAND_TYPE_LOGICAL_ENDPOINT)
        return CUDA_ERROR_NOT_SUPPORTED; /* D-fabriccpy */
    if (o->type != CU_FABRIC_COPY_OPERAND_TYPE_POINTER || !o->op.ptr.ptr)
        return CUDA_ERROR_INVALID_VALUE;
    return hint_ok(&o->op.ptr.locHint);
}

static CUresult fabric(size_t numOps, CUDA_FABRIC_COPY_BATCH_OP *opList, unsigned long long flags,
                       CUstream s, int per_thread)
{
    CHECK_INIT();
    CUresult r = stream_ok(s, per_thread);
    if (r != CUDA_SUCCESS)
        return r;
    if (!opList || numOps == 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < numOps; i++) {
        if (opList[i].flags != 0)
            return CUDA_ERROR_INVALID_VALUE;
        if ((r = fabric_operand_ok(&opList[i].src)) != CUDA_SUCCESS ||
            (r = fabric_operand_ok(&opList[i].dst)) != CUDA_SUCCESS)
            return r;
    }
    for (size_t i = 0; i < numOps; i++) /* size 0: a no-op whose operands were validated */
        if ((r = fake_copy(opList[i].dst.op.ptr.ptr, 0, opList[i].src.op.ptr.ptr, 0, opList[i].size, s,
                           1)) != CUDA_SUCCESS)
            return r;
    return CUDA_SUCCESS;
}

FAKE_API CUresult CUDAAPI cuFabricCpyBatchAsync(size_t numOps, CUDA_FABRIC_COPY_BATCH_OP *opList,
                                                unsigned long long flags, CUstream hStream)
{
    return fabric(numOps, opList, flags, hStream, 0);
}
FAKE_API CUresult CUDAAPI cuFabricCpyBatchAsync_ptsz(size_t numOps, CUDA_FABRIC_COPY_BATCH_OP *opList,
                                                     unsigned long long flags, CUstream hStream)
{
    return fabric(numOps, opList, flags, hStream, 1);
}
