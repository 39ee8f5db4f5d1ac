package k3

import (
	"fmt"
	"slices"
	"strings"

	"k3/compute"
	"k3/internal/floatx"
	"k3/internal/safetensors"
)

// Quantised weights load as the bf16 matrices they stand for, under their
// plain names (docs/ARCHITECTURE.md, "Quantised weights").

// companions returns the names of the tensors that are stored with the
// weight name in a quantised form: its fp8 scales, and the MXFP4 tensors
// that replace it.
func companions(name string) []string {
	out := []string{name + "_scale_inv", name + "_scale"}
	if base, ok := strings.CutSuffix(name, ".weight"); ok {
		out = append(out, base+".weight_packed", base+".weight_shape")
	}
	return out
}

// bf16Bytes rounds f to bf16, little-endian.
func bf16Bytes(f []float32) []byte {
	out := make([]byte, 2*len(f))
	for i, v := range f {
		h := floatx.BF16(v)
		out[2*i], out[2*i+1] = byte(h), byte(h>>8)
	}
	return out
}

// dequantE4M3 expands an fp8 matrix with its scales: DeepSeek's
// weight_scale_inv (128×128 blocks) or compressed-tensors' weight_scale
// (a row's, the tensor's, or 128×128 blocks, told apart by its shape).
func (s *source) dequantE4M3(name string, ti safetensors.TensorInfo, data []byte) (compute.DType, []int, []byte, error) {
	if len(ti.Shape) != 2 {
		return 0, nil, nil, fmt.Errorf("fp8 tensor %s has shape %v, want a matrix", name, ti.Shape)
	}
	rows, cols := ti.Shape[0], ti.Shape[1]
	blocks := []int{ceilDiv(rows, floatx.WeightBlock), ceilDiv(cols, floatx.WeightBlock)}
	scaleName := name + "_scale_inv"
	sb, si, err := s.ck.Bytes(scaleName)
	if err != nil {
		scaleName = name + "_scale"
		if sb, si, err = s.ck.Bytes(scaleName); err != nil {
			return 0, nil, nil, fmt.Errorf("fp8 tensor %s has no %s_scale_inv (DeepSeek's blocks) or %s_scale (compressed-tensors')", name, name, name)
		}
	}
	s.markUsed(scaleName, si.Size)
	scale, err := safetensors.DecodeFloat32(si.DType, sb)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("%s: %w", scaleName, err)
	}
	var br, bc int
	n := 1
	for _, d := range si.Shape {
		n *= d
	}
	switch {
	case scaleName == name+"_scale_inv" || slices.Equal(si.Shape, blocks) && n > 1:
		if !slices.Equal(si.Shape, blocks) {
			return 0, nil, nil, fmt.Errorf("%s has shape %v, want %v (128×128 blocks of %s's %d×%d)", scaleName, si.Shape, blocks, name, rows, cols)
		}
		br, bc = floatx.WeightBlock, floatx.WeightBlock
	case n == 1:
		br, bc = rows, cols
	case n == rows && (len(si.Shape) == 1 || len(si.Shape) == 2 && si.Shape[1] == 1):
		br, bc = 1, cols
	default:
		return 0, nil, nil, fmt.Errorf("%s has shape %v: want [%d, 1] (a scale a row), [1] (one for the tensor) or %v (128×128 blocks)", scaleName, si.Shape, rows, blocks)
	}
	f := make([]float32, rows*cols)
	if err := floatx.DequantE4M3Weight(f, data, scale, rows, cols, br, bc); err != nil {
		return 0, nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	s.ck.Release(name) // the bf16 copy is what the model reads
	s.ck.Release(scaleName)
	return compute.BF16, ti.Shape, bf16Bytes(f), nil
}

// unpackFP4 serves base.weight from compressed-tensors' MXFP4 tensors:
// base.weight_packed (U8, two e2m1 values a byte), base.weight_scale (U8
// E8M0 codes, one a 32 columns of a row) and, when present,
// base.weight_shape (the matrix's rows and columns).
func (s *source) unpackFP4(base string) (compute.DType, []int, []byte, error) {
	pname, sname, shname := base+".weight_packed", base+".weight_scale", base+".weight_shape"
	packed, pi, err := s.ck.Bytes(pname)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("missing tensor %s", pname)
	}
	s.markUsed(pname, pi.Size)
	if _, _, err := s.ck.Bytes(base + ".weight_global_scale"); err == nil {
		return 0, nil, nil, fmt.Errorf("tensor %s is NVFP4 (it has a %s.weight_global_scale), which k3 cannot use; MXFP4 (E8M0 scales) is supported", pname, base)
	}
	if pi.DType != safetensors.U8 {
		return 0, nil, nil, fmt.Errorf("tensor %s has dtype %s: want U8 (MXFP4); packed %s integers (int4 pack-quantized) are not supported", pname, pi.DType, pi.DType)
	}
	if len(pi.Shape) != 2 {
		return 0, nil, nil, fmt.Errorf("tensor %s has shape %v, want a matrix", pname, pi.Shape)
	}
	rows, cols := pi.Shape[0], 2*pi.Shape[1]
	if sb, shi, err := s.ck.Bytes(shname); err == nil {
		s.markUsed(shname, shi.Size)
		sh, err := safetensors.DecodeInt32(shi.DType, sb)
		if err != nil {
			return 0, nil, nil, fmt.Errorf("%s: %w", shname, err)
		}
		if len(sh) != 2 || int(sh[0]) != rows || int(sh[1]) != cols {
			return 0, nil, nil, fmt.Errorf("%s is %v: %s (%v) holds a %d×%d matrix", shname, sh, pname, pi.Shape, rows, cols)
		}
	}
	scale, si, err := s.ck.Bytes(sname)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("MXFP4 tensor %s has no %s", pname, sname)
	}
	s.markUsed(sname, si.Size)
	if si.DType != safetensors.U8 {
		return 0, nil, nil, fmt.Errorf("tensor %s has dtype %s: want U8 (MXFP4's E8M0 scales); NVFP4 and other fp4 forms are not supported", sname, si.DType)
	}
	if groups := ceilDiv(cols, floatx.MXGroup); !slices.Equal(si.Shape, []int{rows, groups}) {
		return 0, nil, nil, fmt.Errorf("tensor %s has shape %v, want [%d %d] (one scale a %d columns of %s's %d×%d)", sname, si.Shape, rows, groups, floatx.MXGroup, pname, rows, cols)
	}
	out := make([]byte, 2*rows*cols)
	if err := floatx.DequantMXFP4BF16(out, packed, scale, rows, cols); err != nil {
		return 0, nil, nil, fmt.Errorf("%s: %w", pname, err)
	}
	s.ck.Release(pname)
	s.ck.Release(sname)
	return compute.BF16, []int{rows, cols}, out, nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
