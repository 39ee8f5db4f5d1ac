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
	b.mu.Lock()
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
// view [K, N] of an NZ storage [⌈N/16⌉, ⌈K/16⌉, 16, 16].
func (b *Backend) descNZ(w compute.Tensor) (tensorDesc, error) {
	d, err := bufOf(w)
	if err != nil {
		return nil, err
	}
	l := d.nz
	if w.Off != 0 || w.Rank != 2 || w.Dims[0] != l.C || w.Dims[1] != l.R {
		return nil, fmt.Errorf("%w: %v is a view of a FRACTAL_NZ weight [%d, %d]; MatMul reads it whole", compute.ErrShape, w, l.C, l.R)
	}
	sd := l.StorageDims(nil)
	return b.drv.newTensor(acl.TensorDesc{
		DType:       aclType(w.DType),
		Format:      acl.FormatFractalNZ,
		Dims:        i64(l.R, l.C),
		Strides:     i64(l.C, 1),
		StorageDims: i64(sd...),
		Data:        b.base.Add(d.off),
	})
}

// errNZ is the error of any operation but MatMul on a prepared weight.
func errNZ(t compute.Tensor) error {
	return fmt.Errorf("%w: %v is a matmul weight stored in FRACTAL_NZ; only MatMul reads it", compute.ErrShape, t)
}

// unpackNZ returns a prepared weight's elements [N, K] row-major as bytes,
// from the bytes of its NZ storage.
func unpackNZ(l *nz.Layout, storage []byte) ([]byte, error) {
	packed := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(storage))), l.Len())
	wt := make([]uint16, l.R*l.C) // [K, N]
	if err := nz.Unpack(*l, wt, packed); err != nil {
		return nil, err
	}
	N, K := l.C, l.R
	out := make([]byte, 2*N*K)
	for n := range N {
		for k := range K {
			binary.LittleEndian.PutUint16(out[2*(n*K+k):], wt[k*N+n])
		}
	}
	return out, nil
}
