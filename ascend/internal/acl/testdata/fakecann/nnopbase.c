// The fake libnnopbase: tensor descriptors and operator executors.
#include <stdlib.h>
#include <string.h>

#include "fake.h"

#define TENSOR_MAGIC 0x74656e31u
#define EXEC_MAGIC 0x65786531u

void fk_lock(void);
void fk_unlock(void);

static int elemsize(int dtype) {
	switch (dtype) {
	case 0: case 3: return 4;  // FLOAT, INT32
	case 1: case 27: return 2; // FLOAT16, BF16
	case 9: return 8;          // INT64
	}
	return 0;
}

void *aclCreateTensor(const int64_t *dims, uint64_t nd, int dtype, const int64_t *strides, int64_t offset,
	int format, const int64_t *sdims, uint64_t nsd, void *data) {
	if (fk_need_context()) return NULL;
	if (nd == 0 || nd > FK_MAXDIM || nsd == 0 || nsd > FK_MAXDIM || dims == NULL || strides == NULL || sdims == NULL) {
		fk_set_error("aclCreateTensor: %llu view and %llu storage dimensions", (unsigned long long)nd, (unsigned long long)nsd);
		return NULL;
	}
	int es = elemsize(dtype);
	if (es == 0) {
		fk_set_error("aclCreateTensor: data type %d is not supported by the fake", dtype);
		return NULL;
	}
	if (format != 2 && format != 29) {
		fk_set_error("aclCreateTensor: format %d", format);
		return NULL;
	}
	int64_t storage = 1, reach = offset;
	for (uint64_t i = 0; i < nsd; i++) storage *= sdims[i];
	for (uint64_t i = 0; i < nd; i++) {
		if (dims[i] <= 0 || strides[i] < 0) {
			fk_set_error("aclCreateTensor: dimension %llu is %lld with stride %lld", (unsigned long long)i,
				(long long)dims[i], (long long)strides[i]);
			return NULL;
		}
		reach += (dims[i] - 1) * strides[i];
	}
	if (format == 29 && (nd < 2 || nsd != nd + 2 || offset != 0)) {
		fk_set_error("aclCreateTensor: FRACTAL_NZ view of %llu dimensions over %llu storage dimensions at offset %lld",
			(unsigned long long)nd, (unsigned long long)nsd, (long long)offset);
		return NULL;
	}
	if (format == 2 && reach >= storage) {
		fk_set_error("aclCreateTensor: the view reaches element %lld of a storage of %lld", (long long)reach, (long long)storage);
		return NULL;
	}
	if (data != NULL && !fk_is_device(data, (size_t)(storage * es))) {
		fk_set_error("aclCreateTensor: data %p (%lld bytes) is not device memory", data, (long long)(storage * es));
		return NULL;
	}
	if (((uintptr_t)data) & 31) {
		fk_set_error("aclCreateTensor: data %p is not 32-byte aligned", data);
		return NULL;
	}
	fk_tensor *t = calloc(1, sizeof *t);
	t->magic = TENSOR_MAGIC;
	t->nd = (int)nd;
	t->nsd = (int)nsd;
	t->dtype = dtype;
	t->format = format;
	memcpy(t->dims, dims, nd * sizeof *dims);
	memcpy(t->strides, strides, nd * sizeof *strides);
	memcpy(t->sdims, sdims, nsd * sizeof *sdims);
	t->offset = offset;
	t->data = data;
	return t;
}

int fk_tensor_ok(const void *p) { return p != NULL && ((const fk_tensor *)p)->magic == TENSOR_MAGIC; }

int aclDestroyTensor(const void *p) {
	if (!fk_tensor_ok(p)) {
		fk_set_error("aclDestroyTensor: not a live tensor");
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_tensor *t = (fk_tensor *)p;
	t->magic = 0;
	free(t);
	return 0;
}

#define SCALAR_MAGIC 0x73636131u

void *aclCreateScalar(void *value, int dtype) {
	if (fk_need_context()) return NULL;
	if (value == NULL || (dtype != 0 && dtype != 3 && dtype != 9)) {
		fk_set_error("aclCreateScalar: data type %d (the fake takes FLOAT, INT32, INT64)", dtype);
		return NULL;
	}
	fk_scalar *s = calloc(1, sizeof *s);
	s->magic = SCALAR_MAGIC;
	s->dtype = dtype;
	s->v = dtype == 0 ? *(float *)value : dtype == 3 ? *(int32_t *)value : (double)*(int64_t *)value;
	return s;
}

int fk_scalar_ok(const void *p) { return p != NULL && ((const fk_scalar *)p)->magic == SCALAR_MAGIC; }

int aclDestroyScalar(const void *p) {
	if (!fk_scalar_ok(p)) {
		fk_set_error("aclDestroyScalar: not a live scalar");
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_scalar *s = (fk_scalar *)p;
	s->magic = 0;
	free(s);
	return 0;
}

#define ARRAY_MAGIC 0x61727231u

typedef struct {
	uint32_t magic;
	uint64_t n;
	int64_t v[FK_MAXDIM];
} fk_int_array;

void *aclCreateIntArray(const int64_t *v, uint64_t n) {
	if (fk_need_context()) return NULL;
	if (v == NULL || n == 0 || n > FK_MAXDIM) {
		fk_set_error("aclCreateIntArray: %llu values (the fake takes 1 to %d)", (unsigned long long)n, FK_MAXDIM);
		return NULL;
	}
	fk_int_array *a = calloc(1, sizeof *a);
	a->magic = ARRAY_MAGIC;
	a->n = n;
	memcpy(a->v, v, n * sizeof *v);
	return a;
}

int fk_int_array_get(const void *p, uint64_t *n, const int64_t **v) {
	const fk_int_array *a = p;
	if (a == NULL || a->magic != ARRAY_MAGIC) return -1;
	*n = a->n;
	*v = a->v;
	return 0;
}

int aclDestroyIntArray(const void *p) {
	fk_int_array *a = (fk_int_array *)p;
	if (a == NULL || a->magic != ARRAY_MAGIC) {
		fk_set_error("aclDestroyIntArray: not a live array");
		return ACLNN_ERR_PARAM_INVALID;
	}
	a->magic = 0;
	free(a);
	return 0;
}

#define LIST_MAGIC 0x6c697374u

// A tensor list owns its tensors: aclDestroyTensorList destroys them.
typedef struct {
	uint32_t magic;
	uint64_t n;
	const void **ts;
} fk_tensor_list;

void *aclCreateTensorList(const void *const *ts, uint64_t n) {
	if (fk_need_context()) return NULL;
	if (ts == NULL || n == 0) {
		fk_set_error("aclCreateTensorList: an empty list");
		return NULL;
	}
	for (uint64_t i = 0; i < n; i++)
		if (!fk_tensor_ok(ts[i])) {
			fk_set_error("aclCreateTensorList: entry %llu is not a live tensor", (unsigned long long)i);
			return NULL;
		}
	fk_tensor_list *l = calloc(1, sizeof *l);
	l->magic = LIST_MAGIC;
	l->n = n;
	l->ts = malloc(n * sizeof *l->ts);
	memcpy(l->ts, ts, n * sizeof *l->ts);
	return l;
}

int fk_tensor_list_get(const void *p, uint64_t *n, const void *const **ts) {
	const fk_tensor_list *l = p;
	if (l == NULL || l->magic != LIST_MAGIC) return -1;
	*n = l->n;
	*ts = l->ts;
	return 0;
}

int aclDestroyTensorList(const void *p) {
	fk_tensor_list *l = (fk_tensor_list *)p;
	if (l == NULL || l->magic != LIST_MAGIC) {
		fk_set_error("aclDestroyTensorList: not a live list");
		return ACLNN_ERR_PARAM_INVALID;
	}
	for (uint64_t i = 0; i < l->n; i++) {
		int rc = aclDestroyTensor(l->ts[i]);
		if (rc) return rc;
	}
	l->magic = 0;
	free(l->ts);
	free(l);
	return 0;
}

// The live executors, so that a launch of a consumed one is caught
// instead of reading freed memory.
static fk_exec **live;
static int nlive, caplive;

fk_exec *fk_exec_new(void) {
	fk_exec *e = calloc(1, sizeof *e);
	e->magic = EXEC_MAGIC;
	fk_lock();
	if (nlive == caplive) {
		caplive = caplive ? 2 * caplive : 16;
		live = realloc(live, caplive * sizeof *live);
	}
	live[nlive++] = e;
	fk_unlock();
	return e;
}

int fk_exec_live(const fk_exec *e) {
	fk_lock();
	int ok = 0;
	for (int i = 0; i < nlive && !ok; i++) ok = live[i] == e;
	fk_unlock();
	return ok;
}

void fk_exec_free(fk_exec *e) {
	fk_lock();
	for (int i = 0; i < nlive; i++) {
		if (live[i] == e) {
			live[i] = live[--nlive];
			break;
		}
	}
	fk_unlock();
	e->magic = 0;
	free(e);
}

int aclSetAclOpExecutorRepeatable(void *p) {
	fk_exec *e = p;
	if (!fk_exec_live(e)) {
		fk_set_error("aclSetAclOpExecutorRepeatable: not a live executor");
		return ACLNN_ERR_PARAM_INVALID;
	}
	e->repeatable = 1;
	return 0;
}

int aclDestroyAclOpExecutor(void *p) {
	fk_exec *e = p;
	if (!fk_exec_live(e)) {
		fk_set_error("aclDestroyAclOpExecutor: not a live executor");
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec_free(e);
	return 0;
}

// A launched operator: a copy of its executor, so that the executor may
// be freed (or launched again) while the stream has not yet run it.
typedef struct {
	fk_task t;
	fk_exec e;
	void *ws;
} op_task;

static int run_op(fk_task *t) {
	op_task *o = (op_task *)t;
	return o->e.run(&o->e, o->ws);
}

static void release_op(fk_task *t) { free(t); }

int fk_launch(const char *op, void *ws, uint64_t wsSize, fk_exec *e, void *stream) {
	int rc = fk_need_context();
	if (rc) return rc;
	if (!fk_exec_live(e)) {
		fk_set_error("%s: the executor is not live (a non-repeatable executor runs once)", op);
		return ACLNN_ERR_PARAM_INVALID;
	}
	if (wsSize < e->ws || (e->ws > 0 && !fk_is_device(ws, e->ws))) {
		fk_set_error("%s: workspace %p of %llu bytes, phase 1 asked for %llu bytes of device memory", op, ws,
			(unsigned long long)wsSize, (unsigned long long)e->ws);
		return ACLNN_ERR_PARAM_INVALID;
	}
	op_task *o = calloc(1, sizeof *o);
	o->t.run = run_op;
	o->t.release = release_op;
	o->t.refs = 1;
	o->e = *e;
	o->ws = ws;
	rc = fk_enqueue(stream, &o->t);
	if (--o->t.refs == 0) free(o);
	if (!e->repeatable) fk_exec_free(e);
	return rc;
}

static float bf16(uint16_t h) {
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t tobf16(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

// nz_index maps element i of a FRACTAL_NZ tensor's contiguous [..., R, C]
// view to its place in the storage [..., C1, R1, 16, 16].
static int64_t nz_index(const fk_tensor *t, int64_t i) {
	int64_t R = t->dims[t->nd - 2], C = t->dims[t->nd - 1];
	int64_t C1 = t->sdims[t->nsd - 4], R1 = t->sdims[t->nsd - 3];
	int64_t b = i / (R * C), r = i % (R * C) / C, c = i % C;
	return (((b * C1 + c / 16) * R1 + r / 16) * 16 + r % 16) * 16 + c % 16;
}

double fk_get(const fk_tensor *t, int64_t i) {
	if (t->format == 29) i = nz_index(t, i);
	switch (t->dtype) {
	case 0: return ((const float *)t->data)[i];
	case 27: return bf16(((const uint16_t *)t->data)[i]);
	case 3: return ((const int32_t *)t->data)[i];
	case 9: return (double)((const int64_t *)t->data)[i];
	}
	return 0;
}

void fk_put(const fk_tensor *t, int64_t i, double v) {
	if (t->format == 29) i = nz_index(t, i);
	switch (t->dtype) {
	case 0: ((float *)t->data)[i] = (float)v; break;
	case 27: ((uint16_t *)t->data)[i] = tobf16((float)v); break;
	case 3: ((int32_t *)t->data)[i] = (int32_t)v; break;
	case 9: ((int64_t *)t->data)[i] = (int64_t)v; break;
	}
}
