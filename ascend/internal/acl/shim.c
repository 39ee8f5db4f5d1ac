//go:build ascend && cgo

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

typedef int aclError;

// The runtime functions, filled by k3_bind_runtime.
static struct {
	aclError (*aclInit)(const char *);
	aclError (*aclrtGetDeviceCount)(uint32_t *);
	aclError (*aclrtCreateContext)(void **, int32_t);
	aclError (*aclrtDestroyContext)(void *);
	aclError (*aclrtSetCurrentContext)(void *);
	aclError (*aclrtMalloc)(void **, size_t, int);
	aclError (*aclrtFree)(void *);
	aclError (*aclrtMallocHost)(void **, size_t);
	aclError (*aclrtFreeHost)(void *);
	aclError (*aclrtMemcpy)(void *, size_t, const void *, size_t, int);
	aclError (*aclrtMemcpyAsync)(void *, size_t, const void *, size_t, int, void *);
	aclError (*aclrtMemsetAsync)(void *, size_t, int32_t, size_t, void *);
	aclError (*aclrtCreateStream)(void **);
	aclError (*aclrtSynchronizeStream)(void *);
	aclError (*aclrtDestroyStream)(void *);
	aclError (*aclrtCreateEvent)(void **);
	aclError (*aclrtRecordEvent)(void *, void *);
	aclError (*aclrtStreamWaitEvent)(void *, void *);
	aclError (*aclrtSynchronizeEvent)(void *);
	aclError (*aclrtEventElapsedTime)(float *, void *, void *);
	aclError (*aclrtDestroyEvent)(void *);
	const char *(*aclGetRecentErrMsg)(void);
	aclError (*aclmdlRICaptureBegin)(void *, int);
	aclError (*aclmdlRICaptureEnd)(void *, void **);
	aclError (*aclmdlRIExecuteAsync)(void *, void *);
	aclError (*aclmdlRIDestroy)(void *);
	// libnnopbase
	void *(*aclCreateTensor)(const int64_t *, uint64_t, int, const int64_t *, int64_t, int,
		const int64_t *, uint64_t, void *);
	int (*aclDestroyTensor)(const void *);
	int (*aclSetAclOpExecutorRepeatable)(void *);
	int (*aclDestroyAclOpExecutor)(void *);
	void *(*aclCreateScalar)(void *, int);
	int (*aclDestroyScalar)(const void *);
	void *(*aclCreateIntArray)(const int64_t *, uint64_t);
	int (*aclDestroyIntArray)(const void *);
	void *(*aclCreateTensorList)(const void *const *, uint64_t);
	int (*aclDestroyTensorList)(const void *);
} f;

// The order of these names is the order of f's fields.
static const char *acl_names[] = {
	"aclInit", "aclrtGetDeviceCount", "aclrtCreateContext", "aclrtDestroyContext",
	"aclrtSetCurrentContext", "aclrtMalloc", "aclrtFree", "aclrtMallocHost", "aclrtFreeHost",
	"aclrtMemcpy", "aclrtMemcpyAsync", "aclrtMemsetAsync", "aclrtCreateStream", "aclrtSynchronizeStream",
	"aclrtDestroyStream", "aclrtCreateEvent", "aclrtRecordEvent", "aclrtStreamWaitEvent",
	"aclrtSynchronizeEvent", "aclrtEventElapsedTime", "aclrtDestroyEvent", "aclGetRecentErrMsg",
	"aclmdlRICaptureBegin", "aclmdlRICaptureEnd", "aclmdlRIExecuteAsync", "aclmdlRIDestroy",
};
static const char *nnopbase_names[] = {
	"aclCreateTensor", "aclDestroyTensor", "aclSetAclOpExecutorRepeatable", "aclDestroyAclOpExecutor",
	"aclCreateScalar", "aclDestroyScalar", "aclCreateIntArray", "aclDestroyIntArray",
	"aclCreateTensorList", "aclDestroyTensorList",
};

void *k3_dlopen(const char *path, int global, char *errbuf, size_t n) {
	void *h = dlopen(path, RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
	if (h == NULL) {
		const char *m = dlerror();
		snprintf(errbuf, n, "%s", m ? m : "dlopen failed");
	}
	return h;
}

void *k3_dlsym(void *h, const char *name) { return dlsym(h, name); }

void k3_dlclose(void *h) { dlclose(h); }

int k3_bind_runtime(void *acl, void *nnopbase, char *missing, size_t n) {
	// Bound into a copy first, so that a failed load leaves the table of
	// an earlier successful one intact.
	__typeof__(f) t;
	void **slot = (void **)&t;
	size_t na = sizeof acl_names / sizeof acl_names[0];
	size_t nn = sizeof nnopbase_names / sizeof nnopbase_names[0];
	if (na + nn != sizeof t / sizeof(void *)) {
		snprintf(missing, n, "shim table mismatch");
		return -1;
	}
	for (size_t i = 0; i < na + nn; i++) {
		const char *name = i < na ? acl_names[i] : nnopbase_names[i - na];
		void *p = dlsym(i < na ? acl : nnopbase, name);
		if (p == NULL) {
			snprintf(missing, n, "%s", name);
			return -1;
		}
		slot[i] = p;
	}
	f = t;
	return 0;
}

static void fill(k3_err *e, int lib, int code, const char *api) {
	e->lib = lib;
	e->code = code;
	snprintf(e->api, sizeof e->api, "%s", api);
	const char *m = f.aclGetRecentErrMsg ? f.aclGetRecentErrMsg() : NULL;
	snprintf(e->msg, sizeof e->msg, "%s", m ? m : "");
}

// CALL runs one ACL function and reports its failure.
#define CALL(lib, api, expr)                  \
	do {                                      \
		int rc_ = (expr);                     \
		if (rc_ != 0) {                       \
			fill(e, lib, rc_, api);           \
			return rc_;                       \
		}                                     \
	} while (0)

#define USE(ctx) CALL(1, "aclrtSetCurrentContext", f.aclrtSetCurrentContext(ctx))

int k3_init(k3_err *e) {
	CALL(1, "aclInit", f.aclInit(NULL));
	return 0;
}

int k3_device_count(uint32_t *n, k3_err *e) {
	CALL(1, "aclrtGetDeviceCount", f.aclrtGetDeviceCount(n));
	return 0;
}

int k3_context_create(void **ctx, int32_t dev, k3_err *e) {
	CALL(1, "aclrtCreateContext", f.aclrtCreateContext(ctx, dev));
	return 0;
}

int k3_context_destroy(void *ctx, k3_err *e) {
	CALL(1, "aclrtDestroyContext", f.aclrtDestroyContext(ctx));
	return 0;
}

int k3_malloc(void *ctx, void **p, size_t n, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtMalloc", f.aclrtMalloc(p, n, 0));
	return 0;
}

int k3_free(void *ctx, void *p, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtFree", f.aclrtFree(p));
	return 0;
}

int k3_malloc_host(void *ctx, void **p, size_t n, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtMallocHost", f.aclrtMallocHost(p, n));
	return 0;
}

int k3_free_host(void *ctx, void *p, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtFreeHost", f.aclrtFreeHost(p));
	return 0;
}

int k3_memcpy(void *ctx, void *dst, size_t dmax, const void *src, size_t n, int kind, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtMemcpy", f.aclrtMemcpy(dst, dmax, src, n, kind));
	return 0;
}

int k3_memcpy_async(void *ctx, void *dst, size_t dmax, const void *src, size_t n, int kind, void *s, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtMemcpyAsync", f.aclrtMemcpyAsync(dst, dmax, src, n, kind, s));
	return 0;
}

int k3_memset_async(void *ctx, void *dst, size_t dmax, int32_t value, size_t n, void *s, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtMemsetAsync", f.aclrtMemsetAsync(dst, dmax, value, n, s));
	return 0;
}

int k3_stream_create(void *ctx, void **s, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtCreateStream", f.aclrtCreateStream(s));
	return 0;
}

int k3_stream_sync(void *ctx, void *s, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtSynchronizeStream", f.aclrtSynchronizeStream(s));
	return 0;
}

int k3_stream_destroy(void *ctx, void *s, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtDestroyStream", f.aclrtDestroyStream(s));
	return 0;
}

int k3_event_create(void *ctx, void **ev, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtCreateEvent", f.aclrtCreateEvent(ev));
	return 0;
}

int k3_event_record(void *ctx, void *ev, void *s, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtRecordEvent", f.aclrtRecordEvent(ev, s));
	return 0;
}

int k3_stream_wait(void *ctx, void *s, void *ev, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtStreamWaitEvent", f.aclrtStreamWaitEvent(s, ev));
	return 0;
}

int k3_event_sync(void *ctx, void *ev, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtSynchronizeEvent", f.aclrtSynchronizeEvent(ev));
	return 0;
}

int k3_event_elapsed(void *ctx, float *ms, void *start, void *end, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtEventElapsedTime", f.aclrtEventElapsedTime(ms, start, end));
	return 0;
}

int k3_event_destroy(void *ctx, void *ev, k3_err *e) {
	USE(ctx);
	CALL(1, "aclrtDestroyEvent", f.aclrtDestroyEvent(ev));
	return 0;
}

int k3_capture_begin(void *ctx, void *s, int mode, k3_err *e) {
	USE(ctx);
	CALL(1, "aclmdlRICaptureBegin", f.aclmdlRICaptureBegin(s, mode));
	return 0;
}

int k3_capture_end(void *ctx, void *s, void **graph, k3_err *e) {
	USE(ctx);
	CALL(1, "aclmdlRICaptureEnd", f.aclmdlRICaptureEnd(s, graph));
	return 0;
}

int k3_graph_replay(void *ctx, void *graph, void *s, k3_err *e) {
	USE(ctx);
	CALL(1, "aclmdlRIExecuteAsync", f.aclmdlRIExecuteAsync(graph, s));
	return 0;
}

int k3_graph_destroy(void *ctx, void *graph, k3_err *e) {
	USE(ctx);
	CALL(1, "aclmdlRIDestroy", f.aclmdlRIDestroy(graph));
	return 0;
}

void *k3_tensor_create(void *ctx, const int64_t *dims, uint64_t nd, int dtype, const int64_t *strides,
	int64_t offset, int format, const int64_t *sdims, uint64_t nsd, void *data, k3_err *e) {
	int rc = f.aclrtSetCurrentContext(ctx);
	if (rc != 0) {
		fill(e, 1, rc, "aclrtSetCurrentContext");
		return NULL;
	}
	void *t = f.aclCreateTensor(dims, nd, dtype, strides, offset, format, sdims, nsd, data);
	if (t == NULL) {
		// aclCreateTensor reports failure by a null handle.
		fill(e, 2, 161002, "aclCreateTensor");
	}
	return t;
}

int k3_tensor_destroy(void *ctx, void *t, k3_err *e) {
	USE(ctx);
	CALL(2, "aclDestroyTensor", f.aclDestroyTensor(t));
	return 0;
}

int k3_executor_repeatable(void *ctx, void *exec, k3_err *e) {
	USE(ctx);
	CALL(2, "aclSetAclOpExecutorRepeatable", f.aclSetAclOpExecutorRepeatable(exec));
	return 0;
}

int k3_executor_destroy(void *ctx, void *exec, k3_err *e) {
	USE(ctx);
	CALL(2, "aclDestroyAclOpExecutor", f.aclDestroyAclOpExecutor(exec));
	return 0;
}

typedef int (*phase2)(void *, uint64_t, void *, void *);

int k3_op_launch(void *ctx, void *fn, const char *api, void *ws, uint64_t wsSize, void *exec, void *s, k3_err *e) {
	USE(ctx);
	CALL(2, api, ((phase2)fn)(ws, wsSize, exec, s));
	return 0;
}

void *k3_int_array_create(void *ctx, const int64_t *v, uint64_t n, k3_err *e) {
	int rc = f.aclrtSetCurrentContext(ctx);
	if (rc != 0) {
		fill(e, 1, rc, "aclrtSetCurrentContext");
		return NULL;
	}
	void *a = f.aclCreateIntArray(v, n);
	if (a == NULL) fill(e, 2, 161002, "aclCreateIntArray");
	return a;
}

int k3_int_array_destroy(void *ctx, void *a, k3_err *e) {
	USE(ctx);
	CALL(2, "aclDestroyIntArray", f.aclDestroyIntArray(a));
	return 0;
}

int k3_layernorm_prepare(void *ctx, void *fn, void *x, void *shape, void *w, void *b, double eps, void *out, void *mean,
	void *rstd, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, void *, void *, double, void *, void *, void *, uint64_t *, void **);
	CALL(2, "aclnnLayerNormGetWorkspaceSize", ((p1)fn)(x, shape, w, b, eps, out, mean, rstd, ws, exec));
	return 0;
}

int k3_prepare_t(void *ctx, void *fn, const char *api, void *a, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, uint64_t *, void **);
	CALL(2, api, ((p1)fn)(a, ws, exec));
	return 0;
}

int k3_weight_size(void *ctx, void *fn, const int64_t *dims, uint64_t nd, int dtype, uint64_t *elems, k3_err *e) {
	USE(ctx);
	void *arr = f.aclCreateIntArray(dims, nd);
	if (arr == NULL) {
		fill(e, 2, 161002, "aclCreateIntArray");
		return 161002;
	}
	typedef int (*calc)(void *, int, uint64_t *);
	int rc = ((calc)fn)(arr, dtype, elems);
	f.aclDestroyIntArray(arr);
	if (rc != 0) {
		fill(e, 2, rc, "aclnnCalculateMatmulWeightSizeV2");
		return rc;
	}
	return 0;
}

void *k3_scalar_create(void *ctx, void *value, int dtype, k3_err *e) {
	int rc = f.aclrtSetCurrentContext(ctx);
	if (rc != 0) {
		fill(e, 1, rc, "aclrtSetCurrentContext");
		return NULL;
	}
	void *sc = f.aclCreateScalar(value, dtype);
	if (sc == NULL) fill(e, 2, 161002, "aclCreateScalar");
	return sc;
}

int k3_scalar_destroy(void *ctx, void *sc, k3_err *e) {
	USE(ctx);
	CALL(2, "aclDestroyScalar", f.aclDestroyScalar(sc));
	return 0;
}

int k3_prepare_ts(void *ctx, void *fn, const char *api, void *a, void *sc, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, uint64_t *, void **);
	CALL(2, api, ((p1)fn)(a, sc, ws, exec));
	return 0;
}

int k3_prepare_tt(void *ctx, void *fn, const char *api, void *a, void *out, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, uint64_t *, void **);
	CALL(2, api, ((p1)fn)(a, out, ws, exec));
	return 0;
}

int k3_prepare_ttt(void *ctx, void *fn, const char *api, void *a, void *b, void *out, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, void *, uint64_t *, void **);
	CALL(2, api, ((p1)fn)(a, b, out, ws, exec));
	return 0;
}

int k3_prepare_ttt_i8(void *ctx, void *fn, const char *api, void *a, void *b, void *out, int8_t i, uint64_t *ws,
	void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, void *, int8_t, uint64_t *, void **);
	CALL(2, api, ((p1)fn)(a, b, out, i, ws, exec));
	return 0;
}

int k3_prepare_ttst(void *ctx, void *fn, const char *api, void *a, void *b, void *sc, void *out, uint64_t *ws,
	void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, void *, void *, uint64_t *, void **);
	CALL(2, api, ((p1)fn)(a, b, sc, out, ws, exec));
	return 0;
}

int k3_prepare_tsst(void *ctx, void *fn, const char *api, void *a, void *s1, void *s2, void *out, uint64_t *ws,
	void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, void *, void *, uint64_t *, void **);
	CALL(2, api, ((p1)fn)(a, s1, s2, out, ws, exec));
	return 0;
}

int k3_prepare_tst(void *ctx, void *fn, const char *api, void *a, void *sc, void *out, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, void *, uint64_t *, void **);
	CALL(2, api, ((p1)fn)(a, sc, out, ws, exec));
	return 0;
}

int k3_rgdr_prepare(void *ctx, void *fn, void *q, void *k, void *v, void *beta, void *state, void *seqLens, void *stateIdx,
	void *g, void *gk, void *accepted, float scale, void *out, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, float, void *,
		uint64_t *, void **);
	CALL(2, "aclnnRecurrentGatedDeltaRuleGetWorkspaceSize",
		((p1)fn)(q, k, v, beta, state, seqLens, stateIdx, g, gk, accepted, scale, out, ws, exec));
	return 0;
}

int k3_prepare_tltt(void *ctx, void *fn, const char *api, void *a, int64_t l, void *b, void *out, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, int64_t, void *, void *, uint64_t *, void **);
	CALL(2, api, ((p1)fn)(a, l, b, out, ws, exec));
	return 0;
}

int k3_prepare_tltst(void *ctx, void *fn, const char *api, void *a, int64_t l, void *b, void *c, void *sc, void *out, uint64_t *ws,
	void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, int64_t, void *, void *, void *, void *, uint64_t *, void **);
	CALL(2, api, ((p1)fn)(a, l, b, c, sc, out, ws, exec));
	return 0;
}

int k3_moe_gating_prepare(void *ctx, void *fn, void *x, void *bias, int64_t k, int64_t kGroup, int64_t groupCount,
	int64_t groupSelectMode, int64_t renorm, int64_t normType, int outFlag, double factor, double eps, void *y, void *idx,
	void *out, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, _Bool, double, double, void *,
		void *, void *, uint64_t *, void **);
	CALL(2, "aclnnMoeGatingTopKGetWorkspaceSize",
		((p1)fn)(x, bias, k, kGroup, groupCount, groupSelectMode, renorm, normType, outFlag != 0, factor, eps, y, idx, out, ws, exec));
	return 0;
}

// The fused DSA operators, with the argument order op-plugin passes them
// (scalar C types inferred from it: char* layouts, int64 attributes,
// double scale, bool flags).
int k3_lightning_indexer_prepare(void *ctx, void *fn, void *q, void *k, void *w, void *actSeqQ, void *actSeqK, void *blockTable,
	const char *layoutQ, const char *layoutK, int64_t sparseCount, int64_t sparseMode, int64_t preTokens, int64_t nextTokens,
	int returnValue, void *indices, void *values, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, void *, void *, void *, void *, const char *, const char *, int64_t, int64_t, int64_t,
		int64_t, _Bool, void *, void *, uint64_t *, void **);
	CALL(2, "aclnnLightningIndexerGetWorkspaceSize",
		((p1)fn)(q, k, w, actSeqQ, actSeqK, blockTable, layoutQ, layoutK, sparseCount, sparseMode, preTokens, nextTokens,
			returnValue != 0, indices, values, ws, exec));
	return 0;
}

int k3_sfa_prepare(void *ctx, void *fn, void *q, void *k, void *v, void *indices, void *blockTable, void *actSeqQ, void *actSeqKV,
	void *qRope, void *kRope, double scale, int64_t sparseBlockSize, const char *layoutQ, const char *layoutKV, int64_t sparseMode,
	int64_t preTokens, int64_t nextTokens, int64_t attentionMode, int returnLse, void *out, void *softmaxMax, void *softmaxSum,
	uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, void *, void *, void *, void *, void *, void *, void *, double, int64_t, const char *,
		const char *, int64_t, int64_t, int64_t, int64_t, _Bool, void *, void *, void *, uint64_t *, void **);
	CALL(2, "aclnnSparseFlashAttentionGetWorkspaceSize",
		((p1)fn)(q, k, v, indices, blockTable, actSeqQ, actSeqKV, qRope, kRope, scale, sparseBlockSize, layoutQ, layoutKV,
			sparseMode, preTokens, nextTokens, attentionMode, returnLse != 0, out, softmaxMax, softmaxSum, ws, exec));
	return 0;
}

int k3_prepare_tabt(void *ctx, void *fn, const char *api, void *a, void *arr, int flag, void *out, uint64_t *ws, void **exec,
	k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, _Bool, void *, uint64_t *, void **);
	CALL(2, api, ((p1)fn)(a, arr, flag != 0, out, ws, exec));
	return 0;
}

int k3_topk_prepare(void *ctx, void *fn, void *x, int64_t k, int64_t dim, int largest, int sorted, void *values, void *indices,
	uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, int64_t, int64_t, _Bool, _Bool, void *, void *, uint64_t *, void **);
	CALL(2, "aclnnTopkGetWorkspaceSize", ((p1)fn)(x, k, dim, largest != 0, sorted != 0, values, indices, ws, exec));
	return 0;
}

int k3_prepare_tit(void *ctx, void *fn, const char *api, void *a, int i, void *out, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, int, void *, uint64_t *, void **);
	CALL(2, api, ((p1)fn)(a, i, out, ws, exec));
	return 0;
}

int k3_rmsnorm_prepare(void *ctx, void *fn, void *x, void *gamma, double eps, void *y, void *rstd,
	uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, double, void *, void *, uint64_t *, void **);
	CALL(2, "aclnnRmsNormGetWorkspaceSize", ((p1)fn)(x, gamma, eps, y, rstd, ws, exec));
	return 0;
}

// ---- HCCL. Counts are elements; k3 moves FP32 (HcclDataType 4) and sums
// (HcclReduceOp 0).

enum { HCCL_FP32 = 4, HCCL_SUM = 0 };

static struct {
	int (*HcclGetRootInfo)(void *);
	int (*HcclCommInitRootInfo)(uint32_t, const void *, uint32_t, void **);
	int (*HcclCommDestroy)(void *);
	int (*HcclAllReduce)(void *, void *, uint64_t, int, int, void *, void *);
	int (*HcclAllGather)(void *, void *, uint64_t, int, void *, void *);
	int (*HcclReduceScatter)(void *, void *, uint64_t, int, int, void *, void *);
	int (*HcclAlltoAllV)(const void *, const uint64_t *, const uint64_t *, int, void *, const uint64_t *,
		const uint64_t *, int, void *, void *);
	int (*HcclSend)(void *, uint64_t, int, uint32_t, void *, void *);
	int (*HcclRecv)(void *, uint64_t, int, uint32_t, void *, void *);
	int (*HcclBarrier)(void *, void *);
	const char *(*HcclGetErrorString)(int);
} h;

static const char *hccl_names[] = {
	"HcclGetRootInfo", "HcclCommInitRootInfo", "HcclCommDestroy", "HcclAllReduce", "HcclAllGather",
	"HcclReduceScatter", "HcclAlltoAllV", "HcclSend", "HcclRecv", "HcclBarrier", "HcclGetErrorString",
};

int k3_bind_hccl(void *hccl, char *missing, size_t n) {
	__typeof__(h) t;
	void **slot = (void **)&t;
	size_t nh = sizeof hccl_names / sizeof hccl_names[0];
	if (nh != sizeof t / sizeof(void *)) {
		snprintf(missing, n, "shim table mismatch");
		return -1;
	}
	for (size_t i = 0; i < nh; i++) {
		void *p = dlsym(hccl, hccl_names[i]);
		if (p == NULL) {
			snprintf(missing, n, "%s", hccl_names[i]);
			return -1;
		}
		slot[i] = p;
	}
	h = t;
	return 0;
}

// hfill reports an HCCL failure: its error string and the runtime's
// recent message.
static void hfill(k3_err *e, int code, const char *api) {
	e->lib = 3;
	e->code = code;
	snprintf(e->api, sizeof e->api, "%s", api);
	const char *s = h.HcclGetErrorString ? h.HcclGetErrorString(code) : NULL;
	const char *m = f.aclGetRecentErrMsg ? f.aclGetRecentErrMsg() : NULL;
	snprintf(e->msg, sizeof e->msg, "%s%s%s", s ? s : "", m && *m ? ": " : "", m ? m : "");
}

#define HCALL(api, expr)              \
	do {                              \
		int rc_ = (expr);             \
		if (rc_ != 0) {               \
			hfill(e, rc_, api);       \
			return rc_;               \
		}                             \
	} while (0)

int k3_hccl_root_info(void *ctx, void *root, k3_err *e) {
	USE(ctx);
	HCALL("HcclGetRootInfo", h.HcclGetRootInfo(root));
	return 0;
}

int k3_hccl_init(void *ctx, uint32_t n, const void *root, uint32_t rank, void **comm, k3_err *e) {
	USE(ctx);
	HCALL("HcclCommInitRootInfo", h.HcclCommInitRootInfo(n, root, rank, comm));
	return 0;
}

int k3_hccl_destroy(void *ctx, void *comm, k3_err *e) {
	USE(ctx);
	HCALL("HcclCommDestroy", h.HcclCommDestroy(comm));
	return 0;
}

int k3_hccl_all_reduce(void *ctx, void *send, void *recv, uint64_t count, void *comm, void *s, k3_err *e) {
	USE(ctx);
	HCALL("HcclAllReduce", h.HcclAllReduce(send, recv, count, HCCL_FP32, HCCL_SUM, comm, s));
	return 0;
}

int k3_hccl_all_gather(void *ctx, void *send, void *recv, uint64_t count, void *comm, void *s, k3_err *e) {
	USE(ctx);
	HCALL("HcclAllGather", h.HcclAllGather(send, recv, count, HCCL_FP32, comm, s));
	return 0;
}

int k3_hccl_reduce_scatter(void *ctx, void *send, void *recv, uint64_t count, void *comm, void *s, k3_err *e) {
	USE(ctx);
	HCALL("HcclReduceScatter", h.HcclReduceScatter(send, recv, count, HCCL_FP32, HCCL_SUM, comm, s));
	return 0;
}

int k3_hccl_all_to_all_v(void *ctx, void *send, const uint64_t *scounts, const uint64_t *sdispls, void *recv,
	const uint64_t *rcounts, const uint64_t *rdispls, void *comm, void *s, k3_err *e) {
	USE(ctx);
	HCALL("HcclAlltoAllV", h.HcclAlltoAllV(send, scounts, sdispls, HCCL_FP32, recv, rcounts, rdispls, HCCL_FP32, comm, s));
	return 0;
}

int k3_hccl_send(void *ctx, void *buf, uint64_t count, uint32_t peer, void *comm, void *s, k3_err *e) {
	USE(ctx);
	HCALL("HcclSend", h.HcclSend(buf, count, HCCL_FP32, peer, comm, s));
	return 0;
}

int k3_hccl_recv(void *ctx, void *buf, uint64_t count, uint32_t peer, void *comm, void *s, k3_err *e) {
	USE(ctx);
	HCALL("HcclRecv", h.HcclRecv(buf, count, HCCL_FP32, peer, comm, s));
	return 0;
}

int k3_hccl_barrier(void *ctx, void *comm, void *s, k3_err *e) {
	USE(ctx);
	HCALL("HcclBarrier", h.HcclBarrier(comm, s));
	return 0;
}

void *k3_tensor_list_create(void *ctx, void **ts, uint64_t n, k3_err *e) {
	int rc = f.aclrtSetCurrentContext(ctx);
	if (rc != 0) {
		fill(e, 1, rc, "aclrtSetCurrentContext");
		return NULL;
	}
	void *l = f.aclCreateTensorList((const void *const *)ts, n);
	if (l == NULL) fill(e, 2, 161002, "aclCreateTensorList");
	return l;
}

int k3_tensor_list_destroy(void *ctx, void *l, k3_err *e) {
	USE(ctx);
	CALL(2, "aclDestroyTensorList", f.aclDestroyTensorList(l));
	return 0;
}

int k3_moe_init_routing_prepare(void *ctx, void *fn, void *x, void *idx, int64_t activeNum, int64_t capacity,
	int64_t expertNum, int64_t dropPadMode, int64_t countFlag, int beforeFlag, void *expandedX, void *rowIdx, void *counts,
	void *before, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, int64_t, int64_t, int64_t, int64_t, int64_t, _Bool, void *, void *, void *, void *,
		uint64_t *, void **);
	CALL(2, "aclnnMoeInitRoutingV2GetWorkspaceSize",
		((p1)fn)(x, idx, activeNum, capacity, expertNum, dropPadMode, countFlag, beforeFlag != 0, expandedX, rowIdx, counts,
			before, ws, exec));
	return 0;
}

int k3_gmm_prepare(void *ctx, void *fn, void *x, void *w, void *groupList, int64_t splitItem, int64_t groupType,
	int64_t groupListType, int64_t actType, void *out, uint64_t *ws, void **exec, k3_err *e) {
	USE(ctx);
	typedef int (*p1)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *,
		int64_t, int64_t, int64_t, int64_t, void *, void *, void *, uint64_t *, void **);
	CALL(2, "aclnnGroupedMatmulV4GetWorkspaceSize",
		((p1)fn)(x, w, NULL, NULL, NULL, NULL, NULL, NULL, groupList, NULL, NULL, NULL, splitItem, groupType, groupListType,
			actType, out, NULL, NULL, ws, exec));
	return 0;
}
