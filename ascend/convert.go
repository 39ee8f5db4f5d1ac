package ascend

import (
	"encoding/binary"
	"fmt"
	"math"

	"k3/compute"
	"k3/internal/floatx"
)

// hostBytes converts n little-endian elements of dtype src to dtype dt on
// the host, before they are uploaded. Same-type data is returned as is.
func hostBytes(dt, src compute.DType, data []byte, n int) ([]byte, error) {
	if src.Size() == 0 || dt.Size() == 0 || len(data) != n*src.Size() {
		return nil, fmt.Errorf("%w: %d bytes of %v for %d elements", compute.ErrShape, len(data), src, n)
	}
	if dt == src {
		return data, nil
	}
	f := make([]float32, n)
	switch src {
	case compute.F32:
		for i := range f {
			f[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
	case compute.BF16:
		for i := range f {
			f[i] = floatx.FromBF16(binary.LittleEndian.Uint16(data[2*i:]))
		}
	case compute.F16:
		for i := range f {
			f[i] = floatx.FromF16(binary.LittleEndian.Uint16(data[2*i:]))
		}
	default:
		return nil, fmt.Errorf("%w: conversion from %v to %v", compute.ErrUnsupported, src, dt)
	}
	out := make([]byte, n*dt.Size())
	switch dt {
	case compute.F32:
		for i, v := range f {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		}
	case compute.BF16:
		for i, v := range f {
			binary.LittleEndian.PutUint16(out[2*i:], floatx.BF16(v))
		}
	case compute.F16:
		for i, v := range f {
			binary.LittleEndian.PutUint16(out[2*i:], floatx.F16(v))
		}
	default:
		return nil, fmt.Errorf("%w: conversion from %v to %v", compute.ErrUnsupported, src, dt)
	}
	return out, nil
}
