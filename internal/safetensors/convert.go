package safetensors

import (
	"encoding/binary"
	"fmt"
	"math"

	"k3/internal/floatx"
)

// Float32s returns the named tensor widened to float32, whatever its float
// dtype (F32, F16, BF16, F64, F8_E4M3 unscaled).
func (f *File) Float32s(name string) ([]float32, TensorInfo, error) {
	b, t, err := f.Bytes(name)
	if err != nil {
		return nil, t, err
	}
	v, err := DecodeFloat32(t.DType, b)
	if err != nil {
		return nil, t, fmt.Errorf("safetensors: %s: tensor %q: %w", f.name, name, err)
	}
	return v, t, nil
}

// Int32s returns the named integer tensor (I32, I64 or U8) as int32s.
func (f *File) Int32s(name string) ([]int32, TensorInfo, error) {
	b, t, err := f.Bytes(name)
	if err != nil {
		return nil, t, err
	}
	v, err := DecodeInt32(t.DType, b)
	if err != nil {
		return nil, t, fmt.Errorf("safetensors: %s: tensor %q: %w", f.name, name, err)
	}
	return v, t, nil
}

// DecodeFloat32 widens raw little-endian data of a float dtype.
func DecodeFloat32(dt DType, b []byte) ([]float32, error) {
	n := len(b) / max(dt.Size(), 1)
	out := make([]float32, n)
	switch dt {
	case F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case F64:
		for i := range out {
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])))
		}
	case BF16:
		for i := range out {
			out[i] = floatx.FromBF16(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case F16:
		for i := range out {
			out[i] = floatx.FromF16(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case F8E4M3:
		for i := range out {
			out[i] = floatx.FromE4M3(b[i])
		}
	default:
		return nil, fmt.Errorf("dtype %s is not a float type", dt)
	}
	return out, nil
}

// DecodeInt32 narrows raw integer data to int32, failing on values out of range.
func DecodeInt32(dt DType, b []byte) ([]int32, error) {
	n := len(b) / max(dt.Size(), 1)
	out := make([]int32, n)
	switch dt {
	case I32:
		for i := range out {
			out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case I64:
		for i := range out {
			v := int64(binary.LittleEndian.Uint64(b[8*i:]))
			if v < math.MinInt32 || v > math.MaxInt32 {
				return nil, fmt.Errorf("element %d = %d does not fit in int32", i, v)
			}
			out[i] = int32(v)
		}
	case U8, Bool:
		for i := range out {
			out[i] = int32(b[i])
		}
	default:
		return nil, fmt.Errorf("dtype %s is not an integer type", dt)
	}
	return out, nil
}
