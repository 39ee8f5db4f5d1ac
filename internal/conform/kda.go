package conform

import (
	"context"
	"fmt"
	"strconv"

	"k3/compute"
	"k3/kda"
)

func init() {
	handlers["kda.recurrent"] = runKDACore
	handlers["kda.core"] = runKDACore
	handlers["kda.varlen"] = runKDACore
	handlers["kda.decode"] = runKDADecode
}

// Tolerances from testdata/kda/README.md: a float32 chunked implementation
// lands within about 5e-6 of the core files; 1e-5 for the layer files.
const kdaAtol, kdaRtol = 2e-5, 1e-4

// KDAChunkSizes are the execution paths every KDA core case is run
// through: token by token, and chunked with chunk 16 and 64.
var KDAChunkSizes = []int{0, 16, 64}

type kdaCase struct {
	q, k, v, g, beta     []float32
	alog, dtb, state     []float32
	cu                   []int32
	b, t, h, dk, dv, nst int
	gate                 compute.KDAGate
	lb                   float32
	pre                  bool
	scale                float32
}

func loadKDACore(f *caseFile) (*kdaCase, error) {
	c := &kdaCase{}
	var err error
	var qs []int
	if c.q, qs, err = f.f32("q", -1, -1, -1, -1); err != nil {
		return nil, err
	}
	c.b, c.t, c.h, c.dk = qs[0], qs[1], qs[2], qs[3]
	if c.k, _, err = f.f32("k", c.b, c.t, c.h, c.dk); err != nil {
		return nil, err
	}
	var vs []int
	if c.v, vs, err = f.f32("v", c.b, c.t, c.h, -1); err != nil {
		return nil, err
	}
	c.dv = vs[3]
	if f.has("g_raw") {
		c.pre = true
		if c.g, _, err = f.f32("g_raw", c.b, c.t, c.h, c.dk); err != nil {
			return nil, err
		}
		if c.beta, _, err = f.f32("beta_raw", c.b, c.t, c.h); err != nil {
			return nil, err
		}
		if c.alog, _, err = f.f32("A_log", c.h); err != nil {
			return nil, err
		}
		if c.dtb, _, err = f.f32("dt_bias", c.h*c.dk); err != nil {
			return nil, err
		}
		switch lb := f.Metadata()["lower_bound"]; lb {
		case "none", "":
			c.gate = compute.GateSoftplus
		default:
			v, err := strconv.ParseFloat(lb, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: metadata lower_bound %q: %v", f.Name(), lb, err)
			}
			c.gate, c.lb = compute.GateLowerBound, float32(v)
		}
	} else {
		if c.g, _, err = f.f32("g", c.b, c.t, c.h, c.dk); err != nil {
			return nil, err
		}
		if c.beta, _, err = f.f32("beta", c.b, c.t, c.h); err != nil {
			return nil, err
		}
	}
	scale, err := f.metaFloat("scale")
	if err != nil {
		return nil, err
	}
	c.scale = float32(scale)
	if f.has("cu_seqlens") {
		if c.cu, _, err = f.i32("cu_seqlens", -1); err != nil {
			return nil, err
		}
	}
	c.nst = c.b
	if c.cu != nil {
		c.nst = len(c.cu) - 1
	}
	if c.state, _, err = f.f32("initial_state", c.nst, c.h, c.dk, c.dv); err != nil {
		return nil, err
	}
	return c, nil
}

// run executes the case with batch rows [b0, b1) packed (or the whole
// varlen batch) over token range [t0, t1) from the given states.
func (c *kdaCase) run(b compute.Backend, chunk int, b0, b1, t0, t1 int, state []float32) (out, final []float32, err error) {
	nb, nt := b1-b0, t1-t0
	pack := func(x []float32, w int) []float32 {
		p := make([]float32, 0, nb*nt*c.h*w)
		for bi := b0; bi < b1; bi++ {
			p = append(p, x[(bi*c.t+t0)*c.h*w:(bi*c.t+t1)*c.h*w]...)
		}
		return p
	}
	cu := c.cu
	if cu == nil {
		cu = make([]int32, nb+1)
		for i := range cu {
			cu[i] = int32(i * nt)
		}
	}
	nst := len(cu) - 1
	a := compute.KDAArgs{Gate: c.gate, LowerBound: c.lb, Preprocess: c.pre, Scale: c.scale, CuSeqlens: cu, ChunkSize: chunk}
	tt := nb * nt
	if a.Q, err = upload(b, pack(c.q, c.dk), tt, c.h, c.dk); err != nil {
		return
	}
	if a.K, err = upload(b, pack(c.k, c.dk), tt, c.h, c.dk); err != nil {
		return
	}
	if a.V, err = upload(b, pack(c.v, c.dv), tt, c.h, c.dv); err != nil {
		return
	}
	if a.G, err = upload(b, pack(c.g, c.dk), tt, c.h, c.dk); err != nil {
		return
	}
	if a.Beta, err = upload(b, pack(c.beta, 1), tt, c.h); err != nil {
		return
	}
	if c.pre {
		if a.ALog, err = upload(b, c.alog, c.h); err != nil {
			return
		}
		if a.DTBias, err = upload(b, c.dtb, c.h*c.dk); err != nil {
			return
		}
	}
	// The files keep states K-first; k3 keeps them V-first.
	vf := make([]float32, len(state))
	kda.TransposeState(vf, state, nst*c.h, c.dk, c.dv)
	if a.State, err = upload(b, vf, nst, c.h, c.dv, c.dk); err != nil {
		return
	}
	if a.Out, err = b.Alloc(compute.F32, tt, c.h, c.dv); err != nil {
		return
	}
	if err = b.KDAChunk(&a); err != nil {
		return
	}
	if out, err = download(b, a.Out); err != nil {
		return
	}
	vf, err = download(b, a.State)
	if err != nil {
		return
	}
	final = make([]float32, len(vf))
	kda.TransposeState(final, vf, nst*c.h, c.dv, c.dk)
	return
}

func runKDACore(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	c, err := loadKDACore(f)
	if err != nil {
		return err
	}
	wantO, _, err := f.f32("o", c.b, c.t, c.h, c.dv)
	if err != nil {
		return err
	}
	wantS, _, err := f.f32("final_state", c.nst, c.h, c.dk, c.dv)
	if err != nil {
		return err
	}
	var hist []float32
	if f.has("state_history") {
		if hist, _, err = f.f32("state_history", c.b, c.t, c.h, c.dk, c.dv); err != nil {
			return err
		}
	}
	for _, chunk := range KDAChunkSizes {
		out, final, err := c.run(b, chunk, 0, c.b, 0, c.t, c.state)
		if err != nil {
			return err
		}
		chk.close(fmt.Sprintf("o(chunk %d)", chunk), out, wantO, kdaAtol, kdaRtol)
		chk.close(fmt.Sprintf("final_state(chunk %d)", chunk), final, wantS, kdaAtol, kdaRtol)
	}
	if hist != nil && c.cu == nil {
		// The state after every token: run each prefix [0, t] from the
		// initial state (token by token, and chunked at 16).
		n := c.h * c.dk * c.dv
		for t := 0; t < c.t; t += max(1, c.t/7) {
			for _, chunk := range []int{0, 16} {
				_, st, err := c.run(b, chunk, 0, c.b, 0, t+1, c.state)
				if err != nil {
					return err
				}
				want := make([]float32, 0, c.b*n)
				for bi := 0; bi < c.b; bi++ {
					want = append(want, hist[(bi*c.t+t)*n:(bi*c.t+t+1)*n]...)
				}
				chk.close(fmt.Sprintf("state_history[:, %d](chunk %d)", t, chunk), st, want, kdaAtol, kdaRtol)
			}
		}
	}
	return nil
}

// runKDADecode feeds one token per request per step, each step starting from
// the state the previous step left.
func runKDADecode(ctx context.Context, b compute.Backend, path string, chk *checker) error {
	f, err := openCase(path)
	if err != nil {
		return err
	}
	defer f.Close()
	c, err := loadKDACore(f)
	if err != nil {
		return err
	}
	wantO, _, err := f.f32("o", c.b, c.t, c.h, c.dv)
	if err != nil {
		return err
	}
	wantSteps, _, err := f.f32("state_after_step", c.b, c.t, c.h, c.dk, c.dv)
	if err != nil {
		return err
	}
	n := c.h * c.dk * c.dv
	state := c.state
	for s := 0; s < c.t; s++ {
		out, st, err := c.run(b, 0, 0, c.b, s, s+1, state)
		if err != nil {
			return err
		}
		wo := make([]float32, 0, len(out))
		ws := make([]float32, 0, len(st))
		for bi := 0; bi < c.b; bi++ {
			wo = append(wo, wantO[(bi*c.t+s)*c.h*c.dv:(bi*c.t+s+1)*c.h*c.dv]...)
			ws = append(ws, wantSteps[(bi*c.t+s)*n:(bi*c.t+s+1)*n]...)
		}
		chk.close(fmt.Sprintf("o[:, %d]", s), out, wo, kdaAtol, kdaRtol)
		chk.close(fmt.Sprintf("state_after_step[:, %d]", s), st, ws, kdaAtol, kdaRtol)
		state = st
	}
	return nil
}
