package weights_test

import (
	"errors"
	"math"
	"testing"

	"k3/compute"
	"k3/internal/cpu"
	"k3/internal/floatx"
	"k3/internal/weights"
)

func bf16Bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, f := range v {
		h := floatx.BF16(f)
		b[2*i], b[2*i+1] = byte(h), byte(h>>8)
	}
	return b
}

// TestUploadAsKeepsBF16 loads a bf16 tensor to the host, rearranges it and
// uploads it back: it must stay BF16 with the same values, while an F32
// source uploads as F32 and a value that is not a bfloat16 is an error.
func TestUploadAsKeepsBF16(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	vals := []float32{1, -2.5, 0.15625, 3e-3, 1024, -0.75}
	for i := range vals {
		vals[i] = floatx.FromBF16(floatx.BF16(vals[i]))
	}
	src := func(name string) (compute.DType, []int, []byte, error) {
		switch name {
		case "w.bf16":
			return compute.BF16, []int{2, 3}, bf16Bytes(vals), nil
		case "w.f32":
			b := make([]byte, 4*len(vals))
			for i, f := range vals {
				u := math.Float32bits(f)
				b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
			}
			return compute.F32, []int{2, 3}, b, nil
		}
		return 0, nil, nil, errors.New("no tensor " + name)
	}
	ld := &weights.Loader{B: be, Src: src}
	v, dt := ld.HostStored("w.bf16", 2, 3)
	if dt != compute.BF16 {
		t.Fatalf("stored dtype %v, want BF16", dt)
	}
	swapped := append(append([]float32(nil), v[3:]...), v[:3]...)
	w := ld.UploadAs(dt, swapped, 2, 3)
	if ld.Err != nil {
		t.Fatal(ld.Err)
	}
	if w.DType != compute.BF16 {
		t.Fatalf("uploaded as %v, want BF16", w.DType)
	}
	back := make([]float32, 6)
	if err := be.Read(back, w); err != nil {
		t.Fatal(err)
	}
	for i := range back {
		if back[i] != swapped[i] {
			t.Fatalf("[%d] = %g, want %g", i, back[i], swapped[i])
		}
	}
	v32, dt32 := ld.HostStored("w.f32", 2, 3)
	if w32 := ld.UploadAs(dt32, v32, 2, 3); ld.Err != nil || w32.DType != compute.F32 {
		t.Fatalf("f32 source: dtype %v, err %v", w32.DType, ld.Err)
	}
	ld.UploadAs(compute.BF16, []float32{0.1}, 1)
	if ld.Err == nil {
		t.Fatal("0.1 uploaded as bf16 without an error; it is not a bfloat16 value")
	}
}
