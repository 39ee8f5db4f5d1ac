package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/kernel"
)

// TestChunkOperandsNormal checks that under strong decays no subnormal
// value enters the chunk stage's products: the decayed keys and queries,
// their products with the state, the decay factors, the corrected values
// and the state itself. Some CPUs run each operation on a subnormal a
// hundred times slower (docs/bench), and the terms that would carry them
// are far below float32's resolution of the sums they join.
func TestChunkOperandsNormal(t *testing.T) {
	b := New(1)
	defer b.Close()
	const T, h, dk, dv = 200, 2, 32, 16
	cases := []struct {
		name         string
		gate         compute.KDAGate
		scale, shift float64
	}{
		{"every gate at the lower bound", compute.GateLowerBound, 0, 60},
		{"near the lower bound", compute.GateLowerBound, 1, 2},
		{"softplus, spread", compute.GateSoftplus, 8, 0},
	}
	for ci, c := range cases {
		r := rand.New(rand.NewPCG(uint64(ci), 5))
		mk := func(s, shift float64, dims ...int) compute.Tensor {
			x, err := b.Alloc(compute.F32, dims...)
			require.NoError(t, err)
			v := F32(x)
			for i := range v {
				v[i] = float32(r.NormFloat64()*s + shift)
			}
			return x
		}
		for _, chunk := range []int{16, 64} {
			a := compute.KDAArgs{
				Q: mk(1, 0, T, h, dk), K: mk(1, 0, T, h, dk), V: mk(1, 0, T, h, dv), G: mk(c.scale, c.shift, T, h, dk),
				Beta: mk(2, 0, T, h), ALog: mk(0.5, 0, h), DTBias: mk(0.5, 0, h*dk), Gate: c.gate, LowerBound: -5,
				Preprocess: true, Scale: float32(1 / math.Sqrt(dk)), ChunkSize: chunk,
				State: mk(0.3, 0, 1, h, dv, dk), Out: mk(0, 0, T, h, dv),
			}
			j, err := b.kdaPrepare(&a)
			require.NoError(t, err)
			sc := new(kdaScratch)
			for hd := range h {
				j.load(sc, hd, 0, T)
				st := make([]float32, dk*dv) // K-first, as the chunks take it
				kernel.Transpose(st, j.state[hd*dk*dv:(hd+1)*dk*dv], dv, dk)
				for c0 := 0; c0 < T; c0 += chunk {
					j.chunkStep(sc, st, hd, 0, c0, min(c0+chunk, T))
					for name, v := range map[string][]float32{
						"decayed keys and queries": sc.kq, "their products with the state": sc.uo,
						"decay factors": sc.e, "chunk decay": sc.tmp, "corrected values": sc.uo, "update's decayed keys": sc.kdt, "state": st,
					} {
						for i, x := range v {
							if x != 0 && math.Abs(float64(x)) < 0x1p-126 {
								t.Fatalf("%s, chunk %d, head %d, tokens from %d: %s[%d] = %g is subnormal",
									c.name, chunk, hd, c0, name, i, x)
							}
						}
					}
				}
			}
		}
	}
}

// TestUnsafeFewTerms: the few-channel loop of the chunks' unsafe terms
// gives the general loop's bits, output and state, with 1 to 12 channels
// decaying past safeSpan within every chunk (gates given; some keys and
// queries zeros of either sign; with grow, a gate above zero, where the
// early stop of the span walk does not apply).
func TestUnsafeFewTerms(t *testing.T) {
	defaultFew := unsafeFew
	defer func() { unsafeFew = defaultFew }()
	require.Greater(t, defaultFew, 2, "the few-channel loop takes the common chunks: one or two channels")
	b := New(2)
	defer b.Close()
	const T, h, dk, dv, chunk = 96, 2, 16, 8, 16
	for _, strong := range []int{1, 2, 3, 5, 7, 8, 12} {
		for _, grow := range []bool{false, true} {
			r := rand.New(rand.NewPCG(uint64(strong), 9))
			vals := func(n int, f func(i int) float32) []float32 {
				v := make([]float32, n)
				for i := range v {
					v[i] = f(i)
				}
				return v
			}
			signedZero := func(x float64) float32 {
				switch r.IntN(8) {
				case 0:
					return 0
				case 1:
					return float32(math.Copysign(0, -1))
				}
				return float32(x)
			}
			q := vals(T*h*dk, func(int) float32 { return signedZero(r.NormFloat64()) })
			k := vals(T*h*dk, func(int) float32 { return signedZero(r.NormFloat64()) })
			v := vals(T*h*dv, func(int) float32 { return float32(r.NormFloat64()) })
			beta := vals(T*h, func(int) float32 { return float32(r.Float64()) })
			state0 := vals(h*dv*dk, func(int) float32 { return float32(0.1 * r.NormFloat64()) })
			g := vals(T*h*dk, func(i int) float32 {
				switch ch := i % dk; {
				case ch < strong:
					return float32(-6 - 2*r.Float64())
				case grow && ch == dk-1 && r.IntN(3) == 0:
					return 0.5
				}
				return float32(-0.05 * r.Float64())
			})
			// Every chunk has strong channels past safeSpan (cumulative
			// gates from its first token to its last).
			unsafe := 0
			for c0 := 0; c0 < T; c0 += chunk {
				for hd := range h {
					for ch := range dk {
						var span float64
						for i := c0 + 1; i < c0+chunk; i++ {
							span += float64(g[(i*h+hd)*dk+ch])
						}
						if -span > safeSpan {
							unsafe++
						}
					}
				}
			}
			require.Equal(t, strong*h*T/chunk, unsafe)
			var got [2][]float32
			for run, few := range []int{defaultFew, 0} {
				unsafeFew = few
				a := compute.KDAArgs{Q: upload(b, q, T, h, dk), K: upload(b, k, T, h, dk), V: upload(b, v, T, h, dv),
					G: upload(b, g, T, h, dk), Beta: upload(b, beta, T, h), Gate: compute.GateGiven, Scale: 0.25,
					ChunkSize: chunk, State: upload(b, state0, 1, h, dv, dk), Out: must(b.Alloc(compute.F32, T, h, dv))}
				require.NoError(t, b.KDAChunk(&a))
				got[run] = append(slices.Clone(F32(a.Out)), F32(a.State)...)
			}
			for i := range got[0] {
				require.Equal(t, math.Float32bits(got[1][i]), math.Float32bits(got[0][i]),
					"%d strong channels (grow %v): value %d: %g few, %g general", strong, grow, i, got[0][i], got[1][i])
			}
		}
	}
}

// TestKDARecordsRefused: replay records come only from the token-by-token
// recurrence with keys as wide as values; other calls, and records or raw
// projections of the wrong shape, are errors that name them, and leave
// the state alone.
func TestKDARecordsRefused(t *testing.T) {
	b := New(1)
	defer b.Close()
	r := rand.New(rand.NewPCG(5, 5))
	const T, H, D = 3, 2, 4
	hd := H * D
	up := func(n int, dims ...int) compute.Tensor {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		x, err := b.Alloc(compute.F32, dims...)
		require.NoError(t, err)
		require.NoError(t, b.Write(x, v))
		return x
	}
	args := func() *compute.KDAArgs {
		return &compute.KDAArgs{QKV: up(T*3*hd, T, 3*hd), G: up(T*hd, T, H, D), Beta: up(T*H, T, H), Gate: compute.GateGiven,
			Preprocess: true, Scale: 0.5, State: up(hd*D, 1, H, D, D), Out: up(T*hd, T, H, D),
			Records: up(T*6*hd, T, 6*hd), Raw: up(T*3*hd, T, 3*hd)}
	}
	a := args()
	a.ChunkSize = 16
	before := append([]float32(nil), F32(a.State)...)
	require.ErrorIs(t, b.KDAChunk(a), compute.ErrUnsupported)
	require.Equal(t, before, F32(a.State))
	a = args()
	a.Records = up(T*5*hd, T, 5*hd)
	require.ErrorContains(t, b.KDAChunk(a), "records")
	a = args()
	a.Raw = up(T*2*hd, T, 2*hd)
	require.ErrorContains(t, b.KDAChunk(a), "raw projections")
	require.NoError(t, b.KDAChunk(args()))
}
