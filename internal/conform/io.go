package conform

import (
	"fmt"
	"strconv"

	"k3/compute"
	"k3/internal/safetensors"
)

// caseFile wraps a golden file with typed accessors whose errors name the
// file and the tensor.
type caseFile struct {
	*safetensors.File
}

func openCase(path string) (*caseFile, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	return &caseFile{f}, nil
}

func (f *caseFile) f32(name string, dims ...int) ([]float32, []int, error) {
	v, ti, err := f.Float32s(name)
	if err != nil {
		return nil, nil, err
	}
	if err := checkDims(f.Name(), name, ti.Shape, dims); err != nil {
		return nil, nil, err
	}
	return v, ti.Shape, nil
}

func (f *caseFile) i32(name string, dims ...int) ([]int32, []int, error) {
	v, ti, err := f.Int32s(name)
	if err != nil {
		return nil, nil, err
	}
	if err := checkDims(f.Name(), name, ti.Shape, dims); err != nil {
		return nil, nil, err
	}
	return v, ti.Shape, nil
}

func (f *caseFile) has(name string) bool { _, ok := f.Tensor(name); return ok }

// checkDims checks the rank and any dimensions given as >= 0.
func checkDims(file, name string, shape, dims []int) error {
	if dims == nil {
		return nil
	}
	bad := len(shape) != len(dims)
	for i := 0; !bad && i < len(dims); i++ {
		bad = dims[i] >= 0 && shape[i] != dims[i]
	}
	if bad {
		return fmt.Errorf("%s: tensor %q has shape %v, want %v (-1: any)", file, name, shape, dims)
	}
	return nil
}

func (f *caseFile) metaFloat(key string) (float64, error) {
	s, ok := f.Metadata()[key]
	if !ok {
		return 0, fmt.Errorf("%s: metadata %q missing", f.Name(), key)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: metadata %q = %q: %v", f.Name(), key, s, err)
	}
	return v, nil
}

func (f *caseFile) metaInt(key string) (int, error) {
	v, err := f.metaFloat(key)
	return int(v), err
}

// upload copies host values into a new writable backend tensor.
func upload[T float32 | int32](b compute.Backend, v []T, dims ...int) (compute.Tensor, error) {
	dt := compute.F32
	if _, ok := any(v).([]int32); ok {
		dt = compute.I32
	}
	t, err := b.Alloc(dt, dims...)
	if err != nil {
		return t, err
	}
	return t, b.Write(t, v)
}

func download(b compute.Backend, t compute.Tensor) ([]float32, error) {
	v := make([]float32, t.Len())
	return v, b.Read(v, t)
}

func downloadI32(b compute.Backend, t compute.Tensor) ([]int32, error) {
	v := make([]int32, t.Len())
	return v, b.Read(v, t)
}
