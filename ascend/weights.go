package ascend

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"k3/ascend/internal/acl"
	"k3/ascend/internal/nz"
	"k3/compute"
)

// PrepareMatMul implements compute.WeightPreparer: a BF16 weight [N, K]
// is stored as the cube unit reads aclnnMatmul's mat2, its transpose
// [K, N] in FRACTAL_NZ (nz.Pack, C0 16), and w's buffer is freed. Other
// weights are returned as they are. Only MatMul reads the result.
func (b *Backend) PrepareMatMul(w compute.Tensor) (compute.Tensor, error) {
	if w.DType != compute.BF16 || w.Rank != 2 {
		return w, nil
	}
	b.lock()
	defer b.mu.Unlock()
	d, err := bufOf(w)
	if err != nil {
		return w, err
	}
	if d.nz != nil {
		return w, nil
	}
	if w.Off != 0 || d.n != w.Len()*2 {
		return w, fmt.Errorf("%w: PrepareMatMul of %v, a view into a larger buffer", compute.ErrShape, w)
	}
	N, K := w.Dims[0], w.Dims[1]
	raw := make([]byte, d.n)
	if err := b.download(raw, b.base.Add(d.off)); err != nil {
		return w, err
	}
	rows := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(raw))), N*K)
	wt := make([]uint16, K*N) // [K, N]
	for n := range N {
		for k := range K {
			wt[k*N+n] = rows[n*K+k]
		}
	}
	l, err := nz.NewLayout([]int{K, N}, nz.C0(2))
	if err != nil {
		return w, err
	}
	packed := make([]uint16, l.Len())
	if err := nz.Pack(l, packed, wt); err != nil {
		return w, err
	}
	out, err := b.alloc(2 * l.Len())
	if err != nil {
		return w, err
	}
	bytes := make([]byte, 2*len(packed))
	for i, v := range packed {
		binary.LittleEndian.PutUint16(bytes[2*i:], v)
	}
	if err := b.upload(b.base.Add(out.off), bytes); err != nil {
		b.freeBuf(out)
		return w, err
	}
	out.nz = &l
	b.freeBuf(d)
	return compute.NewTensor(out, 0, compute.BF16, N, K), nil
}

// descNZ describes a prepared weight [N, K] as aclnnMatmul's mat2: the
// view [K, N] of an NZ storage [⌈N/16⌉, ⌈K/16⌉, 16, 16]. In a stack of
// experts (PrepareExperts) the weight is expert Off/(N·K)'s.
func (b *Backend) descNZ(w compute.Tensor) (tensorDesc, error) {
	d, err := bufOf(w)
	if err != nil {
		return nil, err
	}
	l := d.nz
	per := l.R * l.C
	if w.Off%per != 0 || w.Off/per >= l.Batch || w.Rank != 2 || w.Dims[0] != l.C || w.Dims[1] != l.R {
		return nil, fmt.Errorf("%w: %v is a view of a FRACTAL_NZ weight [%d, %d]; MatMul reads it whole", compute.ErrShape, w, l.C, l.R)
	}
	one := *l
	one.Batch = 1
	sd := one.StorageDims(nil)
	return b.drv.newTensor(acl.TensorDesc{
		DType:       aclType(w.DType),
		Format:      acl.FormatFractalNZ,
		Dims:        i64(l.R, l.C),
		Strides:     i64(l.C, 1),
		StorageDims: i64(sd...),
		Data:        b.base.Add(d.off + w.Off/per*one.Len()*2),
	})
}

// errNZ is the error of any operation but MatMul on a prepared weight.
func errNZ(t compute.Tensor) error {
	return fmt.Errorf("%w: %v is a matmul weight stored in FRACTAL_NZ; only MatMul reads it", compute.ErrShape, t)
}

// unpackNZ returns a prepared weight's elements [N, K] row-major as bytes,
// from the bytes of its NZ storage; a stack of experts gives [E, N, K].
func unpackNZ(l *nz.Layout, storage []byte) ([]byte, error) {
	packed := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(storage))), l.Len())
	wt := make([]uint16, l.Batch*l.R*l.C) // [E, K, N]
	if err := nz.Unpack(*l, wt, packed); err != nil {
		return nil, err
	}
	N, K := l.C, l.R
	out := make([]byte, 2*len(wt))
	for e := range l.Batch {
		for n := range N {
			for k := range K {
				binary.LittleEndian.PutUint16(out[2*((e*N+n)*K+k):], wt[(e*K+k)*N+n])
			}
		}
	}
	return out, nil
}

// PrepareExperts implements compute.ExpertPreparer: each kind of a
// layer's expert weights (W1, W3, W2) moves into one buffer, expert after
// expert, so that aclnnGroupedMatmulV4 reads them as one weight [E, K, N]
// (MoEExperts' grouped route). Experts prepared in FRACTAL_NZ stay in it:
// a stack of NZ matrices is the NZ layout of the stacked tensor. Entry e
// becomes a view at element offset e·N·K of the stack, which MatMul still
// reads as that expert's weight.
func (b *Backend) PrepareExperts(w1, w3, w2 []compute.Tensor) error {
	E := len(w1)
	if len(w3) != E || len(w2) != E {
		return fmt.Errorf("%w: experts: %d w1, %d w3, %d w2 tensors", compute.ErrShape, E, len(w3), len(w2))
	}
	if E == 0 || E > maxGroups {
		return nil // the composition runs them one by one
	}
	b.lock()
	defer b.mu.Unlock()
	kinds := [][]compute.Tensor{w1, w3, w2}
	var plans [3]stackPlan
	for i, ws := range kinds {
		var err error
		if plans[i], err = planStack(ws); err != nil {
			return fmt.Errorf("ascend: experts' w%d: %w", [3]int{1, 3, 2}[i], err)
		}
	}
	// Only an allocation or a copy can fail from here; the kinds moved
	// before it stay stacked, which MatMul reads as before and MoEExperts
	// runs by its composition until all three are.
	for i, ws := range kinds {
		if err := b.stackExperts(ws, plans[i]); err != nil {
			return fmt.Errorf("ascend: experts' w%d: %w", [3]int{1, 3, 2}[i], err)
		}
	}
	return nil
}

// maxGroups is the most groups aclnnGroupedMatmulV4 takes along M.
const maxGroups = 1024

// stackPlan is a checked stack: the experts' buffers and the bytes each.
type stackPlan struct {
	bufs  []*devBuf
	bytes int
}

// planStack checks that ws can share one stack: whole buffers of one
// shape, dtype and layout.
func planStack(ws []compute.Tensor) (stackPlan, error) {
	first := ws[0]
	d0, err := bufOf(first)
	if err != nil {
		return stackPlan{}, err
	}
	if first.Rank != 2 {
		return stackPlan{}, fmt.Errorf("%w: expert 0 is %v, not a matrix", compute.ErrShape, first)
	}
	p := stackPlan{bufs: make([]*devBuf, len(ws)), bytes: first.Len() * first.DType.Size()}
	if d0.nz != nil {
		p.bytes = d0.nz.Len() * 2
	}
	for e, w := range ws {
		d, err := bufOf(w)
		if err != nil {
			return stackPlan{}, fmt.Errorf("expert %d: %w", e, err)
		}
		if w.Rank != 2 || w.Dims != first.Dims || w.DType != first.DType || w.Off != 0 || d.n != p.bytes ||
			d.experts != 0 || (d.nz == nil) != (d0.nz == nil) {
			return stackPlan{}, fmt.Errorf("%w: expert %d is %v, expert 0 %v: the stack needs whole buffers of one shape and layout", compute.ErrShape, e, w, first)
		}
		p.bufs[e] = d
	}
	return p, nil
}

// stackExperts moves ws into one buffer as p planned and points ws at it;
// b.mu is held.
func (b *Backend) stackExperts(ws []compute.Tensor, p stackPlan) error {
	first, d0 := ws[0], p.bufs[0]
	N, K := first.Dims[0], first.Dims[1]
	out, err := b.alloc(len(ws) * p.bytes)
	if err != nil {
		return err
	}
	for e, d := range p.bufs {
		if err := b.s.CopyDevice(b.base.Add(out.off+e*p.bytes), b.base.Add(d.off), p.bytes); err != nil {
			b.freeBuf(out)
			return err
		}
	}
	out.experts = len(ws)
	if d0.nz != nil {
		l := *d0.nz
		l.Batch = len(ws)
		out.nz = &l
	}
	for e, d := range p.bufs {
		b.freeBuf(d)
		ws[e] = compute.NewTensor(out, e*N*K, first.DType, N, K)
	}
	return nil
}

// descStack describes the stack whose expert 0 is w ([N, K]) as
// aclnnGroupedMatmulV4's weight [E, K, N]: a strided view of the ND
// stack, or the NZ stack whole.
func (b *Backend) descStack(w compute.Tensor) (tensorDesc, error) {
	d, err := bufOf(w)
	if err != nil {
		return nil, err
	}
	if d.experts == 0 || w.Off != 0 || w.Rank != 2 {
		return nil, fmt.Errorf("%w: %v is not expert 0 of a stack of experts' weights", compute.ErrShape, w)
	}
	E, N, K := d.experts, w.Dims[0], w.Dims[1]
	if d.nz == nil {
		return b.desc(w, i64(E, K, N), i64(N*K, 1, K))
	}
	l := d.nz
	return b.drv.newTensor(acl.TensorDesc{
		DType:       aclType(w.DType),
		Format:      acl.FormatFractalNZ,
		Dims:        i64(E, l.R, l.C),
		Strides:     i64(l.R*l.C, l.C, 1),
		StorageDims: i64(l.StorageDims([]int{E})...),
		Data:        b.base.Add(d.off),
	})
}

// stackOf returns the buffer ws are the experts of, in order, or nil when
// they are not one stack.
func stackOf(ws []compute.Tensor) *devBuf {
	d, ok := ws[0].Mem.(*devBuf)
	if !ok || d.freed || d.experts != len(ws) {
		return nil
	}
	for e, w := range ws {
		if w.Mem != any(d) || w.Off != e*w.Dims[0]*w.Dims[1] {
			return nil
		}
	}
	return d
}
