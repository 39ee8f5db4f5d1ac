package cpu

import (
	"k3/compute"
	"k3/internal/kernel"
)

var _ compute.WeightPreparer = (*Backend)(nil)

// PrepareMatMul implements compute.WeightPreparer. Where the CPU runs the
// k-major tiles (kernel.KMajorFast), a bf16 weight [N, K] is copied into
// k-major panels (kernel.PackKMajor), so that every product of it, whatever
// its row count, is one FMA chain per output in k order: a row's result is
// the same alone, in a decode batch, in a scheduler's pass or in a prefill
// chunk. Narrower weights (kernel.KMajorMinN), other dtypes, other CPUs
// and the fast-bf16 backend (whose products round x to bf16 over the
// stored layout) keep w.
//
// The prepared tensor keeps w's shape and answers Read; it is not a view
// other operations can read (F32 and U16 return nil for it).
func (b *Backend) PrepareMatMul(w compute.Tensor) (compute.Tensor, error) {
	if b.fastBF16 || !kernel.KMajorFast() || w.DType != compute.BF16 || w.Rank != 2 || w.Dims[0] < kernel.KMajorMinN {
		return w, nil
	}
	src := U16(w)
	if src == nil {
		return w, nil
	}
	n, k := w.Dims[0], w.Dims[1]
	buf := &buffer{kmaj: make([]uint16, kernel.KMajorLen(n, k)), kmajN: n, kmajK: k}
	b.pool.PackKMajor(buf.kmaj, src, n, k)
	b.Free(w)
	return compute.NewTensor(buf, 0, compute.BF16, n, k), nil
}

// kmajorOf returns the k-major panels of a weight PrepareMatMul laid out
// (nil for any other tensor), and an error for a view of one with another
// shape or offset, which no product can read.
func kmajorOf(w compute.Tensor) ([]uint16, error) {
	buf, ok := w.Mem.(*buffer)
	if !ok || buf.kmaj == nil {
		return nil, nil
	}
	if w.Off != 0 || w.Rank != 2 || w.Dims[0] != buf.kmajN || w.Dims[1] != buf.kmajK {
		return nil, shapeErr("matmul weight %v is a view of a prepared [%d %d] weight", w, buf.kmajN, buf.kmajK)
	}
	return buf.kmaj, nil
}
