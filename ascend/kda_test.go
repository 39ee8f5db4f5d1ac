package ascend

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// KDAChunk token by token through aclnnRecurrentGatedDeltaRule against
// the pure-Go backend: packed and separate q/k/v, with and without the
// in-kernel preprocessing, every gate mode, sequences of 1 to 8 tokens.
func TestKDARecurrent(t *testing.T) { eachDriver(t, 64<<20, testKDARecurrent) }

func testKDARecurrent(t *testing.T, a *Backend) {
	c := cpu.New(1)
	defer c.Close()
	rng := rand.New(rand.NewPCG(31, 32))
	const H, D = 2, 8
	for _, cu := range [][]int32{{0, 1}, {0, 1, 2, 3}, {0, 8, 11}} {
		T, N := int(cu[len(cu)-1]), len(cu)-1
		for _, packed := range []bool{false, true} {
			for _, pre := range []bool{false, true} {
				for _, gate := range []compute.KDAGate{compute.GateGiven, compute.GateSoftplus, compute.GateLowerBound} {
					args := func(b compute.Backend, up func(dt compute.DType, v []float32, shape ...int) compute.Tensor) *compute.KDAArgs {
						k := &compute.KDAArgs{Gate: gate, Preprocess: pre, Scale: 0.35, CuSeqlens: cu, LowerBound: -5}
						// Without the in-kernel preprocessing the caller gives
						// unit q and k and beta in (0, 1), as the model does;
						// raw values would make the recurrence diverge.
						unit := func(v []float32) []float32 {
							if !pre {
								for i := 0; i < len(v); i += D {
									var ss float64
									for _, x := range v[i : i+D] {
										ss += float64(x) * float64(x)
									}
									for j := i; j < i+D; j++ {
										v[j] = float32(float64(v[j]) / math.Sqrt(ss))
									}
								}
							}
							return v
						}
						if packed {
							k.QKV = up(compute.F32, unit(randF32(rng, T*3*H*D)), T, 3*H*D)
						} else {
							k.Q = up(compute.F32, unit(randF32(rng, T*H*D)), T, H, D)
							k.K = up(compute.F32, unit(randF32(rng, T*H*D)), T, H, D)
							k.V = up(compute.F32, randF32(rng, T*H*D), T, H, D)
						}
						g := randF32(rng, T*H*D)
						if gate == compute.GateGiven {
							for i := range g {
								g[i] = -0.1 * g[i] * g[i] // a log decay is at most 0
							}
						}
						k.G = up(compute.F32, g, T, H, D)
						beta := randF32(rng, T*H)
						if !pre {
							for i := range beta {
								beta[i] = rng.Float32()
							}
						}
						k.Beta = up(compute.F32, beta, T, H)
						k.ALog = up(compute.F32, randF32(rng, H), H)
						k.DTBias = up(compute.F32, randF32(rng, H*D), H*D)
						k.State = up(compute.F32, randF32(rng, N*H*D*D), N, H, D, D)
						k.Out = up(compute.F32, make([]float32, T*H*D), T, H, D)
						return k
					}
					seed := rng.Uint64()
					mk := func(b compute.Backend) *compute.KDAArgs {
						return args(b, func(dt compute.DType, v []float32, shape ...int) compute.Tensor {
							x, err := b.FromHost(dt, compute.F32, f32bytes(v), shape...)
							require.NoError(t, err)
							return x
						})
					}
					rng = rand.New(rand.NewPCG(seed, 1))
					ka := mk(a)
					rng = rand.New(rand.NewPCG(seed, 1))
					kc := mk(c)
					require.NoError(t, a.KDAChunk(ka))
					require.NoError(t, c.KDAChunk(kc))
					what := []any{"cu %v packed %v pre %v gate %v", cu, packed, pre, gate}
					closeRel(t, read(t, c, kc.Out), read(t, a, ka.Out), 2e-5, 1e-5, what...)
					closeRel(t, read(t, c, kc.State), read(t, a, ka.State), 2e-5, 1e-5, what...)
				}
			}
		}
	}
}

// closeRel checks |got - want| <= atol + rtol·|want| elementwise.
func closeRel(t *testing.T, want, got []float32, atol, rtol float64, what ...any) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > atol+rtol*math.Abs(float64(want[i])) {
			t.Errorf("element %d: %g, want %g: %v", i, got[i], want[i], what)
			return
		}
	}
}

// Prefill (a chunked call, sequences longer than the operator's eight
// tokens) runs the recurrence in pieces, against the pure-Go backend's
// chunked form: the same function within rounding.
func TestKDAPrefillPieces(t *testing.T) {
	eachDriver(t, 64<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		rng := rand.New(rand.NewPCG(71, 72))
		const H, D = 2, 16
		cu := []int32{0, 20, 20, 37, 38}
		T, N := int(cu[len(cu)-1]), len(cu)-1
		qkv, g, beta := randF32(rng, T*3*H*D), randF32(rng, T*H*D), randF32(rng, T*H)
		alog, dtb, st := randF32(rng, H), randF32(rng, H*D), randF32(rng, N*H*D*D)
		for _, chunk := range []int{0, 16} {
			run := func(b compute.Backend) (out, state []float32) {
				up := func(v []float32, shape ...int) compute.Tensor {
					x, err := b.FromHost(compute.F32, compute.F32, f32bytes(v), shape...)
					require.NoError(t, err)
					return x
				}
				k := &compute.KDAArgs{QKV: up(qkv, T, 3*H*D), G: up(g, T, H, D), Beta: up(beta, T, H), ALog: up(alog, H), DTBias: up(dtb, H*D),
					Gate: compute.GateLowerBound, LowerBound: -5, Preprocess: true, Scale: 0.25, CuSeqlens: cu,
					State: up(st, N, H, D, D), Out: up(make([]float32, T*H*D), T, H, D), ChunkSize: chunk}
				require.NoError(t, b.KDAChunk(k))
				return read(t, b, k.Out), read(t, b, k.State)
			}
			wantOut, wantSt := run(c)
			gotOut, gotSt := run(a)
			closeRel(t, wantOut, gotOut, 2e-5, 1e-4, "out, chunk", chunk)
			closeRel(t, wantSt, gotSt, 2e-5, 1e-4, "state, chunk", chunk)
		}
	})
}

// CausalConv's composition against the pure-Go backend: packed sequences
// of different lengths (one empty), f32 and bf16 taps, the state carried
// across two calls.
func TestCausalConv(t *testing.T) {
	eachDriver(t, 16<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		rng := rand.New(rand.NewPCG(41, 42))
		const C, W = 24, 4
		cu := []int32{0, 1, 1, 6, 8}
		T, N := int(cu[len(cu)-1]), len(cu)-1
		for _, dt := range []compute.DType{compute.F32} { // the pure-Go backend takes f32 taps
			wa, wc := both(t, a, c, dt, randF32(rng, C*W), C, W)
			sa, sc := both(t, a, c, compute.F32, randF32(rng, N*(W-1)*C), N, W-1, C)
			for range 2 {
				xa, xc := both(t, a, c, compute.F32, randF32(rng, T*C), T, C)
				oa, err := a.Alloc(compute.F32, T, C)
				require.NoError(t, err)
				oc, err := c.Alloc(compute.F32, T, C)
				require.NoError(t, err)
				require.NoError(t, a.CausalConv(&compute.ConvArgs{X: xa, Weight: wa, State: sa, Out: oa, CuSeqlens: cu}))
				require.NoError(t, c.CausalConv(&compute.ConvArgs{X: xc, Weight: wc, State: sc, Out: oc, CuSeqlens: cu}))
				closeRel(t, read(t, c, oc), read(t, a, oa), 1e-6, 1e-5, "out", dt)
				closeRel(t, read(t, c, sc), read(t, a, sa), 0, 0, "state", dt)
			}
		}
	})
}

// KDAChunk with replay records (the composition of a decode step or an
// exact run when the fused step is not mapped) against the pure-Go
// backend: decode steps of one token a sequence, runs of several tokens
// (past the operator's eight) and an empty sequence, states in place and
// in a pool; records, outputs and states within rounding.
func TestKDARecords(t *testing.T) {
	eachDriver(t, 64<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		rng := rand.New(rand.NewPCG(81, 82))
		const H, D = 2, 8
		hd := H * D
		for _, cu := range [][]int32{{0, 1}, {0, 1, 2, 3}, {0, 3, 3, 4, 13}} {
			T, N := int(cu[len(cu)-1]), len(cu)-1
			for _, pool := range []bool{false, true} {
				qkv, g, beta := randF32(rng, T*3*hd), randF32(rng, T*hd), randF32(rng, T*H)
				alog, dtb, raw := randF32(rng, H), randF32(rng, hd), randF32(rng, T*3*hd)
				P := N
				var slots []int32
				if pool {
					P = N + 3
					for s := range N {
						slots = append(slots, int32(P-1-2*s%P))
					}
				}
				st := randF32(rng, P*hd*D)
				for i := range st {
					st[i] *= 0.1
				}
				run := func(b compute.Backend) (rec, out, state []float32) {
					up := func(v []float32, shape ...int) compute.Tensor {
						x, err := b.FromHost(compute.F32, compute.F32, f32bytes(v), shape...)
						require.NoError(t, err)
						return x
					}
					k := &compute.KDAArgs{QKV: up(qkv, T, 3*hd), G: up(g, T, H, D), Beta: up(beta, T, H), ALog: up(alog, H), DTBias: up(dtb, hd),
						Gate: compute.GateLowerBound, LowerBound: -5, Preprocess: true, Scale: 0.35, CuSeqlens: cu,
						State: up(st, P, H, D, D), Out: up(make([]float32, T*hd), T, H, D),
						Records: up(make([]float32, T*6*hd), T, 6*hd), Raw: up(raw, T, 3*hd)}
					if pool {
						x, err := b.FromHost(compute.I32, compute.I32, i32bytes(slots), N)
						require.NoError(t, err)
						k.StateIdx = x
					}
					require.NoError(t, b.KDAChunk(k))
					return read(t, b, k.Records), read(t, b, k.Out), read(t, b, k.State)
				}
				wantRec, wantOut, wantSt := run(c)
				gotRec, gotOut, gotSt := run(a)
				what := []any{"cu", cu, "pool", pool}
				closeRel(t, wantRec, gotRec, 2e-5, 1e-4, append(what, "records")...)
				closeRel(t, wantOut, gotOut, 2e-5, 1e-4, append(what, "out")...)
				closeRel(t, wantSt, gotSt, 2e-5, 1e-4, append(what, "state")...)
			}
		}
		// Records need token by token and keys as wide as values: other
		// calls go to the general path, which refuses them without a host
		// fallback, naming the operation.
		up := func(v []float32, shape ...int) compute.Tensor {
			x, err := a.FromHost(compute.F32, compute.F32, f32bytes(v), shape...)
			require.NoError(t, err)
			return x
		}
		k := &compute.KDAArgs{QKV: up(randF32(rng, 2*3*hd), 2, 3*hd), G: up(randF32(rng, 2*hd), 2, H, D), Beta: up(randF32(rng, 2*H), 2, H),
			Gate: compute.GateGiven, Preprocess: true, Scale: 0.35, State: up(randF32(rng, hd*D), 1, H, D, D),
			Out: up(make([]float32, 2*hd), 2, H, D), ChunkSize: 16,
			Records: up(make([]float32, 2*6*hd), 2, 6*hd), Raw: up(randF32(rng, 2*3*hd), 2, 3*hd)}
		require.ErrorContains(t, a.KDAChunk(k), "KDAChunk")
	})
}
