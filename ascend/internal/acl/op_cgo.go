//go:build ascend && cgo

package acl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"math"
	"slices"
	"unsafe"
)

// Tensor is an aclTensor descriptor. It must outlive the operators
// prepared with it.
type Tensor struct {
	ctx *Context
	t   unsafe.Pointer
	// d is the description it was made from, for copies that a tensor
	// list owns (aclDestroyTensorList destroys its tensors).
	d TensorDesc
}

// NewTensor creates a descriptor.
func (c *Context) NewTensor(d TensorDesc) (*Tensor, error) {
	if len(d.Dims) == 0 {
		return nil, fmt.Errorf("%w: tensor with no dimensions", ErrInvalidArgument)
	}
	strides := d.Strides
	if strides == nil {
		strides = make([]int64, len(d.Dims))
		s := int64(1)
		for i := len(d.Dims) - 1; i >= 0; i-- {
			strides[i] = s
			s *= d.Dims[i]
		}
	}
	if len(strides) != len(d.Dims) {
		return nil, fmt.Errorf("%w: %d strides for %d dimensions", ErrInvalidArgument, len(strides), len(d.Dims))
	}
	storage := d.StorageDims
	if storage == nil {
		storage = d.Dims
	}
	format := d.Format
	if format == 0 && d.StorageDims == nil {
		format = FormatND
	}
	var e C.k3_err
	t := C.k3_tensor_create(c.c, (*C.int64_t)(unsafe.Pointer(&d.Dims[0])), C.uint64_t(len(d.Dims)), C.int(d.DType),
		(*C.int64_t)(unsafe.Pointer(&strides[0])), C.int64_t(d.Offset), C.int(format),
		(*C.int64_t)(unsafe.Pointer(&storage[0])), C.uint64_t(len(storage)), ptr(d.Data), &e)
	if t == nil {
		return nil, errOf(&e)
	}
	d.Dims, d.Strides, d.StorageDims, d.Format = slices.Clone(d.Dims), slices.Clone(strides), slices.Clone(storage), format
	return &Tensor{ctx: c, t: t, d: d}, nil
}

// Destroy releases the descriptor (not the memory it describes).
func (t *Tensor) Destroy() error {
	if t.t == nil {
		return nil
	}
	var e C.k3_err
	if C.k3_tensor_destroy(t.ctx.c, t.t, &e) != 0 {
		return errOf(&e)
	}
	t.t = nil
	return nil
}

// Op is an operator after phase 1 of aclnn's two-phase protocol: its
// executor and the workspace size phase 2 needs.
type Op struct {
	ctx           *Context
	api           string
	launch        unsafe.Pointer
	exec          unsafe.Pointer
	WorkspaceSize int
	repeatable    bool
	// lists are tensor lists the executor reads, destroyed with it.
	lists []unsafe.Pointer
}

// Launch queues phase 2 on s with a workspace of at least WorkspaceSize
// bytes, which must stay allocated until the stream has run it. An
// executor that is not repeatable is consumed by its launch.
func (o *Op) Launch(s *Stream, ws DevPtr) error {
	if o.exec == nil {
		return fmt.Errorf("%w: %s launched after its executor was consumed or destroyed", ErrInvalidArgument, o.api)
	}
	if o.WorkspaceSize > 0 && ws.IsNil() {
		return fmt.Errorf("%w: %s needs a %d-byte workspace", ErrInvalidArgument, o.api, o.WorkspaceSize)
	}
	capi := C.CString(o.api)
	defer C.free(unsafe.Pointer(capi))
	var e C.k3_err
	rc := C.k3_op_launch(o.ctx.c, o.launch, capi, ptr(ws), C.uint64_t(o.WorkspaceSize), o.exec, s.s, &e)
	if !o.repeatable {
		o.exec = nil
		o.ctx.destroyLists(o.lists)
		o.lists = nil
	}
	if rc != 0 {
		return errOf(&e)
	}
	return nil
}

// SetRepeatable lets the executor be launched any number of times, for
// static shapes such as a captured decode step; Destroy then frees it.
func (o *Op) SetRepeatable() error {
	var e C.k3_err
	if C.k3_executor_repeatable(o.ctx.c, o.exec, &e) != 0 {
		return errOf(&e)
	}
	o.repeatable = true
	return nil
}

// Destroy frees a repeatable executor; for others it does nothing after
// their launch.
func (o *Op) Destroy() error {
	if o.exec == nil || !o.repeatable {
		return nil
	}
	var e C.k3_err
	if C.k3_executor_destroy(o.ctx.c, o.exec, &e) != 0 {
		return errOf(&e)
	}
	o.exec = nil
	o.ctx.destroyLists(o.lists)
	o.lists = nil
	return nil
}

func (c *Context) newOp(api string, launch, exec unsafe.Pointer, ws C.uint64_t) *Op {
	return &Op{ctx: c, api: api, launch: launch, exec: exec, WorkspaceSize: int(ws)}
}

// Scalar is an aclScalar, an operator attribute such as Add's alpha.
type Scalar struct {
	ctx *Context
	s   unsafe.Pointer
}

// NewScalar makes a Float scalar of value v.
func (c *Context) NewScalar(v float32) (*Scalar, error) {
	p := (*C.float)(C.malloc(4)) // aclCreateScalar reads the value through a pointer
	defer C.free(unsafe.Pointer(p))
	*p = C.float(v)
	var e C.k3_err
	sc := C.k3_scalar_create(c.c, unsafe.Pointer(p), C.int(Float), &e)
	if sc == nil {
		return nil, errOf(&e)
	}
	return &Scalar{ctx: c, s: sc}, nil
}

// Destroy releases the scalar.
func (s *Scalar) Destroy() error {
	if s.s == nil {
		return nil
	}
	var e C.k3_err
	if C.k3_scalar_destroy(s.ctx.c, s.s, &e) != 0 {
		return errOf(&e)
	}
	s.s = nil
	return nil
}

// phase1 calls an operator's phase 1 through call, which receives the
// resolved GetWorkspaceSize pointer and its name and fills ws, exec and e.
type phase1 func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int

func (c *Context) prepare(name string, call phase1) (*Op, error) {
	prep, launch, api, err := c.lib.operator(name, "")
	if err != nil {
		return nil, err
	}
	capi := C.CString(api + "GetWorkspaceSize")
	defer C.free(unsafe.Pointer(capi))
	var ws C.uint64_t
	var exec unsafe.Pointer
	var e C.k3_err
	if call(prep, capi, &ws, &exec, &e) != 0 {
		return nil, errOf(&e)
	}
	return c.newOp(api, launch, exec, ws), nil
}

// Unary prepares an operator of the form op(self, out): "aclnnSilu",
// "aclnnSigmoid".
func (c *Context) Unary(name string, x, out *Tensor) (*Op, error) {
	return c.prepare(name, func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_tt(c.c, fn, api, x.t, out.t, ws, exec, e)
	})
}

// Binary prepares an operator of the form op(a, b, out): "aclnnMul"
// (broadcasting), "aclnnEmbedding" (weight, indices).
func (c *Context) Binary(name string, a, b, out *Tensor) (*Op, error) {
	return c.prepare(name, func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_ttt(c.c, fn, api, a.t, b.t, out.t, ws, exec, e)
	})
}

// Matmul prepares out = x · w with aclnnMatmul, or a batch of products
// with name "aclnnBatchMatMul"; either operand may be a strided view.
// cubeMath is aclnn's cubeMathType (0: keep the inputs' precision).
func (c *Context) Matmul(name string, x, w, out *Tensor, cubeMath int8) (*Op, error) {
	return c.prepare(name, func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_ttt_i8(c.c, fn, api, x.t, w.t, out.t, C.int8_t(cubeMath), ws, exec, e)
	})
}

// Add prepares out = a + alpha·b (aclnnAdd, broadcasting).
func (c *Context) Add(a, b *Tensor, alpha *Scalar, out *Tensor) (*Op, error) {
	return c.prepare("aclnnAdd", func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_ttst(c.c, fn, api, a.t, b.t, alpha.s, out.t, ws, exec, e)
	})
}

// Softplus prepares out = log(1 + e^(beta·x)) / beta, x itself where
// beta·x > threshold (aclnnSoftplus).
func (c *Context) Softplus(x *Tensor, beta, threshold *Scalar, out *Tensor) (*Op, error) {
	return c.prepare("aclnnSoftplus", func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_tsst(c.c, fn, api, x.t, beta.s, threshold.s, out.t, ws, exec, e)
	})
}

// Fill prepares setting every element of x to value
// (aclnnInplaceFillScalar).
func (c *Context) Fill(x *Tensor, value *Scalar) (*Op, error) {
	return c.prepare("aclnnInplaceFillScalar", func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_ts(c.c, fn, api, x.t, value.s, ws, exec, e)
	})
}

// Cast prepares out = x converted to dt (aclnnCast).
func (c *Context) Cast(x *Tensor, dt DataType, out *Tensor) (*Op, error) {
	return c.prepare("aclnnCast", func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_tit(c.c, fn, api, x.t, C.int(dt), out.t, ws, exec, e)
	})
}

// RMSNorm prepares y = x / sqrt(mean(x²) + eps) · gamma over the last
// dimension, with the reciprocal roots in rstd (aclnnRmsNorm).
func (c *Context) RMSNorm(x, gamma *Tensor, eps float64, y, rstd *Tensor) (*Op, error) {
	return c.prepare("aclnnRmsNorm", func(fn unsafe.Pointer, _ *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_rmsnorm_prepare(c.c, fn, x.t, gamma.t, C.double(eps), y.t, rstd.t, ws, exec, e)
	})
}

// LayerNorm prepares out = (x - mean) / sqrt(var + eps) · w + b over the
// last dimension (aclnnLayerNorm, normalizedShape [D]); mean and rstd get
// one value per row.
func (c *Context) LayerNorm(x, w, b *Tensor, eps float64, out, mean, rstd *Tensor, d int) (*Op, error) {
	shape := []int64{int64(d)}
	var e C.k3_err
	arr := C.k3_int_array_create(c.c, (*C.int64_t)(unsafe.Pointer(&shape[0])), 1, &e)
	if arr == nil {
		return nil, errOf(&e)
	}
	defer C.k3_int_array_destroy(c.c, arr, &e)
	return c.prepare("aclnnLayerNorm", func(fn unsafe.Pointer, _ *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_layernorm_prepare(c.c, fn, x.t, arr, w.t, b.t, C.double(eps), out.t, mean.t, rstd.t, ws, exec, e)
	})
}

// MatmulWeightSize is the number of elements a matmul weight of dims
// takes in the cube unit's private format (aclnnCalculateMatmulWeightSizeV2).
func (c *Context) MatmulWeightSize(dims []int64, dt DataType) (int, error) {
	name := "aclnnCalculateMatmulWeightSizeV2"
	fn := c.lib.symbol(name)
	if fn == nil || len(dims) == 0 {
		return 0, &Error{API: name, Lib: ACLNN, Code: 561003, Msg: fmt.Sprintf("%s not found in the operator libraries, or no dimensions", name)}
	}
	var n C.uint64_t
	var e C.k3_err
	if C.k3_weight_size(c.c, fn, (*C.int64_t)(unsafe.Pointer(&dims[0])), C.uint64_t(len(dims)), C.int(dt), &n, &e) != 0 {
		return 0, errOf(&e)
	}
	return int(n), nil
}

// TransMatmulWeight prepares the in-place conversion of the ND weight w
// to the cube unit's private format (aclnnTransMatmulWeight); w's buffer
// must hold MatmulWeightSize elements.
func (c *Context) TransMatmulWeight(w *Tensor) (*Op, error) {
	return c.prepare("aclnnTransMatmulWeight", func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_t(c.c, fn, api, w.t, ws, exec, e)
	})
}

// Muls prepares out = x · v (aclnnMuls).
func (c *Context) Muls(x *Tensor, v *Scalar, out *Tensor) (*Op, error) {
	return c.prepare("aclnnMuls", func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_tst(c.c, fn, api, x.t, v.s, out.t, ws, exec, e)
	})
}

// InplaceCopy prepares dst = src, any strides (aclnnInplaceCopy).
func (c *Context) InplaceCopy(dst, src *Tensor) (*Op, error) {
	return c.prepare("aclnnInplaceCopy", func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_tt(c.c, fn, api, dst.t, src.t, ws, exec, e)
	})
}

func tp(t *Tensor) unsafe.Pointer {
	if t == nil {
		return nil
	}
	return t.t
}

// RecurrentGatedDeltaRule prepares the gated delta rule token by token
// (aclnnRecurrentGatedDeltaRule): per head, S ← S·Diag(exp(g + gk)),
// S ← S + β(v − S k)kᵀ, out = scale · S q, with state [blocks, Nv, Dv,
// Dk], each sequence's tokens (actual lengths seqLens) reading and
// writing the state block stateIdx names per token. g (per head) and gk
// (per channel) may be nil.
func (c *Context) RecurrentGatedDeltaRule(q, k, v, beta, state, seqLens, stateIdx, g, gk *Tensor, scale float32, out *Tensor) (*Op, error) {
	return c.prepare("aclnnRecurrentGatedDeltaRule", func(fn unsafe.Pointer, _ *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_rgdr_prepare(c.c, fn, q.t, k.t, v.t, beta.t, state.t, seqLens.t, stateIdx.t, tp(g), tp(gk), nil,
			C.float(scale), out.t, ws, exec, e)
	})
}

// IndexSelect prepares out = the slices of x at index along dim
// (aclnnIndexSelect).
func (c *Context) IndexSelect(x *Tensor, dim int, index, out *Tensor) (*Op, error) {
	return c.prepare("aclnnIndexSelect", func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_tltt(c.c, fn, api, x.t, C.int64_t(dim), index.t, out.t, ws, exec, e)
	})
}

// InplaceIndexCopy prepares x's slices at index along dim replaced by
// source's, in place (aclnnInplaceIndexCopy).
func (c *Context) InplaceIndexCopy(x *Tensor, dim int, index, source *Tensor) (*Op, error) {
	return c.prepare("aclnnInplaceIndexCopy", func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_tltt(c.c, fn, api, x.t, C.int64_t(dim), index.t, source.t, ws, exec, e)
	})
}

// IndexAdd prepares out = x with alpha·source's slices added at index
// along dim (aclnnIndexAdd).
func (c *Context) IndexAdd(x *Tensor, dim int, index, source *Tensor, alpha *Scalar, out *Tensor) (*Op, error) {
	return c.prepare("aclnnIndexAdd", func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_tltst(c.c, fn, api, x.t, C.int64_t(dim), index.t, source.t, alpha.s, out.t, ws, exec, e)
	})
}

// MoeGatingTopK prepares the router (aclnnMoeGatingTopK) as k3 calls it:
// sigmoid scores (normType 1), selection by score plus bias (bias may be
// nil), groups ranked by the sum of their two best (groupSelectMode 1),
// the best kGroup of groupCount groups kept, the top k experts into idx
// and their unbiased scores, divided by their sum when renorm, times
// scale, into y.
func (c *Context) MoeGatingTopK(x, bias *Tensor, k, kGroup, groupCount int, renorm bool, scale float64, y, idx *Tensor) (*Op, error) {
	rn := C.int64_t(0)
	if renorm {
		rn = 1
	}
	return c.prepare("aclnnMoeGatingTopK", func(fn unsafe.Pointer, _ *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_moe_gating_prepare(c.c, fn, x.t, tp(bias), C.int64_t(k), C.int64_t(kGroup), C.int64_t(groupCount), 1, rn, 1, 0,
			C.double(scale), 1e-20, y.t, idx.t, nil, ws, exec, e)
	})
}

// Topk prepares the k largest entries along dim, sorted, into values and
// int64 indices (aclnnTopk).
func (c *Context) Topk(x *Tensor, k, dim int, values, indices *Tensor) (*Op, error) {
	return c.prepare("aclnnTopk", func(fn unsafe.Pointer, _ *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_topk_prepare(c.c, fn, x.t, C.int64_t(k), C.int64_t(dim), 1, 1, values.t, indices.t, ws, exec, e)
	})
}

// HasOperator reports whether the operator libraries have both phases of
// the aclnn operator name.
func (c *Context) HasOperator(name string) bool {
	_, _, _, err := c.lib.operator(name, "")
	return err == nil
}

// noLimit is preTokens and nextTokens when the sparse mode alone bounds
// what a query sees (2^63 − 1, the operators' default).
const noLimit = math.MaxInt64

// LightningIndexer prepares aclnnLightningIndexer for one sequence in
// layout BSND over a PA_BSND key cache read through blockTable, sparse
// mode 3 (causal, aligned at the last key), actSeqQ nil (every query
// row), without the scores: the sparseCount best keys of each query into
// the int32 indices, −1 where a query sees fewer.
func (c *Context) LightningIndexer(q, k, weights, actSeqK, blockTable *Tensor, sparseCount int, indices *Tensor) (*Op, error) {
	lq, lk := C.CString("BSND"), C.CString("PA_BSND")
	defer C.free(unsafe.Pointer(lq))
	defer C.free(unsafe.Pointer(lk))
	return c.prepare("aclnnLightningIndexer", func(fn unsafe.Pointer, _ *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_lightning_indexer_prepare(c.c, fn, q.t, k.t, weights.t, nil, actSeqK.t, blockTable.t, lq, lk,
			C.int64_t(sparseCount), 3, noLimit, noLimit, 0, indices.t, nil, ws, exec, e)
	})
}

// SparseFlashAttention prepares aclnnSparseFlashAttention in MLA-absorb
// mode (attentionMode 2): queries in layout TND, the latent cache as keys
// and values and its rope part in PA_BSND through blockTable, one key per
// index (sparseBlockSize 1), sparse mode 3, returning the softmax's max
// and sum.
func (c *Context) SparseFlashAttention(q, kv, indices, blockTable, actSeqQ, actSeqKV, qRope, kRope *Tensor, scale float64, out, softmaxMax, softmaxSum *Tensor) (*Op, error) {
	lq, lkv := C.CString("TND"), C.CString("PA_BSND")
	defer C.free(unsafe.Pointer(lq))
	defer C.free(unsafe.Pointer(lkv))
	return c.prepare("aclnnSparseFlashAttention", func(fn unsafe.Pointer, _ *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_sfa_prepare(c.c, fn, q.t, kv.t, kv.t, indices.t, blockTable.t, actSeqQ.t, actSeqKV.t, qRope.t, kRope.t,
			C.double(scale), 1, lq, lkv, 3, noLimit, noLimit, 2, 1, out.t, softmaxMax.t, softmaxSum.t, ws, exec, e)
	})
}

// Amax prepares the maximum of x over dims (aclnnAmax), keeping them as
// size 1 when keepDim.
func (c *Context) Amax(x *Tensor, dims []int64, keepDim bool, out *Tensor) (*Op, error) {
	if len(dims) == 0 {
		return nil, &Error{API: "aclnnAmaxGetWorkspaceSize", Lib: ACLNN, Code: 161002, Msg: "no dimensions to reduce"}
	}
	var e C.k3_err
	arr := C.k3_int_array_create(c.c, (*C.int64_t)(unsafe.Pointer(&dims[0])), C.uint64_t(len(dims)), &e)
	if arr == nil {
		return nil, errOf(&e)
	}
	defer C.k3_int_array_destroy(c.c, arr, &e)
	keep := C.int(0)
	if keepDim {
		keep = 1
	}
	return c.prepare("aclnnAmax", func(fn unsafe.Pointer, api *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_prepare_tabt(c.c, fn, api, x.t, arr, keep, out.t, ws, exec, e)
	})
}

// list makes a tensor list of copies of ts, which the list owns.
func (c *Context) list(ts ...*Tensor) (unsafe.Pointer, error) {
	ps := (*[8]unsafe.Pointer)(C.calloc(8, C.size_t(unsafe.Sizeof(unsafe.Pointer(nil)))))
	defer C.free(unsafe.Pointer(ps))
	if len(ts) > len(ps) {
		return nil, fmt.Errorf("%w: a tensor list of %d", ErrInvalidArgument, len(ts))
	}
	var made []*Tensor
	for i, t := range ts {
		cp, err := c.NewTensor(t.d)
		if err != nil {
			for _, m := range made {
				m.Destroy()
			}
			return nil, err
		}
		made = append(made, cp)
		ps[i] = cp.t
	}
	var e C.k3_err
	l := C.k3_tensor_list_create(c.c, &ps[0], C.uint64_t(len(ts)), &e)
	if l == nil {
		for _, m := range made {
			m.Destroy()
		}
		return nil, errOf(&e)
	}
	return l, nil
}

// destroyLists destroys tensor lists and the tensors they own; an
// error is the runtime's and leaves nothing to do.
func (c *Context) destroyLists(ls []unsafe.Pointer) {
	var e C.k3_err
	for _, l := range ls {
		C.k3_tensor_list_destroy(c.c, l, &e)
	}
}

// MoeInitRouting prepares aclnnMoeInitRoutingV2 in its dropless form: the
// (token, slot) pairs of idx [T, K] (experts 0..experts-1) sorted by
// expert, x's rows copied in that order into expandedX [T·K, H], each
// pair's place into rowIdx [T·K] and the cumulative count of each expert's
// rows into cumsum [experts] (int32).
func (c *Context) MoeInitRouting(x, idx *Tensor, experts int, expandedX, rowIdx, cumsum *Tensor) (*Op, error) {
	return c.prepare("aclnnMoeInitRoutingV2", func(fn unsafe.Pointer, _ *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_moe_init_routing_prepare(c.c, fn, x.t, idx.t, 0, 0, C.int64_t(experts), 0, 1, 0,
			expandedX.t, rowIdx.t, cumsum.t, nil, ws, exec, e)
	})
}

// GroupedMatmul prepares aclnnGroupedMatmulV4 with single tensors grouped
// along M (groupType 0, splitItem 3): out[m] = x[m] · w[g] for the rows m
// of group g, groupList int64 [G] cumulative (groupListType 0), w [G, K,
// N] (a strided view or FRACTAL_NZ), no bias, quantisation or activation.
func (c *Context) GroupedMatmul(x, w, groupList, out *Tensor) (*Op, error) {
	var lists []unsafe.Pointer
	for _, t := range []*Tensor{x, w, out} {
		l, err := c.list(t)
		if err != nil {
			c.destroyLists(lists)
			return nil, err
		}
		lists = append(lists, l)
	}
	op, err := c.prepare("aclnnGroupedMatmulV4", func(fn unsafe.Pointer, _ *C.char, ws *C.uint64_t, exec *unsafe.Pointer, e *C.k3_err) C.int {
		return C.k3_gmm_prepare(c.c, fn, lists[0], lists[1], groupList.t, 3, 0, 0, 0, lists[2], ws, exec, e)
	})
	if err != nil {
		c.destroyLists(lists)
		return nil, err
	}
	op.lists = lists
	return op, nil
}
