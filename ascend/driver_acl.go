//go:build ascend && cgo

package ascend

import (
	"fmt"

	"k3/ascend/internal/acl"
	"k3/compute"
	"k3/internal/cpu"
)

// aclDriver is the driver over CANN, through the cgo shim.
type aclDriver struct{ ctx *acl.Context }

type (
	aclStream struct{ *acl.Stream }
	aclGraph  struct{ *acl.Graph }
	aclOp     struct{ *acl.Op }
)

func (d aclDriver) malloc(n int) (acl.DevPtr, error) { return d.ctx.Malloc(n) }
func (d aclDriver) free(p acl.DevPtr) error          { return d.ctx.Free(p) }
func (d aclDriver) close() error                     { return d.ctx.Close() }

func (d aclDriver) mallocHost(n int) (hostBuffer, error) {
	h, err := d.ctx.MallocHost(n)
	if err != nil {
		return nil, err
	}
	return h, nil
}

func (d aclDriver) newStream() (stream, error) {
	s, err := d.ctx.NewStream()
	if err != nil {
		return nil, err
	}
	return aclStream{s}, nil
}

func (d aclDriver) newEvent() (event, error) {
	e, err := d.ctx.NewEvent()
	if err != nil {
		return nil, err
	}
	return e, nil
}

func (s aclStream) record(e event) error { return s.Record(e.(*acl.Event)) }
func (s aclStream) wait(e event) error   { return s.Wait(e.(*acl.Event)) }

func (d aclDriver) newTensor(td acl.TensorDesc) (tensorDesc, error) {
	t, err := d.ctx.NewTensor(td)
	if err != nil {
		return nil, err
	}
	return t, nil
}

func (d aclDriver) newScalar(v float32) (scalar, error) {
	s, err := d.ctx.NewScalar(v)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func wrapOp(o *acl.Op, err error) (prepared, error) {
	if err != nil {
		return nil, err
	}
	return aclOp{o}, nil
}

func at(t tensorDesc) *acl.Tensor { return t.(*acl.Tensor) }
func as(s scalar) *acl.Scalar     { return s.(*acl.Scalar) }

func (d aclDriver) matmul(name string, x, w, out tensorDesc, cubeMath int8) (prepared, error) {
	return wrapOp(d.ctx.Matmul(name, at(x), at(w), at(out), cubeMath))
}
func (d aclDriver) unary(name string, x, out tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.Unary(name, at(x), at(out)))
}
func (d aclDriver) binary(name string, a, b, out tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.Binary(name, at(a), at(b), at(out)))
}
func (d aclDriver) add(a, b tensorDesc, alpha scalar, out tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.Add(at(a), at(b), as(alpha), at(out)))
}
func (d aclDriver) softplus(x tensorDesc, beta, threshold scalar, out tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.Softplus(at(x), as(beta), as(threshold), at(out)))
}
func (d aclDriver) cast(x tensorDesc, dt acl.DataType, out tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.Cast(at(x), dt, at(out)))
}
func (d aclDriver) fill(x tensorDesc, v scalar) (prepared, error) {
	return wrapOp(d.ctx.Fill(at(x), as(v)))
}
func (d aclDriver) rmsNorm(x, gamma tensorDesc, eps float64, y, rstd tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.RMSNorm(at(x), at(gamma), eps, at(y), at(rstd)))
}

func (d aclDriver) layerNorm(x, w, b tensorDesc, eps float64, out, mean, rstd tensorDesc, dim int) (prepared, error) {
	return wrapOp(d.ctx.LayerNorm(at(x), at(w), at(b), eps, at(out), at(mean), at(rstd), dim))
}

func (d aclDriver) muls(x tensorDesc, v scalar, out tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.Muls(at(x), as(v), at(out)))
}
func (d aclDriver) inplaceCopy(dst, src tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.InplaceCopy(at(dst), at(src)))
}
func (d aclDriver) rgdr(q, k, v, beta, state, seqLens, stateIdx, g, gk tensorDesc, scale float32, out tensorDesc) (prepared, error) {
	var tg *acl.Tensor
	if g != nil {
		tg = at(g)
	}
	return wrapOp(d.ctx.RecurrentGatedDeltaRule(at(q), at(k), at(v), at(beta), at(state), at(seqLens), at(stateIdx), tg, at(gk), scale, at(out)))
}

func (d aclDriver) hasOperator(name string) bool { return d.ctx.HasOperator(name) }

func (d aclDriver) lightningIndexer(q, k, weights, actSeqK, blockTable tensorDesc, sparseCount int, indices tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.LightningIndexer(at(q), at(k), at(weights), at(actSeqK), at(blockTable), sparseCount, at(indices)))
}
func (d aclDriver) sparseFlashAttention(q, kv, indices, blockTable, actSeqQ, actSeqKV, qRope, kRope tensorDesc, scale float64, out, softmaxMax, softmaxSum tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.SparseFlashAttention(at(q), at(kv), at(indices), at(blockTable), at(actSeqQ), at(actSeqKV), at(qRope), at(kRope),
		scale, at(out), at(softmaxMax), at(softmaxSum)))
}

func (d aclDriver) indexSelect(x tensorDesc, dim int, index, out tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.IndexSelect(at(x), dim, at(index), at(out)))
}
func (d aclDriver) indexCopy(x tensorDesc, dim int, index, source tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.InplaceIndexCopy(at(x), dim, at(index), at(source)))
}
func (d aclDriver) indexAdd(x tensorDesc, dim int, index, source tensorDesc, alpha scalar, out tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.IndexAdd(at(x), dim, at(index), at(source), as(alpha), at(out)))
}

func (d aclDriver) moeGating(x, bias tensorDesc, k, kGroup, groups int, renorm bool, scale float64, y, idx tensorDesc) (prepared, error) {
	var tb *acl.Tensor
	if bias != nil {
		tb = at(bias)
	}
	return wrapOp(d.ctx.MoeGatingTopK(at(x), tb, k, kGroup, groups, renorm, scale, at(y), at(idx)))
}

func (d aclDriver) moeInitRouting(x, idx tensorDesc, experts int, expandedX, rowIdx, cumsum tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.MoeInitRouting(at(x), at(idx), experts, at(expandedX), at(rowIdx), at(cumsum)))
}

func (d aclDriver) groupedMatmul(x, w, groupList, out tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.GroupedMatmul(at(x), at(w), at(groupList), at(out)))
}

func (d aclDriver) amax(x, out tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.Amax(at(x), []int64{-1}, true, at(out)))
}

func (d aclDriver) topk(x tensorDesc, k, dim int, values, indices tensorDesc) (prepared, error) {
	return wrapOp(d.ctx.Topk(at(x), k, dim, at(values), at(indices)))
}

func (s aclStream) upload(dst acl.DevPtr, src hostBuffer, off, n int) error {
	return s.Upload(dst, src.(*acl.HostBuffer), off, n)
}
func (s aclStream) download(dst hostBuffer, off int, src acl.DevPtr, n int) error {
	return s.Download(dst.(*acl.HostBuffer), off, src, n)
}
func (s aclStream) capture(fn func() error) (graph, error) {
	g, err := s.Capture(acl.CaptureThreadLocal, fn)
	if err != nil {
		return nil, err
	}
	return aclGraph{g}, nil
}

func (g aclGraph) replay(s stream) error { return g.Replay(s.(aclStream).Stream) }

func (o aclOp) workspace() int                       { return o.WorkspaceSize }
func (o aclOp) repeat() error                        { return o.SetRepeatable() }
func (o aclOp) destroy() error                       { return o.Destroy() }
func (o aclOp) launch(s stream, ws acl.DevPtr) error { return o.Launch(s.(aclStream).Stream, ws) }

// aclParts returns b's ACL context and stream; a backend on another
// driver has none.
func (b *Backend) aclParts() (*acl.Context, *acl.Stream, error) {
	d, ok := b.drv.(aclDriver)
	if !ok {
		return nil, nil, fmt.Errorf("%w: the backend does not run on CANN", ErrInvalidArgument)
	}
	return d.ctx, b.s.(aclStream).Stream, nil
}

// openDevice is Open's device half.
func openDevice(lib *acl.Lib, o Options) (compute.Backend, error) {
	b, err := openACL(lib, o)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// openACL opens device o.Device of lib as a Backend.
func openACL(lib *acl.Lib, o Options) (*Backend, error) {
	ctx, err := lib.NewContext(o.Device)
	if err != nil {
		return nil, err
	}
	b, err := newBackend(aclDriver{ctx}, o)
	if err != nil {
		return nil, err
	}
	if o.HostFallback {
		b.fallback = cpu.New(1)
	}
	return b, nil
}
