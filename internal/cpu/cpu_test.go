package cpu

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/floatx"
	"k3/internal/kernel"
	"k3/internal/safetensors"
)

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// normals returns n draws of a standard normal from r.
func normals(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// upload returns a new f32 tensor of b holding v.
func upload(b *Backend, v []float32, dims ...int) compute.Tensor {
	t := must(b.Alloc(compute.F32, dims...))
	must(0, b.Write(t, v))
	return t
}

// uploadI32 returns a new I32 tensor of b holding v (positions).
func uploadI32(b *Backend, v []int32) compute.Tensor {
	t := must(b.Alloc(compute.I32, len(v)))
	must(0, b.Write(t, v))
	return t
}

func TestPlainOps(t *testing.T) {
	b := New(2)
	defer b.Close()
	x := must(b.Alloc(compute.F32, 2, 3))
	if err := b.Write(x, []float32{1, 2, 3, -1, 0, 4}); err != nil {
		t.Fatal(err)
	}
	wt := safetensors.F32Tensor("w", []int{2, 3}, []float32{1, 0, -1, 0.5, 0.5, 0.5})
	w := must(b.FromHost(compute.F32, compute.F32, wt.Data, 2, 3))
	wbf := must(b.FromHost(compute.BF16, compute.F32, wt.Data, 2, 3))
	y := must(b.Alloc(compute.F32, 2, 2))
	for _, weight := range []compute.Tensor{w, wbf} {
		if err := b.MatMul(y, x, weight); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, 4)
		must(0, b.Read(got, y))
		want := []float32{-2, 3, -5, 1.5}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("matmul %v: %v want %v", weight.DType, got, want)
			}
		}
	}
	if err := b.MatMul(y, x, must(b.Alloc(compute.F32, 2, 4))); !errors.Is(err, compute.ErrShape) {
		t.Errorf("mismatched matmul: %v", err)
	}

	n := must(b.Alloc(compute.F32, 2, 3))
	if err := b.RMSNorm(n, x, compute.Tensor{}, 1e-6); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 6)
	must(0, b.Read(got, n))
	if r := 1 / math.Sqrt(14.0/3+1e-6); math.Abs(float64(got[0])-r) > 1e-6 {
		t.Errorf("rmsnorm %v", got)
	}
	if err := b.Binary(compute.Add, n, x, x.Rows(0, 1).Reshape(3)); err != nil {
		t.Fatal(err)
	}
	must(0, b.Read(got, n))
	if got[3] != 0 || got[5] != 7 {
		t.Errorf("broadcast add %v", got)
	}
	ids := must(b.Alloc(compute.I32, 2))
	must(0, b.Write(ids, []int32{1, 0}))
	e := must(b.Alloc(compute.F32, 2, 3))
	if err := b.Embedding(e, wbf, ids); err != nil {
		t.Fatal(err)
	}
	must(0, b.Read(got, e))
	if got[0] != 0.5 || got[3] != 1 {
		t.Errorf("embedding %v", got)
	}
	must(0, b.Write(ids, []int32{2, 0}))
	if err := b.Embedding(e, wbf, ids); err == nil {
		t.Error("out-of-vocabulary id accepted")
	}
	if err := b.KDAChunk(&compute.KDAArgs{}); !errors.Is(err, compute.ErrShape) {
		t.Errorf("KDAChunk: %v", err)
	}
}

// TestInvariantRows holds the backend to the seam's promise: products of up
// to compute.InvariantRows rows must stay on the kernels whose results do
// not depend on the row count.
func TestInvariantRows(t *testing.T) {
	if kernel.PackedMinRows <= compute.InvariantRows {
		t.Fatalf("the packed GEMM starts at %d rows, inside compute.InvariantRows = %d", kernel.PackedMinRows, compute.InvariantRows)
	}
}

// TestGatedActParallel checks that GatedAct on the pool (past
// gatedParallel elements, split at any multiple of 64) gives the serial
// kernels' values to the bit, for every activation; the output gate
// (SigmoidGate) also in place, as the layers run it, against the
// scalar sigmoid and one product.
func TestGatedActParallel(t *testing.T) {
	b := New(3)
	defer b.Close()
	const n = 3*gatedParallel + 37
	g, u := make([]float32, n), make([]float32, n)
	for i := range g {
		g[i] = float32(math.Sin(float64(i))) * 9
		u[i] = float32(math.Cos(float64(i)*0.7)) * 40
	}
	gt, ut := must(b.Alloc(compute.F32, n)), must(b.Alloc(compute.F32, n))
	if err := b.Write(gt, g); err != nil {
		t.Fatal(err)
	}
	if err := b.Write(ut, u); err != nil {
		t.Fatal(err)
	}
	for _, act := range []compute.Activation{{Kind: compute.SwiGLU}, {Kind: compute.SiTU, Beta: 4, LinearBeta: 25}, {Kind: compute.SiTU, Beta: 4}, {Kind: compute.SigmoidGate}} {
		dt := must(b.Alloc(compute.F32, n))
		if err := b.GatedAct(act, dt, gt, ut); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, n)
		if err := b.Read(got, dt); err != nil {
			t.Fatal(err)
		}
		want := make([]float32, n)
		switch act.Kind {
		case compute.SwiGLU:
			kernel.SwiGLU(want, g, u)
		case compute.SigmoidGate:
			for i := range want {
				want[i] = kernel.Sigmoid(g[i]) * u[i]
			}
			// In place, as KDA and gated attention run it.
			it := must(b.Alloc(compute.F32, n))
			require.NoError(t, b.Write(it, u))
			require.NoError(t, b.GatedAct(act, it, gt, it))
			inPlace := make([]float32, n)
			require.NoError(t, b.Read(inPlace, it))
			require.Equal(t, want, inPlace, "sigmoid gate in place")
		default:
			kernel.SiTU(want, g, u, act.Beta, act.LinearBeta)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%+v element %d: %v on the pool, %v serial", act, i, got[i], want[i])
			}
		}
	}
}

func TestFill(t *testing.T) {
	b := New(1)
	for _, dt := range []compute.DType{compute.F32, compute.BF16, compute.F16, compute.I32} {
		x, err := b.Alloc(dt, 3, 5)
		require.NoError(t, err)
		require.NoError(t, b.Fill(x.Rows(1, 2), 2.5))
		for i := range 15 {
			want := 0.0
			if i >= 5 && i < 10 {
				want = 2.5
				if dt == compute.I32 {
					want = 2
				}
			}
			var got float64
			switch dt {
			case compute.F32:
				got = float64(F32(x)[i])
			case compute.I32:
				got = float64(I32(x)[i])
			case compute.BF16:
				got = float64(floatx.FromBF16(U16(x)[i]))
			case compute.F16:
				got = float64(floatx.FromF16(U16(x)[i]))
			}
			require.Equal(t, want, got, "%v element %d", dt, i)
		}
	}
}
