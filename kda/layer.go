package kda

import (
	"errors"
	"fmt"
	"math"

	"k3/compute"
	"k3/internal/weights"
)

// Config describes a KDA layer.
type Config struct {
	Hidden     int
	NumHeads   int
	HeadDim    int // key and value head size
	ConvKernel int
	// FullRankGate selects K3's g_proj output gate; otherwise Kimi Linear's
	// low-rank g_a_proj/g_b_proj.
	FullRankGate bool
	// LowerBound, when negative, selects K3's bounded decay gate
	// lb·sigmoid(exp(A_log)·x); zero selects Kimi Linear's softplus gate.
	LowerBound float32
	Eps        float32 // output RMSNorm epsilon (rms_norm_eps)
	// ChunkSize of the chunked prefill (16 or 64; 0 runs token by token).
	ChunkSize int
}

func (c Config) validate() error {
	switch {
	case c.Hidden <= 0:
		return fmt.Errorf("kda: hidden size %d", c.Hidden)
	case c.NumHeads <= 0 || c.HeadDim <= 0:
		return fmt.Errorf("kda: %d heads of %d", c.NumHeads, c.HeadDim)
	case c.ConvKernel <= 0:
		return fmt.Errorf("kda: short_conv_kernel_size %d must be positive", c.ConvKernel)
	case c.LowerBound > 0:
		return fmt.Errorf("kda: gate lower bound %g must be negative", c.LowerBound)
	case c.ChunkSize < 0:
		return fmt.Errorf("kda: chunk size %d", c.ChunkSize)
	}
	return nil
}

// Source serves a layer's tensors by their checkpoint names relative to
// the layer's attention prefix ("q_proj.weight", "A_log", ...).
type Source = compute.Source

// CopiedTensors names the tensors LoadWeights only copies (stacking the
// q|k|v projections and their conv taps): their stored bytes are not read
// again once it returns, so a loader may release them.
var CopiedTensors = [...]string{"q_proj.weight", "k_proj.weight", "v_proj.weight",
	"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"}

// LoadWeights builds a layer's weights on b from src, checking every shape
// against cfg; errors name the tensor and both shapes. Matrices keep their
// stored dtype (F32 or BF16); the small per-channel tensors become F32.
func LoadWeights(b compute.Backend, cfg Config, src Source) (*compute.KDAWeights, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	h, d, hid, w := cfg.NumHeads, cfg.HeadDim, cfg.Hidden, cfg.ConvKernel
	hd := h * d
	ld := &weights.Loader{B: b, Src: src}
	kw := &compute.KDAWeights{NumHeads: h, HeadDim: d, Eps: cfg.Eps, LowerBound: cfg.LowerBound, Gate: compute.GateSoftplus}
	if cfg.LowerBound < 0 {
		kw.Gate = compute.GateLowerBound
	}
	q := ld.Matrix("q_proj.weight", hd, hid)
	k := ld.Matrix("k_proj.weight", hd, hid)
	v := ld.Matrix("v_proj.weight", hd, hid)
	qc := ld.F32("q_conv1d.weight", hd, w)
	kc := ld.F32("k_conv1d.weight", hd, w)
	vc := ld.F32("v_conv1d.weight", hd, w)
	kw.FA = ld.Linear("f_a_proj.weight", d, hid)
	kw.FB = ld.Linear("f_b_proj.weight", hd, d)
	kw.B = ld.Linear("b_proj.weight", h, hid)
	if cfg.FullRankGate {
		kw.G = ld.Linear("g_proj.weight", hd, hid)
	} else {
		kw.GA = ld.Linear("g_a_proj.weight", d, hid)
		kw.GB = ld.Linear("g_b_proj.weight", hd, d)
	}
	kw.ONorm = ld.F32("o_norm.weight", d)
	kw.OProj = ld.Linear("o_proj.weight", hid, hd)
	kw.DTBias = ld.F32("dt_bias", hd)
	if ld.Err != nil {
		return nil, fmt.Errorf("kda: %w", ld.Err)
	}
	// A_log is stored [H], padded (K3 keeps 128 values for 96 heads), or
	// [1,1,H,1] (Kimi Linear): flatten and keep the first H.
	dt, shape, data, err := src("A_log")
	if err != nil {
		return nil, fmt.Errorf("kda: %w", err)
	}
	n := 1
	for _, s := range shape {
		n *= s
	}
	if n < h || dt.Size() == 0 {
		return nil, fmt.Errorf("kda: tensor A_log has shape %v, need at least %d values", shape, h)
	}
	if kw.ALog, err = b.FromHost(compute.F32, dt, data[:h*dt.Size()], h); err != nil {
		return nil, fmt.Errorf("kda: tensor A_log: %w", err)
	}
	// Stack q|k|v projections and conv taps (one product and one conv).
	if kw.QKV, err = b.Alloc(q.DType, 3*hd, hid); err != nil {
		return nil, err
	}
	if kw.Conv, err = b.Alloc(compute.F32, 3*hd, w); err != nil {
		return nil, err
	}
	for i, part := range []compute.Tensor{q, k, v} {
		if part.DType != q.DType {
			return nil, fmt.Errorf("kda: q/k/v projections have different dtypes %v, %v", q.DType, part.DType)
		}
		if err := b.Copy(kw.QKV.Rows(i*hd, (i+1)*hd), part); err != nil {
			return nil, err
		}
	}
	for i, part := range []compute.Tensor{qc, kc, vc} {
		if err := b.Copy(kw.Conv.Rows(i*hd, (i+1)*hd), part); err != nil {
			return nil, err
		}
	}
	for _, t := range []compute.Tensor{q, k, v, qc, kc, vc} {
		b.Free(t)
	}
	if kw.QKV, err = compute.PrepareMatMul(b, kw.QKV); err != nil {
		return nil, fmt.Errorf("kda: stacked q|k|v projection: %w", err)
	}
	return kw, nil
}

// State is the per-sequence state of one KDA layer for N sequences: the
// conv cache [N, W-1, 3·H·D] (raw q|k|v projections of the last W-1 tokens)
// and the recurrent state [N, H, D, D], V-first: element [v][k] is S[k][v]
// of the equations (o = Sᵀq). The conformance files store it K-first;
// TransposeState converts.
type State struct {
	Conv, S compute.Tensor
}

// Free returns the state's tensors to b.
func (st *State) Free(b compute.Backend) {
	b.Free(st.Conv)
	b.Free(st.S)
	st.Conv, st.S = compute.Tensor{}, compute.Tensor{}
}

// Seq returns a view of sequence i of a state of several: it shares the
// memory (Free the whole state, not the view).
func (st *State) Seq(i int) *State {
	return &State{Conv: st.Conv.Rows(i, i+1), S: st.S.Rows(i, i+1)}
}

// StateBytes is the memory of one sequence's State: its conv window and
// its recurrent state, in float32.
func (c Config) StateBytes() int64 {
	return 4 * int64((c.ConvKernel-1)*3*c.NumHeads*c.HeadDim+c.NumHeads*c.HeadDim*c.HeadDim)
}

// NewState allocates zeroed state for n sequences.
func NewState(b compute.Backend, cfg Config, n int) (*State, error) {
	conv, err := b.Alloc(compute.F32, n, cfg.ConvKernel-1, 3*cfg.NumHeads*cfg.HeadDim)
	if err != nil {
		return nil, err
	}
	s, err := b.Alloc(compute.F32, n, cfg.NumHeads, cfg.HeadDim, cfg.HeadDim)
	if err != nil {
		return nil, err
	}
	return &State{Conv: conv, S: s}, nil
}

// Layer runs one KDA layer with preallocated intermediates for up to maxT
// tokens per call.
type Layer struct {
	cfg  Config
	W    *compute.KDAWeights
	b    compute.Backend
	maxT int

	*scratch
	convArgs      compute.ConvArgs
	chunkArgs     compute.KDAArgs
	composes      bool // the backend refused the fused step
	stepArgs      compute.KDAStepArgs
	convs, states []compute.Tensor
}

// scratch holds a layer's intermediates; layers of one shape that run one
// after another (the layers of one session) share one.
type scratch struct {
	raw, conv, fa, graw, beta, gate, ga, core compute.Tensor
}

// Composes reports whether the layer's decode steps have taken the
// composition of smaller operations (the backend refused the fused
// step): then the exact rows read their states through Seqs.Pool and
// Slots when given.
func (l *Layer) Composes() bool { return l.composes }

// Share returns a layer with weights w that uses l's intermediates (w must
// have l's shape). The layers of one session run one after another, so
// one set of buffers serves them all.
func (l *Layer) Share(w *compute.KDAWeights) *Layer {
	c := *l
	c.W, c.convs, c.states = w, nil, nil
	return &c
}

// NewLayer prepares a layer for calls of up to maxT tokens.
func NewLayer(b compute.Backend, cfg Config, w *compute.KDAWeights, maxT int) (*Layer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	hd := cfg.NumHeads * cfg.HeadDim
	l := &Layer{cfg: cfg, W: w, b: b, maxT: maxT, scratch: &scratch{}}
	var err error
	alloc := func(dims ...int) compute.Tensor {
		if err != nil {
			return compute.Tensor{}
		}
		var t compute.Tensor
		t, err = b.Alloc(compute.F32, dims...)
		return t
	}
	l.raw, l.conv = alloc(maxT, 3*hd), alloc(maxT, 3*hd)
	l.fa, l.graw = alloc(maxT, cfg.HeadDim), alloc(maxT, hd)
	l.beta, l.gate = alloc(maxT, cfg.NumHeads), alloc(maxT, hd)
	l.core = alloc(maxT, hd)
	if !cfg.FullRankGate {
		l.ga = alloc(maxT, cfg.HeadDim)
	}
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Seqs describes the sequences whose new tokens a Forward call packs:
// sequence s owns rows Cu[s] to Cu[s+1]-1 of x (at least one) and
// continues States[s], a single-sequence state.
//
// The first Exact sequences are exact runs: their rows go through the
// fused decode step, each sequence's tokens one after another with the
// single-token arithmetic, so their outputs and states are bitwise those
// of as many single-token calls, alone or beside any other rows (as long
// as the exact rows number at most compute.InvariantRows). The remaining
// sequences are prefill chunks: chunked KDA, within the conformance
// tolerance of the exact arithmetic and faster for long runs.
type Seqs struct {
	Cu     []int32
	States []*State
	Exact  int
	// Records, when not the zero Tensor, receives each exact row's replay
	// record ([rows of the exact sequences, RecordLen]); chunks have none.
	Records compute.Tensor
	// Pool, when set, is a pool of states ([P, ...] each) whose rows the
	// exact sequences' States are: sequence s is row Slots[s] (Slots I32,
	// at least Exact long, written by the caller). A backend without the
	// fused step then runs the exact rows' composition in one call over
	// the pool, the rows selected on the device (CausalConv's and
	// KDAChunk's StateIdx), so that the calls name the pool and the slots
	// tensor, not the sequences.
	Pool  *State
	Slots compute.Tensor
}

// Forward runs the layer over x [R, hidden], the packed new tokens of the
// sequences s describes, advances their states and writes y [R, hidden].
// A call of at most compute.InvariantRows rows reads each weight once for
// both kinds (mixed); a longer one reads it once for the exact rows and
// once for the chunk rows, whatever the number of sequences, because a
// product over both would give the exact rows another summation order
// once the chunk rows make it long.
func (l *Layer) Forward(x compute.Tensor, s *Seqs, y compute.Tensor) error {
	n := len(s.States)
	t := x.Dim(0)
	switch {
	case len(s.Cu) != n+1 || s.Cu[0] != 0 || int(s.Cu[n]) != t:
		return fmt.Errorf("kda: %d rows with row offsets %v for %d sequences", t, s.Cu, n)
	case s.Exact < 0 || s.Exact > n:
		return fmt.Errorf("kda: %d exact sequences of %d", s.Exact, n)
	case t-int(s.Cu[s.Exact]) > l.maxT: // the fused step needs no scratch
		return fmt.Errorf("kda: %d prefill tokens, layer sized for %d", t-int(s.Cu[s.Exact]), l.maxT)
	}
	for i, st := range s.States {
		if s.Cu[i+1] <= s.Cu[i] {
			return fmt.Errorf("kda: sequence %d has no rows (offsets %v)", i, s.Cu)
		}
		if st == nil || st.S.Rank != 4 || st.S.Dims[0] != 1 || st.Conv.Rank != 3 || st.Conv.Dims[0] != 1 {
			return fmt.Errorf("kda: sequence %d: want a single-sequence state", i)
		}
	}
	e := int(s.Cu[s.Exact])
	if s.Exact > 0 && e < t && !l.composes && s.Pool == nil && t <= compute.InvariantRows && t <= l.maxT {
		return l.mixed(x, s, e, y)
	}
	if s.Exact > 0 {
		var pool pooled
		if s.Pool != nil {
			if s.Slots.Rank != 1 || s.Slots.Len() < s.Exact {
				return fmt.Errorf("kda: %d slots for %d exact sequences", s.Slots.Len(), s.Exact)
			}
			pool = pooled{s.Pool, s.Slots.Rows(0, s.Exact)}
		}
		if err := l.step(x.Rows(0, e), s.States[:s.Exact], pool, s.Cu[:s.Exact+1], s.Records, y.Rows(0, e)); err != nil {
			return err
		}
	}
	if e < t {
		return l.chunks(x.Rows(e, t), s.States[s.Exact:], s.Cu[s.Exact:], y.Rows(e, t))
	}
	return nil
}

// pooled is a pool of states and the rows of it that a call's sequences
// are; the zero pooled is none.
type pooled struct {
	states *State
	slots  compute.Tensor
}

// mixed runs a pass of exact rows and prefill chunks of at most
// compute.InvariantRows rows in all with one product per weight for both
// kinds: the products give every row what they give it alone, so the
// exact rows keep their arithmetic, and the chunk's rows no longer read
// each weight a second time. The fused step takes the exact rows'
// projections and returns their core; the chunk's core runs as in
// chunks; o_proj takes all rows.
func (l *Layer) mixed(x compute.Tensor, s *Seqs, e int, y compute.Tensor) error {
	t := x.Dim(0)
	if err := l.project(x, t); err != nil {
		return err
	}
	raw, graw, beta, gate, core := l.raw.Rows(0, t), l.graw.Rows(0, t), l.beta.Rows(0, t), l.gate.Rows(0, t), l.core.Rows(0, t)
	l.setStep(x.Rows(0, e), s.States[:s.Exact], s.Cu[:s.Exact+1], s.Records, compute.Tensor{})
	a := &l.stepArgs
	a.QKVIn, a.GIn, a.BetaIn, a.GateIn, a.Core = raw.Rows(0, e), graw.Rows(0, e), beta.Rows(0, e), gate.Rows(0, e), core.Rows(0, e)
	err := l.b.KDAStep(a)
	if errors.Is(err, compute.ErrUnsupported) {
		// Without the fused step the exact rows take the composition,
		// through the split path.
		if err := l.step(x.Rows(0, e), s.States[:s.Exact], pooled{}, s.Cu[:s.Exact+1], s.Records, y.Rows(0, e)); err != nil {
			return err
		}
		return l.chunks(x.Rows(e, t), s.States[s.Exact:], s.Cu[s.Exact:], y.Rows(e, t))
	}
	if err != nil {
		return fmt.Errorf("kda: decode step: %w", err)
	}
	if err := l.coreRows(e, t, s.States[s.Exact:], pooled{}, s.Cu[s.Exact:], l.cfg.ChunkSize, compute.Tensor{}); err != nil {
		return err
	}
	if err := l.b.MatMul(y, core, l.W.OProj); err != nil {
		return fmt.Errorf("kda: o_proj: %w", err)
	}
	return nil
}

// setStep fills the fused step's arguments for the exact rows x.
func (l *Layer) setStep(x compute.Tensor, states []*State, cu []int32, records, y compute.Tensor) {
	l.convs, l.states = l.convs[:0], l.states[:0]
	for _, st := range states {
		l.convs = append(l.convs, st.Conv.Reshape(st.Conv.Dims[1], st.Conv.Dims[2]))
		l.states = append(l.states, st.S.Reshape(st.S.Dims[1], st.S.Dims[2], st.S.Dims[3]))
	}
	l.stepArgs = compute.KDAStepArgs{W: l.W, X: x, Y: y, Convs: l.convs, States: l.states, Records: records, CuSeqlens: cu}
}

// step runs the fused decode step over the exact rows.
func (l *Layer) step(x compute.Tensor, states []*State, pool pooled, cu []int32, records, y compute.Tensor) error {
	l.setStep(x, states, cu, records, y)
	err := l.b.KDAStep(&l.stepArgs)
	if errors.Is(err, compute.ErrUnsupported) && x.Dim(0) <= l.maxT {
		l.composes = true
		// A backend without the fused step gets the same layer from the
		// smaller operations: the chunked path with the recurrence run
		// token by token (equal within rounding, not bitwise), which
		// writes the replay records too.
		return l.chunksWith(x, states, pool, cu, y, 0, records)
	}
	if err != nil {
		return fmt.Errorf("kda: decode step: %w", err)
	}
	return nil
}

// chunks runs the chunked form over prefill rows x [T, hidden]: every
// projection over all rows at once, the short conv and the recurrence per
// sequence (rows cu[i]-cu[0] to cu[i+1]-cu[0]-1, continuing states[i]).
func (l *Layer) chunks(x compute.Tensor, states []*State, cu []int32, y compute.Tensor) error {
	return l.chunksWith(x, states, pooled{}, cu, y, l.cfg.ChunkSize, compute.Tensor{})
}

// chunksWith is chunks with the given chunk size (0: token by token); with
// a pool (cu[0] = 0), the short conv and the recurrence run once over all
// sequences, their states the pool's rows. Records, when set, receives
// the rows' replay records (token by token only).
func (l *Layer) chunksWith(x compute.Tensor, states []*State, pool pooled, cu []int32, y compute.Tensor, chunkSize int, records compute.Tensor) error {
	t := x.Dim(0)
	if err := l.project(x, t); err != nil {
		return err
	}
	if err := l.coreRows(0, t, states, pool, cu, chunkSize, records); err != nil {
		return err
	}
	if err := l.b.MatMul(y, l.core.Rows(0, t), l.W.OProj); err != nil {
		return fmt.Errorf("kda: o_proj: %w", err)
	}
	return nil
}

// project writes the projections of x [t, hidden] to the first t rows of
// the layer's raw, fa, graw, beta and gate.
func (l *Layer) project(x compute.Tensor, t int) error {
	b := l.b
	if err := b.MatMul(l.raw.Rows(0, t), x, l.W.QKV); err != nil {
		return fmt.Errorf("kda: q/k/v projection: %w", err)
	}
	fa, graw := l.fa.Rows(0, t), l.graw.Rows(0, t)
	if err := b.MatMul(fa, x, l.W.FA); err != nil {
		return fmt.Errorf("kda: f_a_proj: %w", err)
	}
	if err := b.MatMul(graw, fa, l.W.FB); err != nil {
		return fmt.Errorf("kda: f_b_proj: %w", err)
	}
	if err := b.MatMul(l.beta.Rows(0, t), x, l.W.B); err != nil {
		return fmt.Errorf("kda: b_proj: %w", err)
	}
	return l.outputGate(x, l.gate.Rows(0, t), t)
}

// coreRows runs the short conv, the recurrence (chunked, or token by
// token for chunkSize 0), the norm and the output gate over rows [r0, r1)
// of the layer's projections into the same rows of its core; the rows are
// the sequences cu describes (offsets from cu[0]), continuing states (or,
// with a pool, its rows).
func (l *Layer) coreRows(r0, r1 int, states []*State, pool pooled, cu []int32, chunkSize int, records compute.Tensor) error {
	t := r1 - r0
	h, d := l.cfg.NumHeads, l.cfg.HeadDim
	raw, conv := l.raw.Rows(r0, r1), l.conv.Rows(r0, r1)
	graw, beta, gate := l.graw.Rows(r0, r1), l.beta.Rows(r0, r1), l.gate.Rows(r0, r1)
	b := l.b
	core := l.core.Rows(r0, r1)
	scale := float32(1 / math.Sqrt(float64(d)))
	if pool.states != nil {
		l.convArgs = compute.ConvArgs{X: raw, Weight: l.W.Conv, State: pool.states.Conv, StateIdx: pool.slots, Out: conv, CuSeqlens: cu}
		if err := b.CausalConv(&l.convArgs); err != nil {
			return fmt.Errorf("kda: short conv: %w", err)
		}
		l.chunkArgs = compute.KDAArgs{
			QKV: conv, G: graw.Reshape(t, h, d), Beta: beta,
			ALog: l.W.ALog, DTBias: l.W.DTBias, Gate: l.W.Gate, LowerBound: l.W.LowerBound,
			Preprocess: true, Scale: scale, CuSeqlens: cu,
			State: pool.states.S, StateIdx: pool.slots, Out: core.Reshape(t, h, d), ChunkSize: chunkSize,
		}
		if !records.IsZero() {
			l.chunkArgs.Records, l.chunkArgs.Raw = records, raw
		}
		if err := b.KDAChunk(&l.chunkArgs); err != nil {
			return fmt.Errorf("kda: core: %w", err)
		}
		states = nil
	}
	for i, st := range states {
		s0, s1 := int(cu[i]-cu[0]), int(cu[i+1]-cu[0])
		l.convArgs = compute.ConvArgs{X: raw.Rows(s0, s1), Weight: l.W.Conv, State: st.Conv, Out: conv.Rows(s0, s1)}
		if err := b.CausalConv(&l.convArgs); err != nil {
			return fmt.Errorf("kda: short conv: %w", err)
		}
		n := s1 - s0
		l.chunkArgs = compute.KDAArgs{
			QKV: conv.Rows(s0, s1), G: graw.Rows(s0, s1).Reshape(n, h, d), Beta: beta.Rows(s0, s1),
			ALog: l.W.ALog, DTBias: l.W.DTBias, Gate: l.W.Gate, LowerBound: l.W.LowerBound,
			Preprocess: true, Scale: scale,
			State: st.S, Out: core.Rows(s0, s1).Reshape(n, h, d), ChunkSize: chunkSize,
		}
		if !records.IsZero() {
			l.chunkArgs.Records, l.chunkArgs.Raw = records.Rows(s0, s1), raw.Rows(s0, s1)
		}
		if err := b.KDAChunk(&l.chunkArgs); err != nil {
			return fmt.Errorf("kda: core: %w", err)
		}
	}
	rows := core.Reshape(t*h, d)
	if err := b.RMSNorm(rows, rows, l.W.ONorm, l.W.Eps); err != nil {
		return fmt.Errorf("kda: o_norm: %w", err)
	}
	return b.GatedAct(compute.Activation{Kind: compute.SigmoidGate}, core, gate, core)
}

func (l *Layer) outputGate(x, gate compute.Tensor, t int) error {
	if !l.W.G.IsZero() {
		if err := l.b.MatMul(gate, x, l.W.G); err != nil {
			return fmt.Errorf("kda: g_proj: %w", err)
		}
		return nil
	}
	ga := l.ga.Rows(0, t)
	if err := l.b.MatMul(ga, x, l.W.GA); err != nil {
		return fmt.Errorf("kda: g_a_proj: %w", err)
	}
	if err := l.b.MatMul(gate, ga, l.W.GB); err != nil {
		return fmt.Errorf("kda: g_b_proj: %w", err)
	}
	return nil
}

// RecordLen is the length of one token's replay record of a layer of cfg
// (compute.KDAStepArgs.Records): key, decay factors and corrected values
// of every head, then the raw q|k|v projection.
func RecordLen(cfg Config) int { return 6 * cfg.NumHeads * cfg.HeadDim }

// TransposeState converts n states of d1×d2 (row-major) to d2×d1: between
// the K-first layout of the reference equations and files ([.., K, V]) and
// the V-first layout k3 keeps ([.., V, K]).
func TransposeState(dst, src []float32, n, d1, d2 int) {
	for s := 0; s < n; s++ {
		a, b := src[s*d1*d2:(s+1)*d1*d2], dst[s*d1*d2:(s+1)*d1*d2]
		for i := 0; i < d1; i++ {
			for j := 0; j < d2; j++ {
				b[j*d1+i] = a[i*d2+j]
			}
		}
	}
}
