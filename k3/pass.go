package k3

import (
	"fmt"

	"k3/attnres"
	"k3/compute"
	"k3/internal/moe"
)

// pass holds the activations, the feed-forward runners and the AttnRes
// stream of a forward pass over up to max rows. Sessions and batches each
// own one; the token mixers (KDA, MLA/DSA), which carry per-sequence state,
// stay with them and plug in as a mixer.
type pass struct {
	m      *Model
	max    int
	moeL   []*moe.Layer
	mlpL   []*moe.MLPRunner
	stream *attnres.Stream

	ids                           compute.Tensor // [max] I32
	idsHost                       []int32        // the pass's token ids on the host
	x, h, normed, attnOut, mlpOut compute.Tensor // [max, D]
	fh                            compute.Tensor // [max, D]
	picked                        compute.Tensor // [max, D]: the final rows whose logits a pass wants
	logits                        compute.Tensor // [max, V]

	// split, when inside (0, rows), marks where a pass's exact rows end and
	// its prefill rows begin: products run on the two ranges apart, so the
	// exact rows stay in the row-count-invariant kernels whatever the
	// prefill rows number (compute.InvariantRows).
	split    int
	rangeBuf [][2]int

	vocab *vocab // a rank of a Group holding a slice of the vocabulary

	traced bool // the running pass fills a Trace (its reads keep graphs off)
	// inStep: the pass runs inside a whole step (Batch.stepGraph), which
	// holds the graphs' lock and has written the ids.
	inStep bool

	// taps, with a DSpark draft module, receive each pass's MLP-sublayer
	// inputs of its target layers ([max, D] each), which sessions keep.
	taps []compute.Tensor
}

// mixer runs layer l's token mixer on normed [T, D] into out [T, D].
type mixer func(l int, normed, out compute.Tensor) error

func newPass(m *Model, max int) (*pass, error) {
	cfg, b := m.Config, m.b
	p := &pass{m: m, max: max}
	var err error
	alloc := func(dt compute.DType, dims ...int) compute.Tensor {
		if err != nil {
			return compute.Tensor{}
		}
		var t compute.Tensor
		t, err = b.Alloc(dt, dims...)
		return t
	}
	d := cfg.HiddenSize
	p.ids = alloc(compute.I32, max)
	p.x, p.h, p.normed = alloc(compute.F32, max, d), alloc(compute.F32, max, d), alloc(compute.F32, max, d)
	p.attnOut, p.mlpOut, p.fh = alloc(compute.F32, max, d), alloc(compute.F32, max, d), alloc(compute.F32, max, d)
	p.picked = alloc(compute.F32, max, d)
	p.logits = alloc(compute.F32, max, cfg.VocabSize)
	if err != nil {
		return nil, err
	}
	// One set of intermediates per layer shape: layers run one after another.
	var firstMoE *moe.Layer
	var firstMLP *moe.MLPRunner
	for l, ly := range m.layers {
		var me *moe.Layer
		var mr *moe.MLPRunner
		switch {
		case ly.moe != nil && firstMoE != nil:
			me = firstMoE.Share(ly.moe)
		case ly.moe != nil:
			me, err = moe.NewLayer(b, ly.moe, ly.router, max)
			if err == nil && m.par != nil {
				err = me.SetSplit(m.par.moeSplit())
			}
			firstMoE = me
		case firstMLP != nil:
			mr = firstMLP.Share(ly.mlp)
		default:
			mr, err = moe.NewMLPRunner(b, ly.mlp, max)
			firstMLP = mr
		}
		if err != nil {
			return nil, fmt.Errorf("k3: layer %d: %w", l, err)
		}
		p.moeL, p.mlpL = append(p.moeL, me), append(p.mlpL, mr)
	}
	if dr := m.draft; dr != nil {
		for range dr.numTargetTaps {
			p.taps = append(p.taps, alloc(compute.F32, max, d))
		}
		if err != nil {
			return nil, err
		}
	}
	if m.par.vocabSplit() {
		if p.vocab, err = newVocab(m, max); err != nil {
			return nil, err
		}
	}
	if cfg.AttnResBlockSize > 0 {
		if p.stream, err = attnres.NewStream(b, m.resQueries, m.outQuery, 2*cfg.AttnResBlockSize, max, float32(cfg.RMSNormEps)); err != nil {
			return nil, err
		}
		if m.graphs != nil {
			p.stream.Capture = m.graphs.attnres(p)
		}
	}
	return p, nil
}

func (p *pass) readF32(t compute.Tensor) []float32 {
	v := make([]float32, t.Len())
	p.m.b.Read(v, t)
	return v
}

func (p *pass) readI32(t compute.Tensor) []int32 {
	v := make([]int32, t.Len())
	p.m.b.Read(v, t)
	return v
}

// run embeds tokens (one row each), runs every decoder layer — AttnRes or
// the plain residual, the pre-norms, the mixer and the feed-forward — then
// the final norm and lm_head into p.logits: every row with all, else rows
// picked[i] into row i. Picked rows go through lm_head in groups of at
// most compute.InvariantRows, so each gets the logits it would get alone
// however long the pass (a prefill chunk's last row among them). tr, when
// not nil, receives intermediates.
func (p *pass) run(tokens []int32, mix mixer, tr *Trace, all bool, picked []int32) error {
	m, b := p.m, p.m.b
	if m.graphs != nil && !p.inStep {
		// A capture would record the other passes' work too.
		m.graphs.mu.Lock()
		defer m.graphs.mu.Unlock()
	}
	cfg := m.Config
	t := len(tokens)
	eps := float32(cfg.RMSNormEps)
	p.traced = tr != nil
	ids := p.ids.Rows(0, t)
	x, h, normed := p.x.Rows(0, t), p.h.Rows(0, t), p.normed.Rows(0, t)
	attnOut, mlpOut := p.attnOut.Rows(0, t), p.mlpOut.Rows(0, t)
	if p.vocab != nil {
		p.idsHost = append(p.idsHost[:0], tokens...)
		if err := p.embedSplit(x, ids); err != nil {
			return err
		}
	} else {
		if !p.inStep { // a whole step's ids are written before it
			if err := p.writeIDs(tokens); err != nil {
				return err
			}
		}
		if err := b.Embedding(x, m.embed, ids); err != nil {
			return err
		}
	}
	useRes := p.stream != nil
	if useRes {
		if err := p.stream.Begin(x); err != nil {
			return err
		}
	}
	var prev compute.Tensor // the previous sublayer's output (AttnRes)
	for l, ly := range m.layers {
		// Attention sublayer.
		// With AttnRes the stream's update writes the pre-norm too, each
		// row normalised as it is merged.
		in := x
		if useRes {
			if err := p.stream.Next(prev, h, attnres.Norm{Out: normed, Weight: ly.attnNorm, Eps: eps}); err != nil {
				return fmt.Errorf("k3: layer %d attnres: %w", l, err)
			}
			in = h
			if tr != nil {
				tr.AttnInput = append(tr.AttnInput, p.readF32(in))
			}
		} else if err := b.RMSNorm(normed, in, ly.attnNorm, eps); err != nil {
			return err
		}
		if err := mix(l, normed, attnOut); err != nil {
			return fmt.Errorf("k3: layer %d attention: %w", l, err)
		}
		// A rank of a Group holds some of the heads: add the others'.
		if err := m.par.reduceTP(attnOut); err != nil {
			return fmt.Errorf("k3: layer %d attention sum: %w", l, err)
		}
		if tr != nil {
			tr.AttnOutput = append(tr.AttnOutput, p.readF32(attnOut))
		}
		// Feed-forward sublayer: one graph with its pre-norm where the
		// model replays graphs, else the pre-norm from the stream's update
		// (AttnRes) or RMSNorm.
		graphStep := m.graphs != nil && tr == nil && t <= graphMaxRows
		var preNorm attnres.Norm
		if !graphStep {
			preNorm = attnres.Norm{Out: normed, Weight: ly.mlpNorm, Eps: eps}
		}
		if useRes {
			if err := p.stream.Next(attnOut, h, preNorm); err != nil {
				return fmt.Errorf("k3: layer %d attnres: %w", l, err)
			}
			in = h
			if tr != nil {
				tr.MLPInput = append(tr.MLPInput, p.readF32(in))
			}
		} else if err := b.Binary(compute.Add, x, x, attnOut); err != nil {
			return err
		}
		if p.taps != nil {
			for _, slot := range m.draft.tapSlots[l] {
				if err := b.Copy(p.taps[slot].Rows(0, t), in); err != nil {
					return err
				}
			}
		}
		if graphStep {
			// The norm, the feed-forward and the residual add in one graph.
			if err := p.feedForwardStep(l, t, useRes); err != nil {
				return fmt.Errorf("k3: layer %d feed-forward: %w", l, err)
			}
			if useRes {
				prev = mlpOut
			}
			continue
		}
		if !useRes {
			if err := b.RMSNorm(normed, in, ly.mlpNorm, eps); err != nil {
				return err
			}
		}
		var err error
		for _, r := range p.ranges(t) {
			in, o := normed.Rows(r[0], r[1]), mlpOut.Rows(r[0], r[1])
			if m.graphs != nil && tr == nil && r[1]-r[0] <= graphMaxRows {
				// Rows padded to a bucket: the extra rows' outputs land in
				// rows that no one reads or that a later range rewrites, and
				// no row's result depends on the others'. (Graphs run only
				// without a parallel layout, so there is no sum to take.)
				n := graphBucket(r[1]-r[0], p.max-r[0])
				err = p.feedForwardGraph(l, p.normed.Rows(r[0], r[0]+n), p.mlpOut.Rows(r[0], r[0]+n))
			} else if me := p.moeL[l]; me != nil {
				if err = me.Forward(in, o, compute.Tensor{}, compute.Tensor{}); err == nil && tr != nil {
					idx, wts := me.Routing(t)
					tr.MoEIndices = append(tr.MoEIndices, p.readI32(idx))
					tr.MoEWeights = append(tr.MoEWeights, p.readF32(wts))
				}
			} else if err = p.mlpL[l].Forward(in, o); err == nil {
				err = m.par.reduceTP(o)
			}
			if err != nil {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("k3: layer %d feed-forward: %w", l, err)
		}
		if tr != nil {
			tr.MLPOutput = append(tr.MLPOutput, p.readF32(mlpOut))
		}
		if useRes {
			prev = mlpOut
			if tr != nil {
				part, _ := p.stream.Partial()
				after := p.readF32(part)
				for i, v := range p.readF32(mlpOut) {
					after[i] += v
				}
				tr.HiddenAfterLayer = append(tr.HiddenAfterLayer, after)
			}
		} else {
			if err := b.Binary(compute.Add, x, x, mlpOut); err != nil {
				return err
			}
			if tr != nil {
				tr.HiddenAfterLayer = append(tr.HiddenAfterLayer, p.readF32(x))
			}
		}
	}
	fh := p.fh.Rows(0, t)
	if useRes {
		if err := p.stream.Final(prev, h, attnres.Norm{Out: fh, Weight: m.norm, Eps: eps}); err != nil {
			return err
		}
	} else if err := b.RMSNorm(fh, x, m.norm, eps); err != nil {
		return err
	}
	if tr != nil {
		tr.FinalHidden = append(tr.FinalHidden, p.readF32(fh)...)
	}
	if !all {
		if len(picked) == 1 {
			return p.head(p.logits.Rows(0, 1), fh.Rows(int(picked[0]), int(picked[0])+1))
		}
		for i, r := range picked {
			if err := b.Copy(p.picked.Rows(i, i+1), fh.Rows(int(r), int(r)+1)); err != nil {
				return err
			}
		}
		for lo := 0; lo < len(picked); lo += compute.InvariantRows {
			hi := min(lo+compute.InvariantRows, len(picked))
			if err := p.head(p.logits.Rows(lo, hi), p.picked.Rows(lo, hi)); err != nil {
				return err
			}
		}
		return nil
	}
	for _, r := range p.ranges(t) {
		if err := p.head(p.logits.Rows(r[0], r[1]), fh.Rows(r[0], r[1])); err != nil {
			return err
		}
	}
	return nil
}

// writeIDs writes the pass's token ids into p.ids.
func (p *pass) writeIDs(tokens []int32) error {
	// Through a pass-owned slice, passed by pointer: boxing the caller's
	// slice in the interface would allocate on every step.
	p.idsHost = append(p.idsHost[:0], tokens...)
	return p.m.b.Write(p.ids.Rows(0, len(tokens)), &p.idsHost)
}

// feedForwardGraph runs layer l's feed-forward from in into out through
// the model's graphs. The closure is made only here: it escapes, and the
// Go backend's decode allocates nothing.
func (p *pass) feedForwardGraph(l int, in, out compute.Tensor) error {
	g := p.m.graphs
	g.begin()
	g.dep(in, out)
	return g.run(graphFeedForward, l, in.Dim(0), func() error { return p.feedForward(l, in, out) })
}

// feedForward runs layer l's MoE or MLP from in into out, alone: no
// trace, no sum over ranks.
func (p *pass) feedForward(l int, in, out compute.Tensor) error {
	if me := p.moeL[l]; me != nil {
		return me.Forward(in, out, compute.Tensor{}, compute.Tensor{})
	}
	return p.mlpL[l].Forward(in, out)
}

// feedForwardStep runs layer l's feed-forward sublayer of a pass of at
// most graphMaxRows rows through the model's graphs: the norm of its input
// (the AttnRes stream's h with useRes, else the residual x), the
// feed-forward into mlpOut and, without useRes, the residual add, over
// the rows padded to a bucket (the extra rows compute on whatever those
// rows hold and land where no one reads: no row's result depends on the
// others', and graphs run only without a parallel layout, so there is no
// sum to take).
func (p *pass) feedForwardStep(l, t int, useRes bool) error {
	m, b := p.m, p.m.b
	n := graphBucket(t, p.max)
	in := p.x.Rows(0, n)
	if useRes {
		in = p.h.Rows(0, n)
	}
	normed, out, x := p.normed.Rows(0, n), p.mlpOut.Rows(0, n), p.x.Rows(0, n)
	norm, eps := m.layers[l].mlpNorm, float32(m.Config.RMSNormEps)
	g := m.graphs
	g.begin()
	g.dep(in, normed, out, x)
	if !useRes {
		g.num(1)
	}
	return g.run(graphFeedForward, l, n, func() error {
		if err := b.RMSNorm(normed, in, norm, eps); err != nil {
			return err
		}
		if err := p.feedForward(l, normed, out); err != nil || useRes {
			return err
		}
		return b.Binary(compute.Add, x, x, out)
	})
}

// ranges returns the row ranges a pass of t rows runs its products on:
// the whole pass, or the exact rows and the prefill rows apart. A pass of
// at most compute.InvariantRows rows stays whole: every row of such a
// product gets its result alone, so the two kinds share one read of the
// weights.
func (p *pass) ranges(t int) [][2]int {
	p.rangeBuf = p.rangeBuf[:0]
	if p.split > 0 && p.split < t && t > compute.InvariantRows {
		p.rangeBuf = append(p.rangeBuf, [2]int{0, p.split}, [2]int{p.split, t})
	} else {
		p.rangeBuf = append(p.rangeBuf, [2]int{0, t})
	}
	return p.rangeBuf
}
