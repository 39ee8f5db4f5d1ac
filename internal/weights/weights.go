// Package weights moves checkpoint tensors onto a backend with their shapes
// checked: the one place where layer packages turn names into tensors.
package weights

import (
	"fmt"
	"slices"

	"k3/compute"
	"k3/internal/floatx"
)

// Source is compute.Source: a tensor by its name relative to a layer
// prefix, as host bytes. Loaders read checkpoints through it; tests and the
// conformance runner serve golden files through it.
type Source = compute.Source

// Loader loads tensors from a Source onto a backend and remembers the first
// error, so that a layer's loading code reads as a list of names.
type Loader struct {
	B      compute.Backend
	Src    Source
	Prefix string // for error messages ("model.layers.3.self_attn.")
	Err    error
}

// Matrix loads a weight kept in its stored dtype (F32 or BF16; F16 is
// widened to F32), checking its shape.
func (l *Loader) Matrix(name string, dims ...int) compute.Tensor { return l.load(name, false, dims) }

// Linear loads a projection weight [N, K] that only MatMul will read (as
// its w), laid out for the backend (compute.PrepareMatMul).
func (l *Loader) Linear(name string, dims ...int) compute.Tensor {
	t := l.load(name, false, dims)
	if l.Err != nil {
		return t
	}
	p, err := compute.PrepareMatMul(l.B, t)
	if err != nil {
		l.Err = fmt.Errorf("tensor %s%s: %w", l.Prefix, name, err)
	}
	return p
}

// F32 loads a tensor converted to float32 (norm weights, biases, gates).
func (l *Loader) F32(name string, dims ...int) compute.Tensor { return l.load(name, true, dims) }

// Host returns a tensor's values on the host as float32 (for load-time
// transforms), checking its shape.
func (l *Loader) Host(name string, dims ...int) []float32 {
	v, _ := l.HostStored(name, dims...)
	return v
}

// HostStored is Host that also reports the dtype the tensor is stored in,
// so that a rearranged copy can go back in that dtype (UploadAs).
func (l *Loader) HostStored(name string, dims ...int) ([]float32, compute.DType) {
	if l.Err != nil {
		return nil, 0
	}
	dt, _, _, err := l.Src(name)
	if err != nil {
		l.Err = err
		return nil, 0
	}
	t := l.load(name, true, dims)
	if l.Err != nil {
		return nil, 0
	}
	v := make([]float32, t.Len())
	if err := l.B.Read(v, t); err != nil {
		l.Err = err
	}
	l.B.Free(t)
	return v, dt
}

// UploadAs is Upload for values that were read from a tensor stored in dt
// and only rearranged: BF16 values go back as BF16 (exactly: every value is
// a bfloat16 already), so a rearranged weight keeps its stored size and the
// products that read it give the same results. Other dtypes upload as F32.
func (l *Loader) UploadAs(dt compute.DType, v []float32, dims ...int) compute.Tensor {
	if l.Err != nil || dt != compute.BF16 {
		return l.Upload(v, dims...)
	}
	data := make([]byte, 2*len(v))
	for i, f := range v {
		h := floatx.BF16(f)
		if floatx.FromBF16(h) != f && f == f {
			l.Err = fmt.Errorf("weights: %v is not a bfloat16 value; UploadAs takes rearranged values only", f)
			return compute.Tensor{}
		}
		data[2*i], data[2*i+1] = byte(h), byte(h>>8)
	}
	t, err := l.B.FromHost(compute.BF16, compute.BF16, data, dims...)
	l.Err = err
	return t
}

// LinearAs is UploadAs for a projection weight [N, K] that only MatMul
// will read, laid out for the backend as Linear's are.
func (l *Loader) LinearAs(dt compute.DType, v []float32, dims ...int) compute.Tensor {
	t := l.UploadAs(dt, v, dims...)
	if l.Err != nil {
		return t
	}
	p, err := compute.PrepareMatMul(l.B, t)
	if err != nil {
		l.Err = fmt.Errorf("weights: a %v projection: %w", dims, err)
	}
	return p
}

// Upload makes a float32 tensor from host values computed at load time.
func (l *Loader) Upload(v []float32, dims ...int) compute.Tensor {
	if l.Err != nil {
		return compute.Tensor{}
	}
	t, err := l.B.Alloc(compute.F32, dims...)
	if err == nil {
		err = l.B.Write(t, v)
	}
	l.Err = err
	return t
}

func (l *Loader) load(name string, asF32 bool, dims []int) compute.Tensor {
	if l.Err != nil {
		return compute.Tensor{}
	}
	dt, shape, data, err := l.Src(name)
	if err != nil {
		l.Err = err
		return compute.Tensor{}
	}
	n, wn := 1, 1
	for _, s := range shape {
		n *= s
	}
	for _, s := range dims {
		wn *= s
	}
	// Shapes must match exactly, except that singleton dimensions may be
	// dropped ([H*D, 1, W] conv taps, [1, D] AttnRes queries).
	if n != wn || !slices.Equal(squeeze(shape), squeeze(dims)) {
		l.Err = fmt.Errorf("tensor %s%s has shape %v, want %v", l.Prefix, name, shape, dims)
		return compute.Tensor{}
	}
	target := dt
	if asF32 || dt == compute.F16 {
		target = compute.F32
	}
	t, err := l.B.FromHost(target, dt, data, dims...)
	if err != nil {
		l.Err = fmt.Errorf("tensor %s%s: %w", l.Prefix, name, err)
	}
	return t
}

func squeeze(s []int) []int {
	out := make([]int, 0, len(s))
	for _, d := range s {
		if d != 1 {
			out = append(out, d)
		}
	}
	return out
}
