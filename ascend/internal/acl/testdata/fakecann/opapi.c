// The fake operator library: aclnnMatmul and aclnnRmsNorm with aclnn's
// two-phase protocol, computed on the host.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fake.h"

// check_tensors validates operands; those in the bit mask ints may be
// INT32 instead of FLOAT or BF16.
static int check_tensors_i(const char *op, int n, void **ts, int ints) {
	for (int i = 0; i < n; i++) {
		if (!fk_tensor_ok(ts[i])) {
			fk_set_error("%s: operand %d is not a live tensor", op, i);
			return ACLNN_ERR_PARAM_NULLPTR;
		}
		const fk_tensor *t = ts[i];
		if (t->dtype != 0 && t->dtype != 27 && !((ints >> i) & 1 && (t->dtype == 3 || t->dtype == 9))) {
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

static int check_tensors(const char *op, int n, void **ts) { return check_tensors_i(op, n, ts, 0); }

// ---- Matmul: out[M,N] = self[M,K] · mat2[K,N], any strides;
// BatchMatMul: the same with a leading batch dimension on all three.

static int run_matmul(fk_exec *e, void *ws) {
	const fk_tensor *x = &e->t[0], *w = &e->t[1], *o = &e->t[2];
	int b3 = x->nd == 3, B = b3 ? (int)x->dims[0] : 1;
	int64_t M = x->dims[b3], K = x->dims[b3 + 1], N = w->dims[b3 + 1];
	float *acc = ws; // one output row, in the workspace phase 1 asked for
	for (int b = 0; b < B; b++) {
		int64_t xb = x->offset + (b3 ? b * x->strides[0] : 0), wb = w->offset + (b3 ? b * w->strides[0] : 0);
		int64_t ob = o->offset + (b3 ? b * o->strides[0] : 0);
		for (int64_t m = 0; m < M; m++) {
			for (int64_t n = 0; n < N; n++) {
				double s = 0;
				for (int64_t k = 0; k < K; k++)
					s += fk_get(x, xb + m * x->strides[b3] + k * x->strides[b3 + 1]) *
						fk_get(w, wb + k * w->strides[b3] + n * w->strides[b3 + 1]);
				acc[n] = (float)s;
			}
			for (int64_t n = 0; n < N; n++) fk_put(o, ob + m * o->strides[b3] + n * o->strides[b3 + 1], acc[n]);
		}
	}
	return 0;
}

static int prepare_matmul(const char *op, int nd, void *self, void *mat2, void *out, int8_t cubeMathType, uint64_t *ws,
	void **exec) {
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[3] = {self, out, mat2};
	const fk_tensor *x = self, *w = mat2, *o = out;
	// mat2 of aclnnMatmul may be a BF16 weight in FRACTAL_NZ: a
	// contiguous [K, N] view from offset 0 over [N1, K1, 16, 16].
	int nzw = nd == 2 && fk_tensor_ok(mat2) && w->format == 29;
	if ((rc = check_tensors(op, nzw ? 2 : 3, ts))) return rc;
	if (nzw && (w->dtype != 27 || w->nd != 2 || w->offset != 0 || w->strides[0] != w->dims[1] ||
		w->strides[1] != 1 || w->nsd != 4 || w->sdims[0] != (w->dims[1] + 15) / 16 || w->sdims[1] != (w->dims[0] + 15) / 16 ||
		w->sdims[2] != 16 || w->sdims[3] != 16)) {
		fk_set_error("%s: a FRACTAL_NZ mat2 must be a contiguous BF16 [K, N] view over [N1, K1, 16, 16]", op);
		return ACLNN_ERR_PARAM_INVALID;
	}
	int b = nd == 3;
	if (x->nd != nd || w->nd != nd || o->nd != nd || x->dims[b + 1] != w->dims[b] || o->dims[b] != x->dims[b] ||
		o->dims[b + 1] != w->dims[b + 1] || (b && (w->dims[0] != x->dims[0] || o->dims[0] != x->dims[0]))) {
		fk_set_error("%s: shapes of self, mat2 and out do not chain (the fake takes %d-D operands)", op, nd);
		return ACLNN_ERR_PARAM_INVALID;
	}
	if (cubeMathType < 0 || cubeMathType > 3) {
		fk_set_error("%s: cubeMathType %d", op, cubeMathType);
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *x;
	e->t[1] = *w;
	e->t[2] = *o;
	e->ws = (uint64_t)w->dims[b + 1] * sizeof(float);
	e->run = run_matmul;
	*ws = e->ws;
	*exec = e;
	return 0;
}

int aclnnMatmulGetWorkspaceSize(void *self, void *mat2, void *out, int8_t cubeMathType, uint64_t *ws, void **exec) {
	return prepare_matmul("aclnnMatmul", 2, self, mat2, out, cubeMathType, ws, exec);
}

int aclnnBatchMatMulGetWorkspaceSize(void *self, void *mat2, void *out, int8_t cubeMathType, uint64_t *ws, void **exec) {
	return prepare_matmul("aclnnBatchMatMul", 3, self, mat2, out, cubeMathType, ws, exec);
}

int aclnnBatchMatMul(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnBatchMatMul", ws, wsSize, exec, stream);
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

// ---- Elementwise operators with broadcasting (numpy rules, right-aligned).

enum { OP_ADD, OP_MUL, OP_SILU, OP_SIGMOID, OP_SOFTPLUS, OP_CAST, OP_FILL, OP_EXP, OP_MULS, OP_MAX, OP_DIV, OP_TANH, OP_RELU, OP_LOG };

// boff is the offset in t of output index idx (over o's dimensions).
static int64_t boff(const fk_tensor *t, const fk_tensor *o, const int64_t *idx) {
	int64_t off = t->offset;
	for (int i = 0; i < t->nd; i++) {
		int oi = o->nd - t->nd + i;
		if (t->dims[i] != 1) off += idx[oi] * t->strides[i];
	}
	return off;
}

static int run_elementwise(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *a = &e->t[0], *b = &e->t[1], *o = &e->t[2];
	int kind = e->iattr;
	int64_t idx[FK_MAXDIM] = {0}, n = 1;
	for (int i = 0; i < o->nd; i++) n *= o->dims[i];
	for (int64_t k = 0; k < n; k++) {
		double x = kind == OP_FILL ? 0 : fk_get(a, boff(a, o, idx)), y = 0, r = 0;
		if (kind == OP_ADD || kind == OP_MUL || kind == OP_MAX || kind == OP_DIV) y = fk_get(b, boff(b, o, idx));
		switch (kind) {
		case OP_ADD: r = x + e->attr * y; break;
		case OP_MUL: r = x * y; break;
		case OP_SILU: r = x / (1 + exp(-x)); break;
		case OP_SIGMOID: r = 1 / (1 + exp(-x)); break;
		case OP_SOFTPLUS: r = e->attr * x > e->attr2 ? x : log1p(exp(e->attr * x)) / e->attr; break;
		case OP_CAST: r = x; break;
		case OP_FILL: r = e->attr; break;
		case OP_EXP: r = exp(x); break;
		case OP_MULS: r = x * e->attr; break;
		case OP_MAX: r = x > y ? x : y; break;
		case OP_DIV: r = x / y; break;
		case OP_TANH: r = tanh(x); break;
		case OP_RELU: r = x > 0 ? x : 0; break;
		case OP_LOG: r = log(x); break;
		}
		fk_put(o, boff(o, o, idx), r);
		for (int i = o->nd - 1; i >= 0 && ++idx[i] == o->dims[i]; i--) idx[i] = 0;
	}
	return 0;
}

// broadcasts reports whether t's shape broadcasts to o's.
static int broadcasts(const fk_tensor *t, const fk_tensor *o) {
	if (t->nd > o->nd) return 0;
	for (int i = 0; i < t->nd; i++) {
		int64_t d = t->dims[i], od = o->dims[o->nd - t->nd + i];
		if (d != 1 && d != od) return 0;
	}
	return 1;
}

static int prepare_elementwise(const char *op, int kind, void *a, void *b, void *out, double attr, double attr2,
	uint64_t *ws, void **exec) {
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[3] = {a, b ? b : a, out};
	if ((rc = check_tensors_i(op, 3, ts, 7))) return rc; // elementwise operators take integers too
	if (!broadcasts(a, out) || (b && !broadcasts(b, out))) {
		fk_set_error("%s: the operands do not broadcast to the output's shape", op);
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *(fk_tensor *)a;
	if (b) e->t[1] = *(fk_tensor *)b;
	e->t[2] = *(fk_tensor *)out;
	e->iattr = kind;
	e->attr = attr;
	e->attr2 = attr2;
	e->run = run_elementwise;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnAddGetWorkspaceSize(void *self, void *other, void *alpha, void *out, uint64_t *ws, void **exec) {
	if (!fk_scalar_ok(alpha)) {
		fk_set_error("aclnnAdd: alpha is not a live scalar");
		return ACLNN_ERR_PARAM_NULLPTR;
	}
	return prepare_elementwise("aclnnAdd", OP_ADD, self, other, out, ((fk_scalar *)alpha)->v, 0, ws, exec);
}

int aclnnAdd(void *ws, uint64_t wsSize, void *exec, void *stream) { return fk_launch("aclnnAdd", ws, wsSize, exec, stream); }

int aclnnMulGetWorkspaceSize(void *self, void *other, void *out, uint64_t *ws, void **exec) {
	return prepare_elementwise("aclnnMul", OP_MUL, self, other, out, 0, 0, ws, exec);
}

int aclnnMul(void *ws, uint64_t wsSize, void *exec, void *stream) { return fk_launch("aclnnMul", ws, wsSize, exec, stream); }

int aclnnSiluGetWorkspaceSize(void *self, void *out, uint64_t *ws, void **exec) {
	return prepare_elementwise("aclnnSilu", OP_SILU, self, NULL, out, 0, 0, ws, exec);
}

int aclnnSilu(void *ws, uint64_t wsSize, void *exec, void *stream) { return fk_launch("aclnnSilu", ws, wsSize, exec, stream); }

int aclnnSigmoidGetWorkspaceSize(void *self, void *out, uint64_t *ws, void **exec) {
	return prepare_elementwise("aclnnSigmoid", OP_SIGMOID, self, NULL, out, 0, 0, ws, exec);
}

int aclnnSigmoid(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnSigmoid", ws, wsSize, exec, stream);
}

int aclnnSoftplusGetWorkspaceSize(void *self, void *beta, void *threshold, void *out, uint64_t *ws, void **exec) {
	if (!fk_scalar_ok(beta) || !fk_scalar_ok(threshold)) {
		fk_set_error("aclnnSoftplus: beta or threshold is not a live scalar");
		return ACLNN_ERR_PARAM_NULLPTR;
	}
	double b = ((fk_scalar *)beta)->v;
	if (b == 0) {
		fk_set_error("aclnnSoftplus: beta 0");
		return ACLNN_ERR_PARAM_INVALID;
	}
	return prepare_elementwise("aclnnSoftplus", OP_SOFTPLUS, self, NULL, out, b, ((fk_scalar *)threshold)->v, ws, exec);
}

int aclnnSoftplus(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnSoftplus", ws, wsSize, exec, stream);
}

int aclnnCastGetWorkspaceSize(void *self, int dtype, void *out, uint64_t *ws, void **exec) {
	if (fk_tensor_ok(out) && ((fk_tensor *)out)->dtype != dtype) {
		fk_set_error("aclnnCast: out has data type %d, cast to %d", ((fk_tensor *)out)->dtype, dtype);
		return ACLNN_ERR_PARAM_INVALID;
	}
	return prepare_elementwise("aclnnCast", OP_CAST, self, NULL, out, 0, 0, ws, exec);
}

int aclnnCast(void *ws, uint64_t wsSize, void *exec, void *stream) { return fk_launch("aclnnCast", ws, wsSize, exec, stream); }

// ---- Embedding: out[t, :] = weight[indices[t], :].

static int run_embedding(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *w = &e->t[0], *ids = &e->t[1], *o = &e->t[2];
	int64_t V = w->dims[0], D = w->dims[1], T = ids->dims[0];
	for (int64_t t = 0; t < T; t++) {
		int64_t id = (int64_t)fk_get(ids, ids->offset + t * ids->strides[0]);
		if (id < 0 || id >= V) {
			fk_set_error("aclnnEmbedding: index %lld outside [0, %lld)", (long long)id, (long long)V);
			return ACL_ERROR_RT_AICORE_EXCEPTION;
		}
		for (int64_t d = 0; d < D; d++)
			fk_put(o, o->offset + t * o->strides[0] + d * o->strides[1],
				fk_get(w, w->offset + id * w->strides[0] + d * w->strides[1]));
	}
	return 0;
}

int aclnnEmbeddingGetWorkspaceSize(void *weight, void *indices, void *out, uint64_t *ws, void **exec) {
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[3] = {weight, indices, out};
	if ((rc = check_tensors_i("aclnnEmbedding", 3, ts, 2))) return rc;
	const fk_tensor *w = weight, *ids = indices, *o = out;
	if (w->nd != 2 || ids->nd != 1 || ids->dtype != 3 || o->nd != 2 || o->dims[0] != ids->dims[0] || o->dims[1] != w->dims[1] ||
		o->dtype != w->dtype) {
		fk_set_error("aclnnEmbedding: weight [V, D], int32 indices [T] and out [T, D] of weight's type expected");
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *w;
	e->t[1] = *ids;
	e->t[2] = *o;
	e->run = run_embedding;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnEmbedding(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnEmbedding", ws, wsSize, exec, stream);
}

int aclnnInplaceFillScalarGetWorkspaceSize(void *selfRef, void *value, uint64_t *ws, void **exec) {
	if (!fk_scalar_ok(value)) {
		fk_set_error("aclnnInplaceFillScalar: value is not a live scalar");
		return ACLNN_ERR_PARAM_NULLPTR;
	}
	return prepare_elementwise("aclnnInplaceFillScalar", OP_FILL, selfRef, NULL, selfRef, ((fk_scalar *)value)->v, 0, ws, exec);
}

int aclnnInplaceFillScalar(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnInplaceFillScalar", ws, wsSize, exec, stream);
}

// ---- LayerNorm over the trailing normalizedShape (the fake takes one
// dimension); mean and rstd get one value per row.

static int run_layernorm(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *x = &e->t[0], *w = &e->t[1], *b = &e->t[2], *o = &e->t[3], *mu = &e->t[4], *rs = &e->t[5];
	int64_t D = x->dims[x->nd - 1], rows = count(x) / D;
	for (int64_t i = 0; i < rows; i++) {
		double m = 0, v = 0;
		for (int64_t d = 0; d < D; d++) m += fk_get(x, x->offset + i * D + d);
		m /= (double)D;
		for (int64_t d = 0; d < D; d++) {
			double c = fk_get(x, x->offset + i * D + d) - m;
			v += c * c;
		}
		double r = 1 / sqrt(v / (double)D + e->attr);
		for (int64_t d = 0; d < D; d++)
			fk_put(o, o->offset + i * D + d,
				(fk_get(x, x->offset + i * D + d) - m) * r * fk_get(w, w->offset + d) + fk_get(b, b->offset + d));
		fk_put(mu, mu->offset + i, m);
		fk_put(rs, rs->offset + i, r);
	}
	return 0;
}

int aclnnLayerNormGetWorkspaceSize(void *x, void *shape, void *w, void *b, double eps, void *out, void *mean, void *rstd,
	uint64_t *ws, void **exec) {
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[6] = {x, w, b, out, mean, rstd};
	if ((rc = check_tensors("aclnnLayerNorm", 6, ts))) return rc;
	uint64_t n;
	const int64_t *v;
	if (fk_int_array_get(shape, &n, &v) || n != 1) {
		fk_set_error("aclnnLayerNorm: normalizedShape must be a live array of one dimension");
		return ACLNN_ERR_PARAM_INVALID;
	}
	const fk_tensor *tx = x;
	int64_t D = tx->dims[tx->nd - 1], rows = count(tx) / D;
	if (v[0] != D || !contiguous(tx) || !contiguous(out) || count(out) != count(tx) || count(w) != D || count(b) != D ||
		count(mean) != rows || count(rstd) != rows || !(eps > 0)) {
		fk_set_error("aclnnLayerNorm: x, normalizedShape, weight, bias, out, mean, rstd or eps do not match");
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	for (int i = 0; i < 6; i++) e->t[i] = *(fk_tensor *)ts[i];
	e->attr = eps;
	e->run = run_layernorm;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnLayerNorm(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnLayerNorm", ws, wsSize, exec, stream);
}

// ---- Matmul weights in the cube unit's format. The fake takes it to be
// FRACTAL_NZ with C0 = 16 (2-byte types): [..., R, C] stored as
// [..., C1, R1, 16, 16], zero padded; the real format is checked against
// this only on hardware.

int aclnnCalculateMatmulWeightSizeV2(void *shape, int dtype, uint64_t *elems) {
	uint64_t n;
	const int64_t *v;
	if (fk_int_array_get(shape, &n, &v) || n < 2 || (dtype != 1 && dtype != 27) || elems == NULL) {
		fk_set_error("aclnnCalculateMatmulWeightSizeV2: a shape of 2 or more dimensions and FLOAT16 or BF16 expected");
		return ACLNN_ERR_PARAM_INVALID;
	}
	uint64_t batch = 1;
	for (uint64_t i = 0; i + 2 < n; i++) batch *= (uint64_t)v[i];
	uint64_t R = (uint64_t)v[n - 2], C = (uint64_t)v[n - 1];
	*elems = batch * ((R + 15) / 16 * 16) * ((C + 15) / 16 * 16);
	return 0;
}

static int run_trans_weight(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *w = &e->t[0];
	int64_t R = w->dims[w->nd - 2], C = w->dims[w->nd - 1], batch = count(w) / (R * C);
	int64_t R1 = (R + 15) / 16, C1 = (C + 15) / 16, n = batch * R1 * C1 * 256;
	uint16_t *p = w->data, *tmp = calloc((size_t)n, 2);
	for (int64_t b = 0; b < batch; b++)
		for (int64_t r = 0; r < R; r++)
			for (int64_t c = 0; c < C; c++)
				tmp[(((b * C1 + c / 16) * R1 + r / 16) * 16 + r % 16) * 16 + c % 16] = p[(b * R + r) * C + c];
	memcpy(p, tmp, (size_t)n * 2);
	free(tmp);
	return 0;
}

int aclnnTransMatmulWeightGetWorkspaceSize(void *wRef, uint64_t *ws, void **exec) {
	int rc = fk_need_context();
	if (rc) return rc;
	if (!fk_tensor_ok(wRef)) {
		fk_set_error("aclnnTransMatmulWeight: not a live tensor");
		return ACLNN_ERR_PARAM_NULLPTR;
	}
	const fk_tensor *w = wRef;
	int64_t R = w->nd >= 2 ? w->dims[w->nd - 2] : 0, C = w->nd >= 2 ? w->dims[w->nd - 1] : 0;
	int64_t need = count(w) / (R * C > 0 ? R * C : 1) * ((R + 15) / 16 * 16) * ((C + 15) / 16 * 16);
	if (w->nd < 2 || (w->dtype != 1 && w->dtype != 27) || !contiguous(w) || w->offset != 0 ||
		!fk_is_device(w->data, (size_t)need * 2)) {
		fk_set_error("aclnnTransMatmulWeight: a contiguous FLOAT16 or BF16 weight whose buffer holds %lld elements expected",
			(long long)need);
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *w;
	e->run = run_trans_weight;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnTransMatmulWeight(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnTransMatmulWeight", ws, wsSize, exec, stream);
}

int aclnnExpGetWorkspaceSize(void *self, void *out, uint64_t *ws, void **exec) {
	return prepare_elementwise("aclnnExp", OP_EXP, self, NULL, out, 0, 0, ws, exec);
}

int aclnnExp(void *ws, uint64_t wsSize, void *exec, void *stream) { return fk_launch("aclnnExp", ws, wsSize, exec, stream); }

int aclnnMulsGetWorkspaceSize(void *self, void *other, void *out, uint64_t *ws, void **exec) {
	if (!fk_scalar_ok(other)) {
		fk_set_error("aclnnMuls: other is not a live scalar");
		return ACLNN_ERR_PARAM_NULLPTR;
	}
	return prepare_elementwise("aclnnMuls", OP_MULS, self, NULL, out, ((fk_scalar *)other)->v, 0, ws, exec);
}

int aclnnMuls(void *ws, uint64_t wsSize, void *exec, void *stream) { return fk_launch("aclnnMuls", ws, wsSize, exec, stream); }

int aclnnInplaceCopyGetWorkspaceSize(void *selfRef, void *src, uint64_t *ws, void **exec) {
	return prepare_elementwise("aclnnInplaceCopy", OP_CAST, src, NULL, selfRef, 0, 0, ws, exec);
}

int aclnnInplaceCopy(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnInplaceCopy", ws, wsSize, exec, stream);
}

// ---- RecurrentGatedDeltaRule: per head, S <- S*Diag(exp(g + gk)),
// S <- S + beta (v - S k) k^T, out = scale * S q, with the state V-first
// ([blocks, Nv, Dv, Dk]); at most 8 tokens per sequence.

static double at3(const fk_tensor *t, int64_t i, int64_t j, int64_t k) {
	return fk_get(t, t->offset + i * t->strides[0] + j * t->strides[1] + k * t->strides[2]);
}

static int run_rgdr(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *q = &e->t[0], *k = &e->t[1], *v = &e->t[2], *beta = &e->t[3], *st = &e->t[4], *lens = &e->t[5];
	const fk_tensor *idx = &e->t[6], *gk = &e->t[7], *o = &e->t[8];
	int has_g = e->iattr & 1, has_gk = e->iattr & 2;
	const fk_tensor *g = &e->t[9];
	int64_t B = lens->dims[0], Nk = q->dims[1], Dk = q->dims[2], Nv = v->dims[1], Dv = v->dims[2];
	double *S = malloc(sizeof(double) * Dv * Dk), *u = malloc(sizeof(double) * Dv);
	int64_t t0 = 0;
	for (int64_t b = 0; b < B; b++) {
		int64_t n = (int64_t)fk_get(lens, lens->offset + b * lens->strides[0]);
		if (n < 1 || n > 8 || t0 + n > q->dims[0]) {
			fk_set_error("aclnnRecurrentGatedDeltaRule: sequence %lld has %lld tokens (1 to 8, %lld in all)", (long long)b,
				(long long)n, (long long)q->dims[0]);
			free(S);
			free(u);
			return ACL_ERROR_RT_AICORE_EXCEPTION;
		}
		for (int64_t h = 0; h < Nv; h++) {
			int64_t hk = h / (Nv / Nk);
			int64_t slot = (int64_t)fk_get(idx, idx->offset + t0 * idx->strides[0]);
			for (int64_t a = 0; a < Dv * Dk; a++) S[a] = fk_get(st, st->offset + (slot * Nv + h) * Dv * Dk + a);
			for (int64_t i = 0; i < n; i++) {
				int64_t t = t0 + i;
				double gh = has_g ? fk_get(g, g->offset + t * g->strides[0] + h * g->strides[1]) : 0;
				for (int64_t c = 0; c < Dk; c++) {
					double d = exp(gh + (has_gk ? at3(gk, t, h, c) : 0));
					for (int64_t r = 0; r < Dv; r++) S[r * Dk + c] *= d;
				}
				double bt = fk_get(beta, beta->offset + t * beta->strides[0] + h * beta->strides[1]);
				for (int64_t r = 0; r < Dv; r++) {
					double sk = 0;
					for (int64_t c = 0; c < Dk; c++) sk += S[r * Dk + c] * at3(k, t, hk, c);
					u[r] = bt * (at3(v, t, h, r) - sk);
				}
				for (int64_t r = 0; r < Dv; r++)
					for (int64_t c = 0; c < Dk; c++) S[r * Dk + c] += u[r] * at3(k, t, hk, c);
				for (int64_t r = 0; r < Dv; r++) {
					double sq = 0;
					for (int64_t c = 0; c < Dk; c++) sq += S[r * Dk + c] * at3(q, t, hk, c);
					fk_put(o, o->offset + t * o->strides[0] + h * o->strides[1] + r * o->strides[2], e->attr * sq);
				}
				int64_t to = (int64_t)fk_get(idx, idx->offset + t * idx->strides[0]);
				for (int64_t a = 0; a < Dv * Dk; a++) fk_put(st, st->offset + (to * Nv + h) * Dv * Dk + a, S[a]);
			}
		}
		t0 += n;
	}
	free(S);
	free(u);
	return 0;
}

int aclnnRecurrentGatedDeltaRuleGetWorkspaceSize(void *q, void *k, void *v, void *beta, void *state, void *seqLens,
	void *stateIdx, void *g, void *gk, void *accepted, float scale, void *out, uint64_t *ws, void **exec) {
	const char *op = "aclnnRecurrentGatedDeltaRule";
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[6] = {q, k, v, beta, state, out};
	if ((rc = check_tensors(op, 6, ts))) return rc;
	void *ints[2] = {seqLens, stateIdx};
	if ((rc = check_tensors_i(op, 2, ints, 3))) return rc;
	if (accepted != NULL) {
		fk_set_error("%s: numAcceptedTokens is not supported by the fake", op);
		return ACLNN_ERR_PARAM_INVALID;
	}
	const fk_tensor *tq = q, *tk = k, *tv = v, *tb = beta, *ts_ = state, *tl = seqLens, *ti = stateIdx, *to = out;
	int64_t T = tq->dims[0];
	int bad = tq->nd != 3 || tk->nd != 3 || tv->nd != 3 || to->nd != 3 || tb->nd != 2 || ts_->nd != 4 || tl->nd != 1 ||
		ti->nd != 1 || tl->dtype != 3 || ti->dtype != 3 || ti->dims[0] != T || tk->dims[0] != T || tv->dims[0] != T ||
		to->dims[0] != T || tb->dims[0] != T || tk->dims[1] != tq->dims[1] || tk->dims[2] != tq->dims[2] ||
		tv->dims[1] % tq->dims[1] != 0 || tb->dims[1] != tv->dims[1] || to->dims[1] != tv->dims[1] ||
		to->dims[2] != tv->dims[2] || ts_->dims[1] != tv->dims[1] || ts_->dims[2] != tv->dims[2] ||
		ts_->dims[3] != tq->dims[2] || !contiguous(ts_);
	if (gk != NULL) {
		const fk_tensor *tg = gk;
		bad = bad || !fk_tensor_ok(gk) || tg->nd != 3 || tg->dims[0] != T || tg->dims[1] != tv->dims[1] || tg->dims[2] != tq->dims[2];
	}
	if (g != NULL) {
		const fk_tensor *tg = g;
		bad = bad || !fk_tensor_ok(g) || tg->nd != 2 || tg->dims[0] != T || tg->dims[1] != tv->dims[1];
	}
	if (bad) {
		fk_set_error("%s: q, k [T, Nk, Dk], v [T, Nv, Dv], beta and g [T, Nv], gk [T, Nv, Dk], state [blocks, Nv, Dv, Dk], "
			"int32 actual lengths [B] and state indices [T], out [T, Nv, Dv] expected", op);
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *tq;
	e->t[1] = *tk;
	e->t[2] = *tv;
	e->t[3] = *tb;
	e->t[4] = *ts_;
	e->t[5] = *tl;
	e->t[6] = *ti;
	if (gk) e->t[7] = *(fk_tensor *)gk;
	e->t[8] = *to;
	if (g) e->t[9] = *(fk_tensor *)g;
	e->attr = scale;
	e->iattr = (g != NULL) | (gk != NULL) << 1;
	e->run = run_rgdr;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnRecurrentGatedDeltaRule(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnRecurrentGatedDeltaRule", ws, wsSize, exec, stream);
}

int aclnnMaximumGetWorkspaceSize(void *self, void *other, void *out, uint64_t *ws, void **exec) {
	return prepare_elementwise("aclnnMaximum", OP_MAX, self, other, out, 0, 0, ws, exec);
}

int aclnnMaximum(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnMaximum", ws, wsSize, exec, stream);
}

int aclnnDivGetWorkspaceSize(void *self, void *other, void *out, uint64_t *ws, void **exec) {
	return prepare_elementwise("aclnnDiv", OP_DIV, self, other, out, 0, 0, ws, exec);
}

int aclnnDiv(void *ws, uint64_t wsSize, void *exec, void *stream) { return fk_launch("aclnnDiv", ws, wsSize, exec, stream); }

int aclnnTanhGetWorkspaceSize(void *self, void *out, uint64_t *ws, void **exec) {
	return prepare_elementwise("aclnnTanh", OP_TANH, self, NULL, out, 0, 0, ws, exec);
}

int aclnnTanh(void *ws, uint64_t wsSize, void *exec, void *stream) { return fk_launch("aclnnTanh", ws, wsSize, exec, stream); }

// ---- IndexSelect and IndexAdd along dimension 0 (the fake's limit), with
// int32 indices.

static int64_t row_elems(const fk_tensor *t) { return count(t) / t->dims[0]; }

static int run_index_select(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *x = &e->t[0], *idx = &e->t[1], *o = &e->t[2];
	int64_t n = idx->dims[0], w = row_elems(x), rows = x->dims[0];
	for (int64_t i = 0; i < n; i++) {
		int64_t r = (int64_t)fk_get(idx, idx->offset + i * idx->strides[0]);
		if (r < 0 || r >= rows) {
			fk_set_error("aclnnIndexSelect: index %lld outside [0, %lld)", (long long)r, (long long)rows);
			return ACL_ERROR_RT_AICORE_EXCEPTION;
		}
		for (int64_t j = 0; j < w; j++) fk_put(o, o->offset + i * w + j, fk_get(x, x->offset + r * w + j));
	}
	return 0;
}

int aclnnIndexSelectGetWorkspaceSize(void *self, int64_t dim, void *index, void *out, uint64_t *ws, void **exec) {
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[3] = {self, index, out};
	if ((rc = check_tensors_i("aclnnIndexSelect", 3, ts, 7))) return rc;
	const fk_tensor *x = self, *i = index, *o = out;
	if (dim != 0 || i->nd != 1 || i->dtype != 3 || x->dtype != o->dtype || !contiguous(x) || !contiguous(o) || o->dims[0] != i->dims[0] ||
		count(o) != i->dims[0] * row_elems(x)) {
		fk_set_error("aclnnIndexSelect: dim 0 of contiguous operands with int32 indices [n] expected");
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *x;
	e->t[1] = *i;
	e->t[2] = *o;
	e->run = run_index_select;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnIndexSelect(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnIndexSelect", ws, wsSize, exec, stream);
}

static int run_index_copy(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *x = &e->t[0], *idx = &e->t[1], *src = &e->t[2];
	int64_t n = idx->dims[0], w = row_elems(x), rows = x->dims[0];
	for (int64_t i = 0; i < n; i++) {
		int64_t r = (int64_t)fk_get(idx, idx->offset + i * idx->strides[0]);
		if (r < 0 || r >= rows) {
			fk_set_error("aclnnInplaceIndexCopy: index %lld outside [0, %lld)", (long long)r, (long long)rows);
			return ACL_ERROR_RT_AICORE_EXCEPTION;
		}
		for (int64_t j = 0; j < w; j++) fk_put(x, x->offset + r * w + j, fk_get(src, src->offset + i * w + j));
	}
	return 0;
}

int aclnnInplaceIndexCopyGetWorkspaceSize(void *self, int64_t dim, void *index, void *source, uint64_t *ws, void **exec) {
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[3] = {self, index, source};
	if ((rc = check_tensors_i("aclnnInplaceIndexCopy", 3, ts, 2))) return rc;
	const fk_tensor *x = self, *i = index, *s = source;
	if (dim != 0 || i->nd != 1 || i->dtype != 3 || !contiguous(x) || !contiguous(s) || s->dims[0] != i->dims[0] ||
		s->dtype != x->dtype || count(s) != i->dims[0] * row_elems(x)) {
		fk_set_error("aclnnInplaceIndexCopy: dim 0 of contiguous operands of one dtype with int32 indices [n] expected");
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *x;
	e->t[1] = *i;
	e->t[2] = *s;
	e->run = run_index_copy;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnInplaceIndexCopy(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnInplaceIndexCopy", ws, wsSize, exec, stream);
}

static int run_index_add(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *x = &e->t[0], *idx = &e->t[1], *src = &e->t[2], *o = &e->t[3];
	int64_t n = idx->dims[0], w = row_elems(x), rows = x->dims[0];
	if (o->data != x->data || o->offset != x->offset)
		for (int64_t j = 0; j < count(x); j++) fk_put(o, o->offset + j, fk_get(x, x->offset + j));
	for (int64_t i = 0; i < n; i++) {
		int64_t r = (int64_t)fk_get(idx, idx->offset + i * idx->strides[0]);
		if (r < 0 || r >= rows) {
			fk_set_error("aclnnIndexAdd: index %lld outside [0, %lld)", (long long)r, (long long)rows);
			return ACL_ERROR_RT_AICORE_EXCEPTION;
		}
		for (int64_t j = 0; j < w; j++)
			fk_put(o, o->offset + r * w + j, fk_get(o, o->offset + r * w + j) + e->attr * fk_get(src, src->offset + i * w + j));
	}
	return 0;
}

int aclnnIndexAddGetWorkspaceSize(void *self, int64_t dim, void *index, void *source, void *alpha, void *out, uint64_t *ws,
	void **exec) {
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[4] = {self, index, source, out};
	if ((rc = check_tensors_i("aclnnIndexAdd", 4, ts, 2))) return rc;
	if (!fk_scalar_ok(alpha)) {
		fk_set_error("aclnnIndexAdd: alpha is not a live scalar");
		return ACLNN_ERR_PARAM_NULLPTR;
	}
	const fk_tensor *x = self, *i = index, *src = source, *o = out;
	if (dim != 0 || i->nd != 1 || i->dtype != 3 || !contiguous(x) || !contiguous(src) || !contiguous(o) ||
		count(o) != count(x) || src->dims[0] != i->dims[0] || count(src) != i->dims[0] * row_elems(x)) {
		fk_set_error("aclnnIndexAdd: dim 0 of contiguous operands with int32 indices [n] expected");
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *x;
	e->t[1] = *i;
	e->t[2] = *src;
	e->t[3] = *o;
	e->attr = ((fk_scalar *)alpha)->v;
	e->run = run_index_add;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnIndexAdd(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnIndexAdd", ws, wsSize, exec, stream);
}

// ---- MoeGatingTopK as k3 calls it: sigmoid scores, selection by score +
// bias, groups by the sum of their two best, the best kGroup groups, the
// top k experts (larger first, ties to the lower index), weights from the
// unbiased scores, renormalised when asked, times the scaling factor.

static int better(float a, int64_t ia, float b, int64_t ib) { return a > b || (a == b && ia < ib); }

// topk writes the indices of the k best of x[0..n) (excluding masked
// entries) to out.
static void topk(const float *x, const char *masked, int64_t n, int64_t k, int64_t *out) {
	char *taken = calloc((size_t)n, 1);
	for (int64_t j = 0; j < k; j++) {
		int64_t best = -1;
		for (int64_t i = 0; i < n; i++) {
			if (taken[i] || (masked && masked[i])) continue;
			if (best < 0 || better(x[i], i, x[best], best)) best = i;
		}
		out[j] = best;
		if (best >= 0) taken[best] = 1;
	}
	free(taken);
}

static int run_gating(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *x = &e->t[0], *bias = &e->t[1], *y = &e->t[2], *ix = &e->t[3];
	int has_bias = e->iattr & 1, renorm = (e->iattr >> 1) & 1;
	int64_t T = x->dims[0], E = x->dims[1], k = y->dims[1];
	int64_t G = (int64_t)e->attr2 >> 16, KG = (int64_t)e->attr2 & 0xffff;
	float *score = malloc(sizeof(float) * E), *sel = malloc(sizeof(float) * E), *gs = malloc(sizeof(float) * (G > 0 ? G : 1));
	char *masked = calloc((size_t)E, 1);
	int64_t *pick = malloc(sizeof(int64_t) * (E > 2 ? E : 2));
	for (int64_t t = 0; t < T; t++) {
		for (int64_t i = 0; i < E; i++) {
			double l = fk_get(x, x->offset + t * x->strides[0] + i * x->strides[1]);
			score[i] = (float)(1 / (1 + exp(-l)));
			sel[i] = score[i] + (has_bias ? (float)fk_get(bias, bias->offset + i * bias->strides[0]) : 0);
		}
		memset(masked, 0, (size_t)E);
		if (G > 1) {
			int64_t per = E / G;
			for (int64_t g = 0; g < G; g++) {
				int64_t two[2];
				topk(sel + g * per, NULL, per, 2, two);
				gs[g] = sel[g * per + two[0]] + sel[g * per + two[1]];
			}
			topk(gs, NULL, G, KG, pick);
			for (int64_t g = 0; g < G; g++) {
				int keep = 0;
				for (int64_t j = 0; j < KG; j++) keep |= pick[j] == g;
				if (!keep) memset(masked + g * per, 1, (size_t)per);
			}
		}
		topk(sel, masked, E, k, pick);
		double total = 0;
		for (int64_t j = 0; j < k; j++) total += score[pick[j]];
		double scale = e->attr;
		if (renorm) scale /= total + 1e-20;
		for (int64_t j = 0; j < k; j++) {
			fk_put(ix, ix->offset + t * ix->strides[0] + j * ix->strides[1], (double)pick[j]);
			fk_put(y, y->offset + t * y->strides[0] + j * y->strides[1], score[pick[j]] * scale);
		}
	}
	free(score);
	free(sel);
	free(gs);
	free(masked);
	free(pick);
	return 0;
}

int aclnnMoeGatingTopKGetWorkspaceSize(void *x, void *bias, int64_t k, int64_t kGroup, int64_t groupCount,
	int64_t groupSelectMode, int64_t renorm, int64_t normType, _Bool outFlag, double factor, double eps, void *y,
	void *expertIdx, void *out, uint64_t *ws, void **exec) {
	const char *op = "aclnnMoeGatingTopK";
	(void)eps;
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[3] = {x, y, expertIdx};
	if ((rc = check_tensors_i(op, 3, ts, 4))) return rc;
	const fk_tensor *tx = x, *ty = y, *ti = expertIdx;
	int64_t T = tx->nd == 2 ? tx->dims[0] : 0, E = tx->nd == 2 ? tx->dims[1] : 0;
	int64_t G = groupCount > 1 ? groupCount : 1, KG = kGroup > 1 ? kGroup : 1;
	int bad = tx->nd != 2 || ty->nd != 2 || ti->nd != 2 || ti->dtype != 3 || ty->dims[0] != T || ti->dims[0] != T ||
		ty->dims[1] != k || ti->dims[1] != k || k < 1 || k > E || E % G != 0 || KG > G || (G > 1 && E / G < 2) ||
		k > KG * (E / G) || groupSelectMode != 1 || normType != 1 || outFlag || out != NULL || G > 0xffff || KG > 0xffff;
	if (bias != NULL) {
		const fk_tensor *tb = bias;
		bad = bad || !fk_tensor_ok(bias) || tb->nd != 1 || tb->dims[0] != E;
	}
	if (bad) {
		fk_set_error("%s: x [T, E], bias [E], y and int32 expertIdx [T, k], sigmoid scores, groups by their top two, "
			"no normalised output: the fake's case", op);
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *tx;
	if (bias) e->t[1] = *(fk_tensor *)bias;
	e->t[2] = *ty;
	e->t[3] = *ti;
	e->attr = factor;
	e->attr2 = (double)((G << 16) | KG);
	e->iattr = (bias != NULL) | (renorm != 0) << 1;
	e->run = run_gating;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnMoeGatingTopK(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnMoeGatingTopK", ws, wsSize, exec, stream);
}

int aclnnReluGetWorkspaceSize(void *self, void *out, uint64_t *ws, void **exec) {
	return prepare_elementwise("aclnnRelu", OP_RELU, self, NULL, out, 0, 0, ws, exec);
}

int aclnnRelu(void *ws, uint64_t wsSize, void *exec, void *stream) { return fk_launch("aclnnRelu", ws, wsSize, exec, stream); }

// ---- Topk over the last dimension of a 2-D tensor: larger first (or
// smaller), ties to the lower index; int64 indices.

static int run_topk(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *x = &e->t[0], *v = &e->t[1], *ix = &e->t[2];
	int64_t R = x->dims[0], N = x->dims[1], k = v->dims[1];
	int largest = e->iattr & 1;
	char *taken = malloc((size_t)N);
	for (int64_t r = 0; r < R; r++) {
		memset(taken, 0, (size_t)N);
		for (int64_t j = 0; j < k; j++) {
			int64_t best = -1;
			double bv = 0;
			for (int64_t i = 0; i < N; i++) {
				if (taken[i]) continue;
				double xi = fk_get(x, x->offset + r * x->strides[0] + i * x->strides[1]);
				if (best < 0 || (largest ? xi > bv : xi < bv)) best = i, bv = xi;
			}
			taken[best] = 1;
			fk_put(v, v->offset + r * v->strides[0] + j * v->strides[1], bv);
			fk_put(ix, ix->offset + r * ix->strides[0] + j * ix->strides[1], (double)best);
		}
	}
	free(taken);
	return 0;
}

int aclnnTopkGetWorkspaceSize(void *self, int64_t k, int64_t dim, _Bool largest, _Bool sorted, void *values, void *indices,
	uint64_t *ws, void **exec) {
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[3] = {self, values, indices};
	if ((rc = check_tensors_i("aclnnTopk", 3, ts, 4))) return rc;
	const fk_tensor *x = self, *v = values, *i = indices;
	if (x->nd != 2 || (dim != 1 && dim != -1) || !sorted || i->dtype != 9 || v->nd != 2 || i->nd != 2 || v->dims[0] != x->dims[0] ||
		i->dims[0] != x->dims[0] || v->dims[1] != k || i->dims[1] != k || k < 1 || k > x->dims[1]) {
		fk_set_error("aclnnTopk: the last dimension of a 2-D tensor, sorted, int64 indices [rows, k] expected");
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *x;
	e->t[1] = *v;
	e->t[2] = *i;
	e->iattr = largest ? 1 : 0;
	e->run = run_topk;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnTopk(void *ws, uint64_t wsSize, void *exec, void *stream) { return fk_launch("aclnnTopk", ws, wsSize, exec, stream); }

int aclnnLogGetWorkspaceSize(void *self, void *out, uint64_t *ws, void **exec) {
	return prepare_elementwise("aclnnLog", OP_LOG, self, NULL, out, 0, 0, ws, exec);
}

int aclnnLog(void *ws, uint64_t wsSize, void *exec, void *stream) { return fk_launch("aclnnLog", ws, wsSize, exec, stream); }

// ---- Amax over the last dimension of a 2-D tensor; out has one value per
// row ([rows, 1] with keepDim, [rows] without).

static int run_amax(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *x = &e->t[0], *o = &e->t[1];
	int64_t R = x->dims[0], N = x->dims[1];
	for (int64_t r = 0; r < R; r++) {
		double m = -INFINITY;
		for (int64_t i = 0; i < N; i++) {
			double v = fk_get(x, x->offset + r * x->strides[0] + i * x->strides[1]);
			if (v > m || isnan(v)) m = v;
		}
		fk_put(o, o->offset + r * o->strides[0], m);
	}
	return 0;
}

int aclnnAmaxGetWorkspaceSize(void *self, void *dim, _Bool keepDim, void *out, uint64_t *ws, void **exec) {
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[2] = {self, out};
	if ((rc = check_tensors("aclnnAmax", 2, ts))) return rc;
	uint64_t n;
	const int64_t *v;
	if (fk_int_array_get(dim, &n, &v)) {
		fk_set_error("aclnnAmax: dim is not a live array");
		return ACLNN_ERR_PARAM_NULLPTR;
	}
	const fk_tensor *x = self, *o = out;
	if (x->nd != 2 || n != 1 || (v[0] != 1 && v[0] != -1) || o->nd != (keepDim ? 2 : 1) || o->dims[0] != x->dims[0] ||
		(keepDim && o->dims[1] != 1) || x->dims[1] < 1) {
		fk_set_error("aclnnAmax: the last dimension of a 2-D tensor into [rows, 1] (keepDim) or [rows] expected");
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *x;
	e->t[1] = *o;
	e->run = run_amax;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnAmax(void *ws, uint64_t wsSize, void *exec, void *stream) { return fk_launch("aclnnAmax", ws, wsSize, exec, stream); }

// ---- MoeInitRoutingV2, dropless (dropPadMode 0, activeNum 0) with the
// cumulative count per expert (expertTokensCountOrCumsumFlag 1): the
// (token, slot) pairs sorted by expert, stably; expandedX[i] is the row of
// the i-th pair's token and expandedRowIdx[pair] its place i.

static int run_init_routing(fk_exec *e, void *ws) {
	(void)ws;
	const fk_tensor *x = &e->t[0], *idx = &e->t[1], *ex = &e->t[2], *ri = &e->t[3], *cs = &e->t[4];
	int64_t T = idx->dims[0], K = idx->dims[1], M = T * K, H = x->dims[1], E = (int64_t)e->attr;
	int64_t *next = calloc((size_t)E + 1, sizeof *next);
	for (int64_t p = 0; p < M; p++) {
		int64_t v = (int64_t)fk_get(idx, idx->offset + (p / K) * idx->strides[0] + (p % K) * idx->strides[1]);
		if (v < 0 || v >= E) {
			free(next);
			fk_set_error("aclnnMoeInitRoutingV2: expert %lld outside [0, %lld)", (long long)v, (long long)E);
			return ACL_ERROR_RT_AICORE_EXCEPTION;
		}
		next[v + 1]++;
	}
	for (int64_t v = 0; v < E; v++) {
		next[v + 1] += next[v];
		fk_put(cs, cs->offset + v * cs->strides[0], (double)next[v + 1]);
	}
	for (int64_t p = 0; p < M; p++) {
		int64_t v = (int64_t)fk_get(idx, idx->offset + (p / K) * idx->strides[0] + (p % K) * idx->strides[1]);
		int64_t i = next[v]++;
		fk_put(ri, ri->offset + p * ri->strides[0], (double)i);
		for (int64_t h = 0; h < H; h++)
			fk_put(ex, ex->offset + i * ex->strides[0] + h * ex->strides[1],
				fk_get(x, x->offset + (p / K) * x->strides[0] + h * x->strides[1]));
	}
	free(next);
	return 0;
}

int aclnnMoeInitRoutingV2GetWorkspaceSize(void *x, void *expertIdx, int64_t activeNum, int64_t expertCapacity,
	int64_t expertNum, int64_t dropPadMode, int64_t countFlag, _Bool beforeCapacityFlag, void *expandedX,
	void *expandedRowIdx, void *countOrCumsum, void *beforeCapacity, uint64_t *ws, void **exec) {
	(void)expertCapacity;
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[5] = {x, expertIdx, expandedX, expandedRowIdx, countOrCumsum};
	if ((rc = check_tensors_i("aclnnMoeInitRoutingV2", 5, ts, 2 | 8 | 16))) return rc;
	const fk_tensor *tx = x, *ti = expertIdx, *te = expandedX, *tr = expandedRowIdx, *tc = countOrCumsum;
	if (activeNum != 0 || dropPadMode != 0 || countFlag != 1 || beforeCapacityFlag || beforeCapacity != NULL) {
		fk_set_error("aclnnMoeInitRoutingV2: the fake runs the dropless form with cumulative counts only");
		return ACLNN_ERR_PARAM_INVALID;
	}
	if (tx->nd != 2 || ti->nd != 2 || ti->dtype != 3 || ti->dims[0] != tx->dims[0] || te->nd != 2 ||
		te->dims[0] != ti->dims[0] * ti->dims[1] || te->dims[1] != tx->dims[1] || te->dtype != tx->dtype || tr->nd != 1 ||
		tr->dtype != 3 || tr->dims[0] != te->dims[0] || tc->nd != 1 || tc->dtype != 3 || tc->dims[0] != expertNum ||
		expertNum <= 0) {
		fk_set_error("aclnnMoeInitRoutingV2: shapes x [T, H], expertIdx int32 [T, K], expandedX [T*K, H], "
			"expandedRowIdx int32 [T*K], cumsum int32 [expertNum] expected");
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *tx;
	e->t[1] = *ti;
	e->t[2] = *te;
	e->t[3] = *tr;
	e->t[4] = *tc;
	e->attr = (double)expertNum;
	e->run = run_init_routing;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnMoeInitRoutingV2(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnMoeInitRoutingV2", ws, wsSize, exec, stream);
}

// ---- GroupedMatmulV4 with single tensors grouped along M (groupType 0,
// splitItem 2 or 3): out[m] = x[m] · weight[g] for the rows m of group g,
// groupList int64 cumulative (groupListType 0) or counts (1); the groups
// must cover x's rows exactly, as the documentation requires.

static int run_gmm(fk_exec *e, void *ws) {
	const fk_tensor *x = &e->t[0], *w = &e->t[1], *gl = &e->t[2], *o = &e->t[3];
	int64_t M = x->dims[0], K = x->dims[1], G = w->dims[0], N = w->dims[2];
	float *acc = ws;
	int64_t lo = 0;
	for (int64_t g = 0; g < G; g++) {
		int64_t v = (int64_t)fk_get(gl, gl->offset + g * gl->strides[0]);
		int64_t hi = e->iattr == 0 ? v : lo + v;
		if (hi < lo || hi > M) {
			fk_set_error("aclnnGroupedMatmulV4: group %lld ends at row %lld after %lld (x has %lld rows)", (long long)g,
				(long long)hi, (long long)lo, (long long)M);
			return ACL_ERROR_RT_AICORE_EXCEPTION;
		}
		for (int64_t m = lo; m < hi; m++) {
			for (int64_t n = 0; n < N; n++) {
				double s = 0;
				for (int64_t k = 0; k < K; k++)
					s += fk_get(x, x->offset + m * x->strides[0] + k * x->strides[1]) *
						fk_get(w, w->offset + g * w->strides[0] + k * w->strides[1] + n * w->strides[2]);
				acc[n] = (float)s;
			}
			for (int64_t n = 0; n < N; n++) fk_put(o, o->offset + m * o->strides[0] + n * o->strides[1], acc[n]);
		}
		lo = hi;
	}
	if (lo != M) {
		fk_set_error("aclnnGroupedMatmulV4: the groups cover %lld of x's %lld rows", (long long)lo, (long long)M);
		return ACL_ERROR_RT_AICORE_EXCEPTION;
	}
	return 0;
}

// one returns the single tensor of a list of one.
static const fk_tensor *one(const char *op, const char *name, const void *list) {
	uint64_t n;
	const void *const *ts;
	if (fk_tensor_list_get(list, &n, &ts) != 0) {
		fk_set_error("%s: %s is not a live tensor list", op, name);
		return NULL;
	}
	if (n != 1 || !fk_tensor_ok(ts[0])) {
		fk_set_error("%s: %s holds %llu tensors (the fake takes single tensors)", op, name, (unsigned long long)n);
		return NULL;
	}
	return ts[0];
}

int aclnnGroupedMatmulV4GetWorkspaceSize(void *x, void *weight, void *bias, void *scale, void *offset, void *aqScale,
	void *aqOffset, void *ptScale, void *groupList, void *actIn, void *actQScale, void *actQOffset, int64_t splitItem,
	int64_t groupType, int64_t groupListType, int64_t actType, void *out, void *actOut, void *dynQScaleOut, uint64_t *ws,
	void **exec) {
	static const char *op = "aclnnGroupedMatmulV4";
	int rc = fk_need_context();
	if (rc) return rc;
	if (bias || scale || offset || aqScale || aqOffset || ptScale || actIn || actQScale || actQOffset || actOut ||
		dynQScaleOut || actType != 0) {
		fk_set_error("%s: the fake takes no bias, quantisation or activation", op);
		return ACLNN_ERR_PARAM_INVALID;
	}
	if ((splitItem != 2 && splitItem != 3) || groupType != 0 || (groupListType != 0 && groupListType != 1)) {
		fk_set_error("%s: splitItem %lld groupType %lld groupListType %lld (the fake takes 2|3, 0, 0|1)", op,
			(long long)splitItem, (long long)groupType, (long long)groupListType);
		return ACLNN_ERR_PARAM_INVALID;
	}
	const fk_tensor *tx = one(op, "x", x), *tw = one(op, "weight", weight), *to = one(op, "out", out);
	if (tx == NULL || tw == NULL || to == NULL) return ACLNN_ERR_PARAM_INVALID;
	const fk_tensor *tg = groupList;
	if (!fk_tensor_ok(tg) || tg->dtype != 9 || tg->nd != 1) {
		fk_set_error("%s: groupList must be an int64 vector", op);
		return ACLNN_ERR_PARAM_INVALID;
	}
	if (tx->nd != 2 || tw->nd != 3 || to->nd != 2 || tx->dims[1] != tw->dims[1] || to->dims[0] != tx->dims[0] ||
		to->dims[1] != tw->dims[2] || tg->dims[0] != tw->dims[0] || tw->dims[0] > 1024 || tx->format != 2 ||
		to->format != 2 || (tx->dtype != 0 && tx->dtype != 27) || to->dtype != tx->dtype ||
		(tw->dtype != 0 && tw->dtype != 27)) {
		fk_set_error("%s: x [M, K], weight [G, K, N], out [M, N], groupList [G] (G <= 1024) expected", op);
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *tx;
	e->t[1] = *tw;
	e->t[2] = *tg;
	e->t[3] = *to;
	e->iattr = (int)groupListType;
	e->run = run_gmm;
	*ws = (uint64_t)tw->dims[2] * sizeof(float);
	*exec = e;
	return 0;
}

int aclnnGroupedMatmulV4(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnGroupedMatmulV4", ws, wsSize, exec, stream);
}

// ---- The fused DSA operators, in the one form k3 calls them (the
// layouts, modes and limits it passes are checked, so that the shim's
// argument order is): LightningIndexer over BSND queries of one batch and
// a PA_BSND key cache, sparse mode 3; SparseFlashAttention in MLA-absorb
// mode over TND queries and PA_BSND caches. Both compute in double.

static int64_t block_row(const fk_tensor *bt, const fk_tensor *cache, int64_t s, int64_t bs, const char *op) {
	int64_t blk = (int64_t)fk_get(bt, bt->offset + s / bs);
	if (blk < 0 || blk >= cache->dims[0]) {
		fk_set_error("%s: block %lld outside [0, %lld)", op, (long long)blk, (long long)cache->dims[0]);
		return -1;
	}
	return blk * bs + s % bs;
}

static int run_li(fk_exec *e, void *ws) {
	(void)ws;
	const char *op = "aclnnLightningIndexer";
	const fk_tensor *q = &e->t[0], *k = &e->t[1], *w = &e->t[2], *kl = &e->t[3], *bt = &e->t[4], *ix = &e->t[5];
	int64_t S1 = q->dims[1], N1 = q->dims[2], D = q->dims[3], bs = k->dims[1], K = ix->dims[3], P = bt->dims[1];
	int64_t sk = (int64_t)fk_get(kl, kl->offset);
	if (sk < 0 || sk > P * bs) {
		fk_set_error("%s: %lld keys in %lld blocks of %lld", op, (long long)sk, (long long)P, (long long)bs);
		return ACL_ERROR_RT_AICORE_EXCEPTION;
	}
	double *score = malloc(sizeof(double) * (sk + 1));
	int64_t *pos = malloc(sizeof(int64_t) * (sk + 1));
	char *taken = malloc(sk + 1);
	int rc = 0;
	for (int64_t i = 0; i < S1 && rc == 0; i++) {
		int64_t n = 0;
		for (int64_t s = 0; s < sk && s <= sk - S1 + i; s++) {
			int64_t r = block_row(bt, k, s, bs, op);
			if (r < 0) {
				rc = ACL_ERROR_RT_AICORE_EXCEPTION;
				break;
			}
			double sc = 0;
			for (int64_t h = 0; h < N1; h++) {
				double dot = 0;
				for (int64_t c = 0; c < D; c++) dot += fk_get(q, q->offset + (i * N1 + h) * D + c) * fk_get(k, k->offset + r * D + c);
				sc += fk_get(w, w->offset + i * N1 + h) * (dot > 0 ? dot : 0);
			}
			score[n] = sc;
			pos[n++] = s;
		}
		memset(taken, 0, sk + 1);
		for (int64_t j = 0; j < K; j++) {
			int64_t best = -1;
			for (int64_t c = 0; c < n; c++) // the best score, the lower position on a tie
				if (!taken[c] && (best < 0 || score[c] > score[best])) best = c;
			if (best >= 0) taken[best] = 1;
			fk_put(ix, ix->offset + i * K + j, best < 0 ? -1 : (double)pos[best]);
		}
	}
	free(score);
	free(pos);
	free(taken);
	return rc;
}

static int is_int32(const fk_tensor *t) { return t->dtype == 3; }

int aclnnLightningIndexerGetWorkspaceSize(void *q, void *k, void *weights, void *actSeqQ, void *actSeqK, void *blockTable,
	const char *layoutQ, const char *layoutK, int64_t sparseCount, int64_t sparseMode, int64_t preTokens, int64_t nextTokens,
	_Bool returnValue, void *indices, void *values, uint64_t *ws, void **exec) {
	const char *op = "aclnnLightningIndexer";
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[6] = {q, k, weights, actSeqK, blockTable, indices};
	if ((rc = check_tensors_i(op, 6, ts, 8 | 16 | 32))) return rc;
	if (actSeqQ != NULL || values != NULL || returnValue || strcmp(layoutQ, "BSND") != 0 || strcmp(layoutK, "PA_BSND") != 0 ||
		sparseMode != 3 || preTokens != INT64_MAX || nextTokens != INT64_MAX) {
		fk_set_error("%s: the fake takes layouts BSND and PA_BSND, sparse mode 3, no token limits, no query lengths and no "
			"values (got %s, %s, mode %lld)", op, layoutQ, layoutK, (long long)sparseMode);
		return ACLNN_ERR_PARAM_INVALID;
	}
	const fk_tensor *tq = q, *tk = k, *tw = weights, *tl = actSeqK, *tb = blockTable, *ti = indices;
	int bad = tq->nd != 4 || tk->nd != 4 || tw->nd != 3 || tl->nd != 1 || tb->nd != 2 || ti->nd != 4 || tq->dims[0] != 1 ||
		tq->dtype != 27 || tk->dtype != 27 || tw->dtype != 27 || tq->dims[3] != 128 || tq->dims[2] > 64 ||
		tk->dims[2] != 1 || tk->dims[3] != 128 || tk->dims[1] % 16 != 0 || tk->dims[1] > 1024 || tw->dims[0] != 1 ||
		tw->dims[1] != tq->dims[1] || tw->dims[2] != tq->dims[2] || tl->dims[0] != 1 || !is_int32(tl) || tb->dims[0] != 1 ||
		!is_int32(tb) || !is_int32(ti) || ti->dims[0] != 1 || ti->dims[1] != tq->dims[1] || ti->dims[2] != 1 ||
		ti->dims[3] != sparseCount || !(sparseCount >= 1 && sparseCount <= 2048) || !contiguous(tq) || !contiguous(tk) ||
		!contiguous(tw) || !contiguous(ti);
	if (bad) {
		fk_set_error("%s: bf16 q [1, S1, N1 <= 64, 128], k [blocks, 16k <= 1024, 1, 128], weights [1, S1, N1], int32 key "
			"count [1], block table [1, P] and indices [1, S1, 1, sparse count] expected", op);
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	e->t[0] = *tq;
	e->t[1] = *tk;
	e->t[2] = *tw;
	e->t[3] = *tl;
	e->t[4] = *tb;
	e->t[5] = *ti;
	e->run = run_li;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnLightningIndexer(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnLightningIndexer", ws, wsSize, exec, stream);
}

static int run_sfa(fk_exec *e, void *ws) {
	(void)ws;
	const char *op = "aclnnSparseFlashAttention";
	const fk_tensor *q = &e->t[0], *kv = &e->t[1], *ix = &e->t[2], *bt = &e->t[3], *sq = &e->t[4], *skv = &e->t[5];
	const fk_tensor *qr = &e->t[6], *kr = &e->t[7], *o = &e->t[8], *mx = &e->t[9], *sm = &e->t[10];
	int64_t T = q->dims[0], N = q->dims[1], Dc = q->dims[2], Dr = qr->dims[2], bs = kv->dims[1], K = ix->dims[2], P = bt->dims[1];
	int64_t nq = (int64_t)fk_get(sq, sq->offset), sk = (int64_t)fk_get(skv, skv->offset);
	if (nq != T || sk < 0 || sk > P * bs) {
		fk_set_error("%s: %lld queries of %lld, %lld keys in %lld blocks of %lld", op, (long long)nq, (long long)T,
			(long long)sk, (long long)P, (long long)bs);
		return ACL_ERROR_RT_AICORE_EXCEPTION;
	}
	int64_t *rows = malloc(sizeof(int64_t) * K);
	double *z = malloc(sizeof(double) * K), *acc = malloc(sizeof(double) * Dc);
	int rc = 0;
	for (int64_t t = 0; t < T && rc == 0; t++) {
		int64_t n = 0, lim = sk - T + t < sk - 1 ? sk - T + t : sk - 1;
		for (int64_t j = 0; j < K; j++) {
			int64_t s = (int64_t)fk_get(ix, ix->offset + t * K + j);
			if (s < 0 || s > lim) continue;
			int64_t r = block_row(bt, kv, s, bs, op);
			if (r < 0) {
				rc = ACL_ERROR_RT_AICORE_EXCEPTION;
				break;
			}
			rows[n++] = r;
		}
		for (int64_t h = 0; h < N && rc == 0; h++) {
			double m = -INFINITY, sum = 0;
			for (int64_t j = 0; j < n; j++) {
				double dot = 0;
				for (int64_t c = 0; c < Dc; c++)
					dot += fk_get(q, q->offset + (t * N + h) * Dc + c) * fk_get(kv, kv->offset + rows[j] * Dc + c);
				for (int64_t c = 0; c < Dr; c++)
					dot += fk_get(qr, qr->offset + (t * N + h) * Dr + c) * fk_get(kr, kr->offset + rows[j] * Dr + c);
				z[j] = e->attr * dot;
				if (z[j] > m) m = z[j];
			}
			memset(acc, 0, sizeof(double) * Dc);
			for (int64_t j = 0; j < n; j++) {
				double p = exp(z[j] - m);
				sum += p;
				for (int64_t c = 0; c < Dc; c++) acc[c] += p * fk_get(kv, kv->offset + rows[j] * Dc + c);
			}
			for (int64_t c = 0; c < Dc; c++) fk_put(o, o->offset + (t * N + h) * Dc + c, sum > 0 ? acc[c] / sum : 0);
			fk_put(mx, mx->offset + t * N + h, m);
			fk_put(sm, sm->offset + t * N + h, sum);
		}
	}
	free(rows);
	free(z);
	free(acc);
	return rc;
}

int aclnnSparseFlashAttentionGetWorkspaceSize(void *q, void *k, void *v, void *indices, void *blockTable, void *actSeqQ,
	void *actSeqKV, void *qRope, void *kRope, double scale, int64_t sparseBlockSize, const char *layoutQ,
	const char *layoutKV, int64_t sparseMode, int64_t preTokens, int64_t nextTokens, int64_t attentionMode,
	_Bool returnSoftmaxLse, void *out, void *softmaxMax, void *softmaxSum, uint64_t *ws, void **exec) {
	const char *op = "aclnnSparseFlashAttention";
	int rc = fk_need_context();
	if (rc) return rc;
	void *ts[11] = {q, k, indices, blockTable, actSeqQ, actSeqKV, qRope, kRope, out, softmaxMax, softmaxSum};
	if ((rc = check_tensors_i(op, 11, ts, 4 | 8 | 16 | 32))) return rc;
	if (v != k || sparseBlockSize != 1 || strcmp(layoutQ, "TND") != 0 || strcmp(layoutKV, "PA_BSND") != 0 || sparseMode != 3 ||
		preTokens != INT64_MAX || nextTokens != INT64_MAX || attentionMode != 2 || !returnSoftmaxLse) {
		fk_set_error("%s: the fake takes the values as the keys, sparse blocks of 1, layouts TND and PA_BSND, sparse mode 3, "
			"no token limits, attention mode 2 and the softmax returned (got %s, %s, mode %lld, attention mode %lld)", op,
			layoutQ, layoutKV, (long long)sparseMode, (long long)attentionMode);
		return ACLNN_ERR_PARAM_INVALID;
	}
	const fk_tensor *tq = q, *tk = k, *ti = indices, *tb = blockTable, *tsq = actSeqQ, *tskv = actSeqKV, *tqr = qRope;
	const fk_tensor *tkr = kRope, *to = out, *tmx = softmaxMax, *tsm = softmaxSum;
	int bad = tq->nd != 3 || tk->nd != 4 || ti->nd != 3 || tb->nd != 2 || tsq->nd != 1 || tskv->nd != 1 || tqr->nd != 3 ||
		tkr->nd != 4 || to->nd != 3 || tmx->nd != 3 || tsm->nd != 3;
	bad = bad || tq->dtype != 27 || tk->dtype != 27 || tqr->dtype != 27 || tkr->dtype != 27 || to->dtype != 27 ||
		tmx->dtype != 0 || tsm->dtype != 0 || !is_int32(ti) || !is_int32(tb) || !is_int32(tsq) || !is_int32(tskv);
	if (!bad) {
		int64_t T = tq->dims[0], N = tq->dims[1], Dc = tq->dims[2], Dr = tqr->dims[2];
		bad = tk->dims[2] != 1 || tk->dims[3] != Dc || tkr->dims[0] != tk->dims[0] || tkr->dims[1] != tk->dims[1] ||
			tkr->dims[2] != 1 || tkr->dims[3] != Dr || tqr->dims[0] != T || tqr->dims[1] != N || ti->dims[0] != T ||
			ti->dims[1] != 1 || tb->dims[0] != 1 || tsq->dims[0] != 1 || tskv->dims[0] != 1 || to->dims[0] != T ||
			to->dims[1] != N || to->dims[2] != Dc || tmx->dims[0] != 1 || tmx->dims[1] != T || tmx->dims[2] != N ||
			tsm->dims[0] != 1 || tsm->dims[1] != T || tsm->dims[2] != N;
		for (int i = 0; i < 11 && !bad; i++) bad = !contiguous(ts[i]);
	}
	if (bad) {
		fk_set_error("%s: bf16 q [T, N, Dc], q rope [T, N, Dr], kv [blocks, bs, 1, Dc], k rope [blocks, bs, 1, Dr] and out "
			"[T, N, Dc], int32 indices [T, 1, K], block table [1, P] and lengths [1], float max and sum [1, T, N] expected", op);
		return ACLNN_ERR_PARAM_INVALID;
	}
	fk_exec *e = fk_exec_new();
	for (int i = 0; i < 11; i++) e->t[i] = *(fk_tensor *)ts[i];
	e->attr = scale;
	e->run = run_sfa;
	*ws = 0;
	*exec = e;
	return 0;
}

int aclnnSparseFlashAttention(void *ws, uint64_t wsSize, void *exec, void *stream) {
	return fk_launch("aclnnSparseFlashAttention", ws, wsSize, exec, stream);
}
