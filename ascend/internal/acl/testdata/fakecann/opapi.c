// The fake operator library: aclnnMatmul and aclnnRmsNorm with aclnn's
// two-phase protocol, computed on the host.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fake.h"

static int check_tensors(const char *op, int n, void **ts) {
	for (int i = 0; i < n; i++) {
		if (!fk_tensor_ok(ts[i])) {
			fk_set_error("%s: operand %d is not a live tensor", op, i);
			return ACLNN_ERR_PARAM_NULLPTR;
		}
		const fk_tensor *t = ts[i];
		if (t->dtype != 0 && t->dtype != 27) {
			fk_set_error("%s: operand %d has data type %d (the fake takes FLOAT and BF16)", op, i, t->dtype);
			return ACLNN_ERR_PARAM_INVALID;
		}
		if (t->format != 2) {
			fk_set_error("%s: operand %d has format %d (the fake takes ND)", op, i, t->format);
			return ACLNN_ERR_PARAM_INVALID;
		}
	}
	return 0;
}

// ---- Matmul: out[M,N] = self[M,K] · mat2[K,N], any strides.

static int run_matmul(fk_exec *e, void *ws) {
	const fk_tensor *x = &e->t[0], *w = &e->t[1], *o = &e->t[2];
	int64_t M = x->dims[0], K = x->dims[1], N = w->dims[1];
	float *acc = ws; // one output row, in the workspace phase 1 asked for
	for (int64_t m = 0; m < M; m++) {
		for (int64_t n = 0; n < N; n++) {
			double s = 0;
			for (int64_t k = 0; k < K; k++)
				s += fk_get(x, x->offset + m * x->strides[0] + k * x->strides[1]) *
					fk_get(w, w->offset + k * w->strides[0] + n * w->strides[1]);
			acc[n] = (float)s;
		}
		for (int64_t n = 0; n < N; n++) fk_put(o, o->offset + m * o->strides[0] + n * o->strides[1], acc[n]);
	}
	return 0;
}

int aclnnMatmulGetWorkspaceSize(void *self, void *mat2, void *out, int8_t cubeMathType, uint64_t *ws, void **exec) {
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[3] = {self, mat2, out};
	if ((rc = check_tensors("aclnnMatmul", 3, ts))) return rc;
	const fk_tensor *x = self, *w = mat2, *o = out;
	if (x->nd != 2 || w->nd != 2 || o->nd != 2 || x->dims[1] != w->dims[0] || o->dims[0] != x->dims[0] ||
		o->dims[1] != w->dims[1]) {
		fk_set_error("aclnnMatmul: shapes [%lld,%lld] x [%lld,%lld] -> [%lld,%lld] (the fake takes 2-D operands)",
			(long long)x->dims[0], (long long)(x->nd > 1 ? x->dims[1] : 0), (long long)w->dims[0],
			(long long)(w->nd > 1 ? w->dims[1] : 0), (long long)o->dims[0], (long long)(o->nd > 1 ? o->dims[1] : 0));
		return ACLNN_ERR_PARAM_INVALID;
	}
	if (cubeMathType < 0 || cubeMathType > 3) {
		fk_set_error("aclnnMatmul: cubeMathType %d", cubeMathType);
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *x;
	e->t[1] = *w;
	e->t[2] = *o;
	e->ws = (uint64_t)w->dims[1] * sizeof(float);
	e->run = run_matmul;
	*ws = e->ws;
	*exec = e;
	return 0;
}

int aclnnMatmul(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnMatmul", ws, wsSize, exec, stream);
}

// ---- RmsNorm over the last dimension; rstd holds one value per row.

static int contiguous(const fk_tensor *t) {
	int64_t s = 1;
	for (int i = t->nd - 1; i >= 0; i--) {
		if (t->strides[i] != s) return 0;
		s *= t->dims[i];
	}
	return 1;
}

static int64_t count(const fk_tensor *t) {
	int64_t n = 1;
	for (int i = 0; i < t->nd; i++) n *= t->dims[i];
	return n;
}

static int run_rmsnorm(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *x = &e->t[0], *g = &e->t[1], *y = &e->t[2], *r = &e->t[3];
	int64_t D = x->dims[x->nd - 1], rows = count(x) / D;
	for (int64_t i = 0; i < rows; i++) {
		double ss = 0;
		for (int64_t d = 0; d < D; d++) {
			double v = fk_get(x, x->offset + i * D + d);
			ss += v * v;
		}
		double rs = 1 / sqrt(ss / (double)D + e->attr);
		for (int64_t d = 0; d < D; d++)
			fk_put(y, y->offset + i * D + d, fk_get(x, x->offset + i * D + d) * rs * fk_get(g, g->offset + d));
		fk_put(r, r->offset + i, rs);
	}
	return 0;
}

int aclnnRmsNormGetWorkspaceSize(void *x, void *gamma, double eps, void *y, void *rstd, uint64_t *ws, void **exec) {
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[4] = {x, gamma, y, rstd};
	if ((rc = check_tensors("aclnnRmsNorm", 4, ts))) return rc;
	const fk_tensor *tx = x, *tg = gamma, *ty = y, *tr = rstd;
	int64_t D = tx->dims[tx->nd - 1];
	if (!contiguous(tx) || !contiguous(ty) || count(ty) != count(tx) || count(tg) != D || count(tr) * D != count(tx)) {
		fk_set_error("aclnnRmsNorm: x, y, gamma and rstd do not match (the fake takes contiguous operands)");
		return ACLNN_ERR_PARAM_INVALID;
	}
	if (!(eps > 0)) {
		fk_set_error("aclnnRmsNorm: eps %g", eps);
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *tx;
	e->t[1] = *tg;
	e->t[2] = *ty;
	e->t[3] = *tr;
	e->attr = eps;
	e->run = run_rmsnorm;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnRmsNorm(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnRmsNorm", ws, wsSize, exec, stream);
}
