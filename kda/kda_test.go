package kda

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"k3/compute"
	"k3/internal/cpu"
)

func randn(r *rand.Rand, n int, s float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * s)
	}
	return v
}

func upload(t testing.TB, b compute.Backend, v []float32, dims ...int) compute.Tensor {
	t.Helper()
	x, err := b.Alloc(compute.F32, dims...)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Write(x, v); err != nil {
		t.Fatal(err)
	}
	return x
}

func read(t testing.TB, b compute.Backend, x compute.Tensor) []float32 {
	v := make([]float32, x.Len())
	if err := b.Read(v, x); err != nil {
		t.Fatal(err)
	}
	return v
}

type coreCase struct {
	lens      []int
	h, dk, dv int
	gate      compute.KDAGate
	gateScale float64 // spread of the raw gate
	gateShift float64
}

// runCore runs one random case through the given chunk size.
func runCore(t *testing.T, b compute.Backend, c coreCase, seed uint64, chunk int) (out, state []float32) {
	r := rand.New(rand.NewPCG(seed, 99))
	cu := []int32{0}
	for _, l := range c.lens {
		cu = append(cu, cu[len(cu)-1]+int32(l))
	}
	tt, n := int(cu[len(cu)-1]), len(c.lens)
	g := randn(r, tt*c.h*c.dk, c.gateScale)
	for i := range g {
		g[i] += float32(c.gateShift)
	}
	a := compute.KDAArgs{
		Q: upload(t, b, randn(r, tt*c.h*c.dk, 1), tt, c.h, c.dk), K: upload(t, b, randn(r, tt*c.h*c.dk, 1), tt, c.h, c.dk),
		V: upload(t, b, randn(r, tt*c.h*c.dv, 1), tt, c.h, c.dv), G: upload(t, b, g, tt, c.h, c.dk),
		Beta: upload(t, b, randn(r, tt*c.h, 2), tt, c.h), ALog: upload(t, b, randn(r, c.h, 0.5), c.h),
		DTBias: upload(t, b, randn(r, c.h*c.dk, 0.5), c.h*c.dk), Gate: c.gate, LowerBound: -5, Preprocess: true,
		Scale: float32(1 / math.Sqrt(float64(c.dk))), CuSeqlens: cu, ChunkSize: chunk,
		State: upload(t, b, randn(r, n*c.h*c.dk*c.dv, 0.3), n, c.h, c.dv, c.dk),
	}
	var err error
	if a.Out, err = b.Alloc(compute.F32, tt, c.h, c.dv); err != nil {
		t.Fatal(err)
	}
	if err := b.KDAChunk(&a); err != nil {
		t.Fatal(err)
	}
	return read(t, b, a.Out), read(t, b, a.State)
}

// TestChunkedEqualsRecurrent checks the chunked (WY) form against the
// token-by-token recurrence on random shapes, including T=1, lengths that
// are not multiples of the chunk, empty sequences inside a packed batch and
// extreme gates.
func TestChunkedEqualsRecurrent(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	cases := []coreCase{
		{lens: []int{1}, h: 1, dk: 8, dv: 8, gate: compute.GateLowerBound, gateScale: 1},
		{lens: []int{37}, h: 2, dk: 16, dv: 24, gate: compute.GateLowerBound, gateScale: 1},
		{lens: []int{0, 65, 0, 17, 130}, h: 3, dk: 8, dv: 12, gate: compute.GateLowerBound, gateScale: 2},
		{lens: []int{100}, h: 2, dk: 16, dv: 16, gate: compute.GateSoftplus, gateScale: 1},
		// Every gate at the lower bound: g = -5 on every channel of every step.
		{lens: []int{70, 3}, h: 2, dk: 16, dv: 8, gate: compute.GateLowerBound, gateScale: 0, gateShift: 60},
		// Softplus gates near -15 per step: cumulative sums of about -1000
		// per chunk.
		{lens: []int{130}, h: 1, dk: 16, dv: 16, gate: compute.GateSoftplus, gateScale: 0.5, gateShift: 14},
		// Mixed: some channels decay fast, others barely.
		{lens: []int{90, 0}, h: 2, dk: 32, dv: 16, gate: compute.GateSoftplus, gateScale: 8},
		// Values 64 wide: the triangular solve takes the rows before each
		// block of eight as one product.
		{lens: []int{100}, h: 2, dk: 32, dv: 64, gate: compute.GateLowerBound, gateScale: 1},
		// Log decays given, some of them above zero (growth): chunks
		// longer than 16 keep the whole-chunk factors there, the others
		// take blocks of 16.
		{lens: []int{150}, h: 2, dk: 16, dv: 16, gate: compute.GateGiven, gateScale: 0.3, gateShift: -0.1},
		{lens: []int{150}, h: 2, dk: 16, dv: 16, gate: compute.GateGiven, gateScale: 2, gateShift: -3},
	}
	for i, c := range cases {
		want, wantS := runCore(t, b, c, uint64(i), 0)
		for _, chunk := range []int{16, 64, 7} {
			got, gotS := runCore(t, b, c, uint64(i), chunk)
			for _, pair := range [][2][]float32{{got, want}, {gotS, wantS}} {
				for j := range pair[1] {
					g, w := float64(pair[0][j]), float64(pair[1][j])
					if math.IsNaN(g) || math.IsInf(g, 0) {
						t.Fatalf("case %d chunk %d: non-finite value %g at %d", i, chunk, g, j)
					}
					if !(math.Abs(g-w) <= 1e-4+1e-4*math.Abs(w)) {
						t.Fatalf("case %d chunk %d: element %d = %g, recurrent %g", i, chunk, j, g, w)
					}
				}
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	cfg := Config{Hidden: 16, NumHeads: 2, HeadDim: 4, ConvKernel: 0}
	if _, err := NewLayer(b, cfg, nil, 4); err == nil {
		t.Error("conv width 0 accepted")
	}
	cfg.ConvKernel = 4
	src := func(name string) (compute.DType, []int, []byte, error) {
		shape := []int{8, 16}
		if name == "k_proj.weight" {
			shape = []int{8, 15} // wrong
		}
		n := 1
		for _, s := range shape {
			n *= s
		}
		return compute.F32, shape, make([]byte, 4*n), nil
	}
	_, err := LoadWeights(b, cfg, src)
	if err == nil || !strings.Contains(err.Error(), "k_proj.weight") || !strings.Contains(err.Error(), "[8 15]") {
		t.Errorf("mis-shaped weight: %v", err)
	}
	// A state of the wrong size.
	x := upload(t, b, make([]float32, 3*2*4), 3, 2, 4)
	bad := compute.KDAArgs{Q: x, K: x, V: x, G: x, Beta: upload(t, b, make([]float32, 6), 3, 2), Scale: 1,
		State: upload(t, b, make([]float32, 2*2*4*4), 2, 2, 4, 4), Out: x}
	if err := b.KDAChunk(&bad); !errors.Is(err, compute.ErrShape) {
		t.Errorf("wrong state size: %v", err)
	}
	bad.State = upload(t, b, make([]float32, 2*4*4), 1, 2, 4, 4)
	bad.CuSeqlens = []int32{0, 5}
	if err := b.KDAChunk(&bad); !errors.Is(err, compute.ErrShape) {
		t.Errorf("cu_seqlens beyond T: %v", err)
	}
}

// TestLongSequenceInPieces runs a sequence longer than the backend's
// gather block (several hundred tokens) whole and as consecutive calls of
// whole chunks that carry the state: the chunks are the same, so outputs
// and the final state must match bit for bit, token by token too.
func TestLongSequenceInPieces(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	const tt, h, dk, dv = 700, 2, 16, 16
	r := rand.New(rand.NewPCG(7, 8))
	q, k := randn(r, tt*h*dk, 1), randn(r, tt*h*dk, 1)
	v, g := randn(r, tt*h*dv, 1), randn(r, tt*h*dk, 1)
	beta, state := randn(r, tt*h, 2), randn(r, h*dk*dv, 0.3)
	alog, dtb := randn(r, h, 0.5), randn(r, h*dk, 0.5)
	run := func(chunk, t0, t1 int, st []float32) (out, stOut []float32) {
		n := t1 - t0
		a := compute.KDAArgs{
			Q: upload(t, b, q[t0*h*dk:t1*h*dk], n, h, dk), K: upload(t, b, k[t0*h*dk:t1*h*dk], n, h, dk),
			V: upload(t, b, v[t0*h*dv:t1*h*dv], n, h, dv), G: upload(t, b, g[t0*h*dk:t1*h*dk], n, h, dk),
			Beta: upload(t, b, beta[t0*h:t1*h], n, h), ALog: upload(t, b, alog, h),
			DTBias: upload(t, b, dtb, h*dk), Gate: compute.GateLowerBound, LowerBound: -5, Preprocess: true,
			Scale: 0.25, CuSeqlens: []int32{0, int32(n)}, ChunkSize: chunk,
			State: upload(t, b, st, 1, h, dv, dk),
		}
		var err error
		if a.Out, err = b.Alloc(compute.F32, n, h, dv); err != nil {
			t.Fatal(err)
		}
		if err := b.KDAChunk(&a); err != nil {
			t.Fatal(err)
		}
		return read(t, b, a.Out), read(t, b, a.State)
	}
	for _, tc := range []struct{ chunk, piece int }{{16, 80}, {64, 128}, {7, 77}, {0, 90}} {
		whole, wholeS := run(tc.chunk, 0, tt, state)
		var pieces []float32
		st := state
		for t0 := 0; t0 < tt; t0 += tc.piece {
			out, s := run(tc.chunk, t0, min(t0+tc.piece, tt), st)
			pieces, st = append(pieces, out...), s
		}
		for i := range whole {
			if math.Float32bits(whole[i]) != math.Float32bits(pieces[i]) {
				t.Fatalf("chunk %d: output %d (token %d) = %g whole, %g in pieces of %d", tc.chunk, i, i/(h*dv), whole[i], pieces[i], tc.piece)
			}
		}
		for i := range wholeS {
			if math.Float32bits(wholeS[i]) != math.Float32bits(st[i]) {
				t.Fatalf("chunk %d: state %d = %g whole, %g in pieces of %d", tc.chunk, i, wholeS[i], st[i], tc.piece)
			}
		}
	}
}
