//go:build ascend && cgo

// The shim between Go and CANN. The C declarations of the CANN functions
// it calls are written here from the documented API; no CANN header is
// included, and every function is reached through a pointer filled in by
// dlsym at load.
#ifndef K3_ACL_SHIM_H
#define K3_ACL_SHIM_H

#include <stddef.h>
#include <stdint.h>

// k3_err carries a failure out of one shim call: the C function that
// failed, its code and the recent error message, read before any other
// call can overwrite it.
typedef struct {
	int lib; // 1 ACL, 2 aclnn, 3 HCCL
	int code;
	char api[64];
	char msg[512];
} k3_err;

// Loading.
void *k3_dlopen(const char *path, int global, char *errbuf, size_t n);
int k3_bind_runtime(void *acl, void *nnopbase, char *missing, size_t n);
void *k3_dlsym(void *h, const char *name);
void k3_dlclose(void *h);

// Runtime. Every call taking ctx makes it current on this thread first.
int k3_init(k3_err *e);
int k3_device_count(uint32_t *n, k3_err *e);
int k3_context_create(void **ctx, int32_t dev, k3_err *e);
int k3_context_destroy(void *ctx, k3_err *e);
int k3_malloc(void *ctx, void **p, size_t n, k3_err *e);
int k3_free(void *ctx, void *p, k3_err *e);
int k3_malloc_host(void *ctx, void **p, size_t n, k3_err *e);
int k3_free_host(void *ctx, void *p, k3_err *e);
int k3_memcpy(void *ctx, void *dst, size_t dmax, const void *src, size_t n, int kind, k3_err *e);
int k3_memcpy_async(void *ctx, void *dst, size_t dmax, const void *src, size_t n, int kind, void *s, k3_err *e);
int k3_memset_async(void *ctx, void *dst, size_t dmax, int32_t value, size_t n, void *s, k3_err *e);
int k3_stream_create(void *ctx, void **s, k3_err *e);
int k3_stream_sync(void *ctx, void *s, k3_err *e);
int k3_stream_destroy(void *ctx, void *s, k3_err *e);
int k3_event_create(void *ctx, void **ev, k3_err *e);
int k3_event_record(void *ctx, void *ev, void *s, k3_err *e);
int k3_stream_wait(void *ctx, void *s, void *ev, k3_err *e);
int k3_event_sync(void *ctx, void *ev, k3_err *e);
int k3_event_elapsed(void *ctx, float *ms, void *start, void *end, k3_err *e);
int k3_event_destroy(void *ctx, void *ev, k3_err *e);
int k3_capture_begin(void *ctx, void *s, int mode, k3_err *e);
int k3_capture_end(void *ctx, void *s, void **graph, k3_err *e);
int k3_graph_replay(void *ctx, void *graph, void *s, k3_err *e);
int k3_graph_destroy(void *ctx, void *graph, k3_err *e);

// aclnn.
void *k3_tensor_create(void *ctx, const int64_t *dims, uint64_t nd, int dtype, const int64_t *strides,
	int64_t offset, int format, const int64_t *sdims, uint64_t nsd, void *data, k3_err *e);
int k3_tensor_destroy(void *ctx, void *t, k3_err *e);
int k3_executor_repeatable(void *ctx, void *exec, k3_err *e);
int k3_executor_destroy(void *ctx, void *exec, k3_err *e);
int k3_op_launch(void *ctx, void *fn, const char *api, void *ws, uint64_t wsSize, void *exec, void *s, k3_err *e);

void *k3_int_array_create(void *ctx, const int64_t *v, uint64_t n, k3_err *e);
int k3_int_array_destroy(void *ctx, void *a, k3_err *e);
int k3_layernorm_prepare(void *ctx, void *fn, void *x, void *shape, void *w, void *b, double eps, void *out, void *mean,
	void *rstd, uint64_t *ws, void **exec, k3_err *e);
int k3_prepare_t(void *ctx, void *fn, const char *api, void *a, uint64_t *ws, void **exec, k3_err *e);
int k3_weight_size(void *ctx, void *fn, const int64_t *dims, uint64_t nd, int dtype, uint64_t *elems, k3_err *e);
void *k3_scalar_create(void *ctx, void *value, int dtype, k3_err *e);
int k3_scalar_destroy(void *ctx, void *sc, k3_err *e);

// Phase 1 of the operators, by argument pattern (t: aclTensor*, s:
// aclScalar*), each called through the pointer Load found (custom library
// first); api names it in errors.
int k3_prepare_ts(void *ctx, void *fn, const char *api, void *a, void *sc, uint64_t *ws, void **exec, k3_err *e);
int k3_prepare_tt(void *ctx, void *fn, const char *api, void *a, void *out, uint64_t *ws, void **exec, k3_err *e);
int k3_prepare_ttt(void *ctx, void *fn, const char *api, void *a, void *b, void *out, uint64_t *ws, void **exec, k3_err *e);
int k3_prepare_ttt_i8(void *ctx, void *fn, const char *api, void *a, void *b, void *out, int8_t i, uint64_t *ws,
	void **exec, k3_err *e);
int k3_prepare_ttst(void *ctx, void *fn, const char *api, void *a, void *b, void *sc, void *out, uint64_t *ws,
	void **exec, k3_err *e);
int k3_prepare_tsst(void *ctx, void *fn, const char *api, void *a, void *s1, void *s2, void *out, uint64_t *ws,
	void **exec, k3_err *e);
int k3_prepare_tit(void *ctx, void *fn, const char *api, void *a, int i, void *out, uint64_t *ws, void **exec, k3_err *e);
int k3_prepare_tst(void *ctx, void *fn, const char *api, void *a, void *sc, void *out, uint64_t *ws, void **exec, k3_err *e);
int k3_rgdr_prepare(void *ctx, void *fn, void *q, void *k, void *v, void *beta, void *state, void *seqLens, void *stateIdx,
	void *g, void *gk, void *accepted, float scale, void *out, uint64_t *ws, void **exec, k3_err *e);
int k3_prepare_tltt(void *ctx, void *fn, const char *api, void *a, int64_t l, void *b, void *out, uint64_t *ws, void **exec, k3_err *e);
int k3_prepare_tltst(void *ctx, void *fn, const char *api, void *a, int64_t l, void *b, void *c, void *sc, void *out, uint64_t *ws,
	void **exec, k3_err *e);
int k3_lightning_indexer_prepare(void *ctx, void *fn, void *q, void *k, void *w, void *actSeqQ, void *actSeqK, void *blockTable,
	const char *layoutQ, const char *layoutK, int64_t sparseCount, int64_t sparseMode, int64_t preTokens, int64_t nextTokens,
	int returnValue, void *indices, void *values, uint64_t *ws, void **exec, k3_err *e);
int k3_sfa_prepare(void *ctx, void *fn, void *q, void *k, void *v, void *indices, void *blockTable, void *actSeqQ, void *actSeqKV,
	void *qRope, void *kRope, double scale, int64_t sparseBlockSize, const char *layoutQ, const char *layoutKV, int64_t sparseMode,
	int64_t preTokens, int64_t nextTokens, int64_t attentionMode, int returnLse, void *out, void *softmaxMax, void *softmaxSum,
	uint64_t *ws, void **exec, k3_err *e);
int k3_moe_gating_prepare(void *ctx, void *fn, void *x, void *bias, int64_t k, int64_t kGroup, int64_t groupCount,
	int64_t groupSelectMode, int64_t renorm, int64_t normType, int outFlag, double factor, double eps, void *y, void *idx,
	void *out, uint64_t *ws, void **exec, k3_err *e);
int k3_prepare_tabt(void *ctx, void *fn, const char *api, void *a, void *arr, int flag, void *out, uint64_t *ws, void **exec,
	k3_err *e);
int k3_topk_prepare(void *ctx, void *fn, void *x, int64_t k, int64_t dim, int largest, int sorted, void *values, void *indices,
	uint64_t *ws, void **exec, k3_err *e);
void *k3_tensor_list_create(void *ctx, void **ts, uint64_t n, k3_err *e);
int k3_tensor_list_destroy(void *ctx, void *l, k3_err *e);
int k3_moe_init_routing_prepare(void *ctx, void *fn, void *x, void *idx, int64_t activeNum, int64_t capacity,
	int64_t expertNum, int64_t dropPadMode, int64_t countFlag, int beforeFlag, void *expandedX, void *rowIdx, void *counts,
	void *before, uint64_t *ws, void **exec, k3_err *e);
int k3_gmm_prepare(void *ctx, void *fn, void *x, void *w, void *groupList, int64_t splitItem, int64_t groupType,
	int64_t groupListType, int64_t actType, void *out, uint64_t *ws, void **exec, k3_err *e);
int k3_rmsnorm_prepare(void *ctx, void *fn, void *x, void *gamma, double eps, void *y, void *rstd,
	uint64_t *ws, void **exec, k3_err *e);

// HCCL.
int k3_bind_hccl(void *hccl, char *missing, size_t n);
int k3_hccl_root_info(void *ctx, void *root, k3_err *e);
int k3_hccl_init(void *ctx, uint32_t n, const void *root, uint32_t rank, void **comm, k3_err *e);
int k3_hccl_destroy(void *ctx, void *comm, k3_err *e);
int k3_hccl_all_reduce(void *ctx, void *send, void *recv, uint64_t count, void *comm, void *s, k3_err *e);
int k3_hccl_all_gather(void *ctx, void *send, void *recv, uint64_t count, void *comm, void *s, k3_err *e);
int k3_hccl_reduce_scatter(void *ctx, void *send, void *recv, uint64_t count, void *comm, void *s, k3_err *e);
int k3_hccl_all_to_all_v(void *ctx, void *send, const uint64_t *scounts, const uint64_t *sdispls, void *recv,
	const uint64_t *rcounts, const uint64_t *rdispls, void *comm, void *s, k3_err *e);
int k3_hccl_send(void *ctx, void *buf, uint64_t count, uint32_t peer, void *comm, void *s, k3_err *e);
int k3_hccl_recv(void *ctx, void *buf, uint64_t count, uint32_t peer, void *comm, void *s, k3_err *e);
int k3_hccl_barrier(void *ctx, void *comm, void *s, k3_err *e);

#endif
