// Package compute is the seam between k3's layer code and the devices that
// run it.
//
// Layer code (kda, dsa, attnres, the MoE and the model in k3) is written
// once against Backend. Tensors are backend-owned: a device backend keeps
// them in device memory, and a whole forward pass runs without copying
// through the host between operations. Only token ids and positions go in,
// and logits (or sampled tokens) come out.
//
// The interface has three groups of methods: memory (Alloc, FromHost,
// Write, Read, Free), plain operations (MatMul, RMSNorm, LayerNorm, Unary,
// Binary, GatedAct, Embedding, Copy, Fill) and the fused model operations that a
// device maps to one vendor kernel each (KDAChunk, KDAStep,
// LightningIndexer, Attention, AttnResPrepare, AttnResUpdate, MoERoute,
// MoEExperts). docs/ARCHITECTURE.md says why each method is there.
package compute

import (
	"errors"
	"fmt"
)

// InvariantRows is the largest row count for which every operation of a
// backend gives each row (token) the result it gets alone: a decode batch
// of up to InvariantRows sessions is bit-identical to decoding each session
// by itself. Longer products (prefill) may use another summation order.
const InvariantRows = 32

// ErrUnsupported is returned by a backend for an operation, dtype or
// parameter combination it does not implement.
var ErrUnsupported = errors.New("unsupported by this backend")

// ErrShape is wrapped by errors about operand shapes or dtypes.
var ErrShape = errors.New("shape mismatch")

// DType is an element type of backend tensors.
type DType uint8

const (
	F32 DType = iota + 1
	BF16
	F16
	I32
)

// Size returns the bytes per element.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16, F16:
		return 2
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	case I32:
		return "i32"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// MaxRank is the largest number of dimensions a Tensor has.
const MaxRank = 5

// Tensor is a contiguous row-major array owned by a backend. It is a small
// value: views (Rows, Reshape) are made without allocating and without
// calling the backend. The zero Tensor means "absent" in optional operands.
type Tensor struct {
	DType DType
	Rank  int
	Dims  [MaxRank]int
	// Mem is the backend's storage handle and Off the element offset of the
	// first element in it; only the owning backend interprets them.
	Mem any
	Off int
}

// NewTensor describes storage mem of a backend; backends call it.
func NewTensor(mem any, off int, dt DType, dims ...int) Tensor {
	if len(dims) > MaxRank {
		panic("compute: rank above MaxRank")
	}
	t := Tensor{DType: dt, Rank: len(dims), Mem: mem, Off: off}
	copy(t.Dims[:], dims)
	return t
}

// IsZero reports whether t is the zero (absent) Tensor.
func (t Tensor) IsZero() bool { return t.Mem == nil }

// Len returns the number of elements.
func (t Tensor) Len() int {
	n := 1
	for _, d := range t.Dims[:t.Rank] {
		n *= d
	}
	return n
}

// Dim returns dimension i; negative i counts from the end.
func (t Tensor) Dim(i int) int {
	if i < 0 {
		i += t.Rank
	}
	return t.Dims[i]
}

// Shape returns the dimensions.
func (t *Tensor) Shape() []int { return t.Dims[:t.Rank] }

// Rows returns the view of rows [lo, hi) along the first dimension.
func (t Tensor) Rows(lo, hi int) Tensor {
	if t.Rank == 0 || lo < 0 || hi < lo || hi > t.Dims[0] {
		panic(fmt.Sprintf("compute: rows [%d, %d) of %s", lo, hi, dimString(t.Dims, t.Rank)))
	}
	row := t.Len() / max(t.Dims[0], 1)
	t.Off += lo * row
	t.Dims[0] = hi - lo
	return t
}

// Reshape returns a view with the same elements and new dimensions; one
// dimension may be -1 and is inferred.
func (t Tensor) Reshape(dims ...int) Tensor {
	n, infer := 1, -1
	for i, d := range dims {
		if d == -1 {
			infer = i
			continue
		}
		n *= d
	}
	out := t
	out.Rank = len(dims)
	copy(out.Dims[:], dims)
	if infer >= 0 && n > 0 {
		out.Dims[infer] = t.Len() / n
	}
	if out.Len() != t.Len() || len(dims) > MaxRank {
		var want [MaxRank]int
		copy(want[:], dims)
		panic(fmt.Sprintf("compute: reshape %s to %s", dimString(t.Dims, t.Rank), dimString(want, min(len(dims), MaxRank))))
	}
	return out
}

func (t Tensor) String() string { return t.DType.String() + dimString(t.Dims, t.Rank) }

// dimString formats dimensions from an array value, so that formatting a
// Tensor in an error path never forces the Tensor itself onto the heap.
func dimString(d [MaxRank]int, rank int) string {
	return fmt.Sprint(append([]int(nil), d[:rank]...))
}

// CheckShape returns an error wrapping ErrShape unless t has dtype dt and
// the given dimensions; name is the operand's name in the message. It does
// not allocate when the shape matches.
func CheckShape(name string, t Tensor, dt DType, dims ...int) error {
	ok := t.DType == dt && t.Rank == len(dims)
	for i := 0; ok && i < len(dims); i++ {
		ok = t.Dims[i] == dims[i]
	}
	if ok {
		return nil
	}
	// Format from a copy so that dims does not escape (and allocate) on
	// the success path.
	want := make([]int, len(dims))
	copy(want, dims)
	return fmt.Errorf("%w: %s is %v, want %s%v", ErrShape, name, t, dt, want)
}

// Source returns a tensor by its name relative to a layer prefix, as host
// bytes in dtype dt with its shape: how the layer packages' LoadWeights
// read a checkpoint (or a golden file) without depending on its format.
type Source func(name string) (dt DType, shape []int, data []byte, err error)
