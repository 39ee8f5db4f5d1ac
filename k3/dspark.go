package k3

import (
	"fmt"
	"math"
	"sync"

	"k3/compute"
	"k3/config"
	"k3/internal/kernel"
	"k3/internal/weights"
)

// dsparkWeights are a checkpoint's DSpark draft module (docs/ARCHITECTURE.md,
// "The draft module"): from the target's hidden states at the anchor, the
// MLP-sublayer inputs of cfg.TargetLayers, and the embedding of the token
// after it, one pass gives a block of cfg.BlockSize draft positions.
type dsparkWeights struct {
	cfg           *config.DraftConfig
	fc            compute.Tensor // [D, n·D]
	fcNorm, norm  compute.Tensor // [D]
	pos           []float32      // [K, D], host: added to the block's rows
	layers        []dsparkLayer
	markovIn      []float32 // [V, r], host: a row per token
	markovOut     compute.Tensor
	confW         []float32 // [D + r]
	confB         float32
	tapSlots      [][]int // per layer: its slots among the target layers (a layer may be listed twice)
	eps           float32
	hidden, rank  int
	vocab, block  int
	intermediate  int
	numTargetTaps int
}

type dsparkLayer struct {
	norm, gate, up, down compute.Tensor
}

func loadDSpark(m *Model, src *source, d *config.DraftConfig) (*dsparkWeights, error) {
	cfg := m.Config
	dm, v, r, k := cfg.HiddenSize, cfg.VocabSize, d.MarkovRank, d.BlockSize
	ld := &weights.Loader{B: m.b, Src: src.prefixed(d.TensorPrefix), Prefix: src.strip + d.TensorPrefix}
	w := &dsparkWeights{cfg: d, eps: float32(cfg.RMSNormEps), hidden: dm, rank: r, vocab: v, block: k,
		intermediate: d.IntermediateSize, numTargetTaps: len(d.TargetLayers)}
	w.fc = ld.Linear("fc.weight", dm, len(d.TargetLayers)*dm)
	w.fcNorm = ld.F32("fc_norm.weight", dm)
	w.norm = ld.F32("norm.weight", dm)
	w.pos = ld.Host("pos_embed", k, dm)
	for i := range d.NumLayers {
		p := fmt.Sprintf("layers.%d.", i)
		w.layers = append(w.layers, dsparkLayer{
			norm: ld.F32(p+"norm.weight", dm),
			gate: ld.Linear(p+"gate_proj.weight", d.IntermediateSize, dm),
			up:   ld.Linear(p+"up_proj.weight", d.IntermediateSize, dm),
			down: ld.Linear(p+"down_proj.weight", dm, d.IntermediateSize),
		})
	}
	w.markovIn = ld.Host("markov_in.weight", v, r)
	w.markovOut = ld.Linear("markov_out.weight", v, r)
	w.confW = ld.Host("confidence.weight", 1, dm+r)
	b := ld.Host("confidence.bias", 1)
	if ld.Err != nil {
		return nil, ld.Err
	}
	w.confB = b[0]
	w.tapSlots = make([][]int, len(cfg.Layers))
	for i, l := range d.TargetLayers {
		w.tapSlots[l] = append(w.tapSlots[l], i)
	}
	return w, nil
}

// DSpark is the DSpark drafter: the checkpoint's own draft module, which
// reads the target's hidden states at the anchor (the sequence's last
// position, whose logits gave the token just drawn) from the pass that
// computed it, and proposes a whole block in one pass of its small
// network plus a Markov term per position (docs/ARCHITECTURE.md). Its
// drafts are greedy, so the coupled rule keeps the output exact. One
// DSpark follows one generation at a time: a generation that uses it binds
// it to its session. Confidences reports the last block's per-position
// confidences.
type DSpark struct {
	mu     sync.Mutex
	m      *Model
	w      *dsparkWeights
	s      *Session
	conf   []float32
	closed bool

	in, c, e, f, h, g, u, o compute.Tensor
	fn, logits, mrow, brow  compute.Tensor
	ids                     compute.Tensor
	host, fHost, row, bHost []float32
	idHost                  []int32   // one id
	view                    []float32 // the subslice handed to the backend, by pointer so that nothing allocates
}

// NewDSpark returns a DSpark drafter for m's sequences; the checkpoint
// must carry a draft module (config.json's dspark_config).
func (m *Model) NewDSpark() (*DSpark, error) {
	if err := m.life.enter(); err != nil {
		return nil, err
	}
	defer m.life.exit()
	if m.draft == nil {
		return nil, fmt.Errorf("%w: the checkpoint has no DSpark draft module (dspark_config)", ErrInvalidOption)
	}
	w, b := m.draft, m.b
	d, k := w.hidden, w.block
	ds := &DSpark{m: m, w: w}
	var err error
	alloc := func(dims ...int) compute.Tensor {
		if err != nil {
			return compute.Tensor{}
		}
		var t compute.Tensor
		t, err = b.Alloc(compute.F32, dims...)
		return t
	}
	ds.in, ds.c, ds.e = alloc(1, w.numTargetTaps*d), alloc(1, d), alloc(1, d)
	ds.f, ds.h, ds.o, ds.fn = alloc(k, d), alloc(k, d), alloc(k, d), alloc(k, d)
	ds.g, ds.u = alloc(k, w.intermediate), alloc(k, w.intermediate)
	ds.logits, ds.mrow, ds.brow = alloc(k, w.vocab), alloc(1, w.rank), alloc(1, w.vocab)
	if err == nil {
		ds.ids, err = b.Alloc(compute.I32, 1)
	}
	if err != nil {
		return nil, err
	}
	ds.host = make([]float32, w.numTargetTaps*d)
	ds.fHost = make([]float32, k*d)
	ds.row = make([]float32, k*w.vocab)
	ds.bHost = make([]float32, w.vocab)
	ds.idHost = make([]int32, 1)
	return ds, nil
}

// Close returns the drafter's scratch to the backend; it drafts nothing
// afterwards.
func (ds *DSpark) Close() error {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	for _, t := range []*compute.Tensor{&ds.in, &ds.c, &ds.e, &ds.f, &ds.h, &ds.g, &ds.u, &ds.o, &ds.fn, &ds.logits, &ds.mrow, &ds.brow, &ds.ids} {
		if !t.IsZero() {
			ds.m.b.Free(*t)
			*t = compute.Tensor{}
		}
	}
	ds.s, ds.closed = nil, true
	return nil
}

// readsSession reports that the drafts come from the state of the
// session bound to the drafter (its rows), not from the history alone.
func (ds *DSpark) readsSession() bool { return true }

// bind makes the drafter follow s (the generation that uses it).
func (ds *DSpark) bind(s *Session) {
	ds.mu.Lock()
	if !ds.closed {
		ds.s = s
	}
	ds.mu.Unlock()
}

// Confidences returns the per-position confidences of the last block
// drafted (the draft module's estimate that each draft matches the
// target's greedy token).
func (ds *DSpark) Confidences() []float32 {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return append([]float32(nil), ds.conf...)
}

// blockConfidences is Confidences without the copy, for the adaptive
// depth (under the generation's own use of the drafter).
func (ds *DSpark) blockConfidences() []float32 { return ds.conf }

// Draft proposes up to n tokens (at most the module's block size) after
// history, whose last token is the one just drawn after the bound
// session's last position. Without a bound session, or when the session
// no longer holds the anchor's hidden states, it proposes none.
func (ds *DSpark) Draft(history []int32, n int, dst []int32) []int32 {
	return ds.SampleDraft(history, n, dst, greedy)
}

// SampleDraft is Draft with each token chosen by pick from the block's
// logits for its position (specdec.Sampler): the Markov head conditions
// the next position on the token picked.
func (ds *DSpark) SampleDraft(history []int32, n int, dst []int32, pick func([]float32) int32) []int32 {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	s := ds.s
	w := ds.w
	n = min(n, w.block)
	if s == nil || n <= 0 || len(history) == 0 || len(history) != s.pos+1 {
		return dst
	}
	at := s.pos - 1 - s.tapsPos // the anchor's row in the session's last pass
	if at < 0 || at >= s.tapsRows {
		return dst
	}
	if err := ds.block(s, at, history[len(history)-1], n); err != nil {
		return dst
	}
	ds.conf = ds.conf[:0]
	prev := history[len(history)-1]
	d, r, v := w.hidden, w.rank, w.vocab
	b := ds.m.b
	for k := range n {
		// q_k = U_k + markov_out(markov_in[x_{t+k}]), and the confidence
		// from [f_k; markov_in[x_{t+k}]].
		min := w.markovIn[int(prev)*r : (int(prev)+1)*r]
		ds.view = min
		if err := b.Write(ds.mrow, &ds.view); err != nil {
			return dst
		}
		if err := b.MatMul(ds.brow, ds.mrow, w.markovOut); err != nil {
			return dst
		}
		if err := b.Read(&ds.bHost, ds.brow); err != nil {
			return dst
		}
		q := ds.row[k*v : (k+1)*v]
		for i := range q {
			q[i] += ds.bHost[i]
		}
		if prev = pick(q); prev < 0 || int(prev) >= v {
			break
		}
		z := w.confB + kernel.Dot(w.confW[:d], ds.fHost[k*d:(k+1)*d]) + kernel.Dot(w.confW[d:], min)
		ds.conf = append(ds.conf, float32(1/(1+math.Exp(-float64(z)))))
		dst = append(dst, prev)
	}
	return dst
}

// block runs the module's pass for the anchor at row at of s's taps and
// x_{t+1} = next, leaving the first n positions' U_k in ds.row and their
// features f_k in ds.fHost.
func (ds *DSpark) block(s *Session, at int, next int32, n int) error {
	w, m, b := ds.w, ds.m, ds.m.b
	d := w.hidden
	for i, tp := range s.taps {
		if len(tp) < (at+1)*d {
			return fmt.Errorf("k3: dspark: no hidden states for row %d", at)
		}
		copy(ds.host[i*d:(i+1)*d], tp[at*d:(at+1)*d])
	}
	if err := b.Write(ds.in, &ds.host); err != nil {
		return err
	}
	// c = RMSNorm(fc [h^l...]) + E[x_{t+1}]
	if err := b.MatMul(ds.c, ds.in, w.fc); err != nil {
		return err
	}
	if err := b.RMSNorm(ds.c, ds.c, w.fcNorm, w.eps); err != nil {
		return err
	}
	ds.idHost[0] = next
	if err := b.Write(ds.ids, &ds.idHost); err != nil {
		return err
	}
	if err := b.Embedding(ds.e, m.embed, ds.ids); err != nil {
		return err
	}
	if err := b.Binary(compute.Add, ds.c, ds.c, ds.e); err != nil {
		return err
	}
	// f_k = layers(c + pos_embed[k]) for the block's first n positions.
	ds.view = ds.fHost[:d]
	if err := b.Read(&ds.view, ds.c); err != nil {
		return err
	}
	for k := n - 1; k >= 0; k-- {
		for j := range d {
			ds.fHost[k*d+j] = ds.fHost[j] + w.pos[k*d+j]
		}
	}
	f, h, g, u, o := ds.f.Rows(0, n), ds.h.Rows(0, n), ds.g.Rows(0, n), ds.u.Rows(0, n), ds.o.Rows(0, n)
	ds.view = ds.fHost[:n*d]
	if err := b.Write(f, &ds.view); err != nil {
		return err
	}
	for _, ly := range w.layers {
		if err := b.RMSNorm(h, f, ly.norm, w.eps); err != nil {
			return err
		}
		if err := b.MatMul(g, h, ly.gate); err != nil {
			return err
		}
		if err := b.MatMul(u, h, ly.up); err != nil {
			return err
		}
		if err := b.GatedAct(m.act, g, g, u); err != nil {
			return err
		}
		if err := b.MatMul(o, g, ly.down); err != nil {
			return err
		}
		if err := b.Binary(compute.Add, f, f, o); err != nil {
			return err
		}
	}
	ds.view = ds.fHost[:n*d]
	if err := b.Read(&ds.view, f); err != nil {
		return err
	}
	// U_k = lm_head(RMSNorm(f_k)), the target's own head.
	fn := ds.fn.Rows(0, n)
	if err := b.RMSNorm(fn, f, w.norm, w.eps); err != nil {
		return err
	}
	lg := ds.logits.Rows(0, n)
	if err := b.MatMul(lg, fn, m.lmHead); err != nil {
		return err
	}
	ds.view = ds.row[:n*w.vocab]
	return b.Read(&ds.view, lg)
}
