package dsa

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"golang.org/x/sync/errgroup"

	"k3/compute"
	"k3/internal/weights"
)

// Config describes an MLA layer and, for DSA, its Lightning Indexer.
type Config struct {
	Hidden     int
	NumHeads   int
	QLoRARank  int // 0: no query LoRA (q_proj)
	KVLoRARank int // Dc
	NopeDim    int // dn
	RopeDim    int // dr
	VDim       int // dv
	NoPE       bool
	OutputGate bool
	RopeTheta  float64
	// Indexer, when set, makes the layer DSA.
	Indexer *IndexerConfig
	// Yarn, when set, scales the rotary frequencies (DeepSeek-style
	// configs with rope_scaling type yarn).
	Yarn *Yarn
}

// Yarn holds YaRN rope scaling. It applies when MaxPositions exceeds
// OriginalMaxPositions, as in DeepSeek's reference code.
type Yarn struct {
	Factor                             float64
	OriginalMaxPositions, MaxPositions int
	BetaFast, BetaSlow                 float64
	MScale, MScaleAllDim               float64
}

// yarnMScale is YaRN's attention temperature factor.
func yarnMScale(factor, m float64) float64 {
	if factor <= 1 {
		return 1
	}
	return 0.1*m*math.Log(factor) + 1
}

// ropeFreqs returns the rotary frequency of each of the dims/2 pairs, with
// YaRN's interpolation between the original and the scaled frequencies
// over the dimensions whose wavelength crosses the original context.
func (c Config) ropeFreqs(dims int) []float64 {
	f := make([]float64, dims/2)
	for i := range f {
		f[i] = math.Pow(c.RopeTheta, -2*float64(i)/float64(dims))
	}
	y := c.Yarn
	if y == nil || y.MaxPositions <= y.OriginalMaxPositions || y.Factor <= 1 {
		return f
	}
	corr := func(rot float64) float64 {
		return float64(dims) * math.Log(float64(y.OriginalMaxPositions)/(rot*2*math.Pi)) / (2 * math.Log(c.RopeTheta))
	}
	low := max(math.Floor(corr(y.BetaFast)), 0)
	high := min(math.Ceil(corr(y.BetaSlow)), float64(dims-1))
	if low == high {
		high += 0.001
	}
	for i := range f {
		ramp := min(max((float64(i)-low)/(high-low), 0), 1)
		smooth := 1 - ramp
		f[i] = f[i]/y.Factor*(1-smooth) + f[i]*smooth
	}
	return f
}

// yarnScales returns the multiplier of cos/sin and of the softmax scale.
func (c Config) yarnScales() (rope, softmax float64) {
	y := c.Yarn
	if y == nil || y.MaxPositions <= y.OriginalMaxPositions || y.Factor <= 1 {
		return 1, 1
	}
	all := yarnMScale(y.Factor, y.MScaleAllDim)
	return yarnMScale(y.Factor, y.MScale) / all, all * all
}

// IndexerConfig holds the Lightning Indexer's sizes.
type IndexerConfig struct {
	NumHeads, HeadDim, TopK int
	// AllHeads is the head count of the whole indexer when the layer
	// holds a share of its heads (Layer.SplitIndexer): the head weights'
	// scale 1/√(heads·dim) counts all of them. Zero means NumHeads.
	AllHeads int
}

// mhaBudget bounds, in floats, the keys and values MHA-form prefill
// decompresses (256 MiB); longer contexts use the absorbed form.
const mhaBudget = 64 << 20

// latentEps is the epsilon of q_a_layernorm and kv_a_layernorm (1e-6 in the
// Kimi and DeepSeek code, independent of rms_norm_eps), and of the
// indexer's key LayerNorm.
const latentEps = 1e-6

func (c Config) validate() error {
	switch {
	case c.Hidden <= 0 || c.NumHeads <= 0 || c.KVLoRARank <= 0 || c.NopeDim <= 0 || c.VDim <= 0:
		return fmt.Errorf("dsa: config %+v has a non-positive size", c)
	case c.RopeDim < 0 || c.RopeDim%2 != 0:
		return fmt.Errorf("dsa: qk_rope_head_dim %d must be even", c.RopeDim)
	case c.Indexer != nil && (c.Indexer.NumHeads <= 0 || c.Indexer.HeadDim <= 0 || c.Indexer.TopK <= 0):
		return fmt.Errorf("dsa: indexer %+v has a non-positive size", *c.Indexer)
	case c.Indexer != nil && !c.NoPE && c.Indexer.HeadDim < c.RopeDim:
		return fmt.Errorf("dsa: index_head_dim %d smaller than the rope dims %d", c.Indexer.HeadDim, c.RopeDim)
	}
	return nil
}

// Weights are one MLA/DSA layer's tensors, with the load-time transforms
// applied: the query projection split into its nope and rope rows, the
// latent projection into latent and rope rows, kv_b_proj into the absorbed
// W_UKᵀ and the lift W_UV, and the indexer head weights pre-scaled.
type Weights struct {
	QA, QANorm       compute.Tensor // [q_lora, D], [q_lora]; zero without q-LoRA
	QNope, QRope     compute.Tensor // [H·dn, q_lora or D], [H·dr, ...]
	KVA, KVANorm     compute.Tensor // [Dc, D], [Dc]
	KRope            compute.Tensor // [dr, D]
	UKT, UV          compute.Tensor // [H, Dc, dn], [H, dv, Dc]
	UK               compute.Tensor // [H·dn, Dc]: W_UK untransposed, for prefill in MHA form
	UVRows           compute.Tensor // [H·dv, Dc]: W_UV's heads as one linear weight, for prefill in MHA form
	G, O             compute.Tensor // [H·dv, D] (zero without the gate), [D, H·dv]
	IWq, IWk         compute.Tensor // [HI·DI, q_lora or D], [DI, D]
	IKNormW, IKNormB compute.Tensor
	IWeights         compute.Tensor // [HI, D], times HI^-1/2·DI^-1/2
}

// CopiedTensors names the tensors LoadWeights only reads to build
// rearranged copies (those a checkpoint has): their stored bytes are not
// read again once it returns, so a loader may release them.
var CopiedTensors = [...]string{"q_b_proj.weight", "q_proj.weight", "kv_a_proj_with_mqa.weight",
	"kv_b_proj.weight", "indexer.weights_proj.weight"}

// LoadWeights loads a layer's tensors (names relative to "self_attn.").
func LoadWeights(b compute.Backend, cfg Config, src compute.Source) (*Weights, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ld := &weights.Loader{B: b, Src: src}
	h, d, dn, dr, dv, dc := cfg.NumHeads, cfg.Hidden, cfg.NopeDim, cfg.RopeDim, cfg.VDim, cfg.KVLoRARank
	w := &Weights{}
	qin := d
	// Rearranged weights go back in their stored dtype (UploadAs): a bf16
	// checkpoint's q_b, kv_a and kv_b stay bf16 in memory.
	var q []float32
	var qdt compute.DType
	if cfg.QLoRARank > 0 {
		qin = cfg.QLoRARank
		w.QA = ld.Linear("q_a_proj.weight", qin, d)
		w.QANorm = ld.F32("q_a_layernorm.weight", qin)
		q, qdt = ld.HostStored("q_b_proj.weight", h*(dn+dr), qin)
	} else {
		q, qdt = ld.HostStored("q_proj.weight", h*(dn+dr), qin)
	}
	if ld.Err != nil {
		return nil, fmt.Errorf("dsa: %w", ld.Err)
	}
	// Query rows are grouped per head as [dn nope; dr rope].
	nope, rope := make([]float32, 0, h*dn*qin), make([]float32, 0, h*dr*qin)
	for hh := 0; hh < h; hh++ {
		base := hh * (dn + dr) * qin
		nope = append(nope, q[base:base+dn*qin]...)
		rope = append(rope, q[base+dn*qin:base+(dn+dr)*qin]...)
	}
	w.QNope = ld.LinearAs(qdt, nope, h*dn, qin)
	if dr > 0 {
		w.QRope = ld.LinearAs(qdt, rope, h*dr, qin)
	}
	kva, kvadt := ld.HostStored("kv_a_proj_with_mqa.weight", dc+dr, d)
	if ld.Err != nil {
		return nil, fmt.Errorf("dsa: %w", ld.Err)
	}
	w.KVA = ld.LinearAs(kvadt, kva[:dc*d], dc, d)
	if dr > 0 {
		w.KRope = ld.LinearAs(kvadt, kva[dc*d:], dr, d)
	}
	w.KVANorm = ld.F32("kv_a_layernorm.weight", dc)
	kvb, kvbdt := ld.HostStored("kv_b_proj.weight", h*(dn+dv), dc)
	if ld.Err != nil {
		return nil, fmt.Errorf("dsa: %w", ld.Err)
	}
	ukT, uv, err := SplitKVB(kvb, h, dn, dv, dc)
	if err != nil {
		return nil, err
	}
	w.UKT, w.UV = ld.UploadAs(kvbdt, ukT, h, dc, dn), ld.UploadAs(kvbdt, uv, h, dv, dc)
	uk := make([]float32, 0, h*dn*dc)
	for hh := 0; hh < h; hh++ {
		uk = append(uk, kvb[hh*(dn+dv)*dc:(hh*(dn+dv)+dn)*dc]...)
	}
	w.UK = ld.LinearAs(kvbdt, uk, h*dn, dc)
	// The same rows as UV, laid out for MatMul (k-major on the CPU): a
	// prefill's value decompression through UV's per-head layout ran
	// at 0.7 of the prepared product's rate (docs/bench).
	w.UVRows = ld.LinearAs(kvbdt, uv, h*dv, dc)
	if cfg.OutputGate {
		w.G = ld.Linear("g_proj.weight", h*dv, d)
	}
	w.O = ld.Linear("o_proj.weight", d, h*dv)
	if ix := cfg.Indexer; ix != nil {
		w.IWq = ld.Linear("indexer.wq_b.weight", ix.NumHeads*ix.HeadDim, qin)
		w.IWk = ld.Linear("indexer.wk.weight", ix.HeadDim, d)
		w.IKNormW = ld.F32("indexer.k_norm.weight", ix.HeadDim)
		w.IKNormB = ld.F32("indexer.k_norm.bias", ix.HeadDim)
		iw := ld.Host("indexer.weights_proj.weight", ix.NumHeads, d)
		heads := ix.NumHeads
		if ix.AllHeads > 0 {
			heads = ix.AllHeads
		}
		scale := float32(1 / math.Sqrt(float64(heads)*float64(ix.HeadDim)))
		for i := range iw {
			iw[i] *= scale
		}
		w.IWeights = ld.Upload(iw, ix.NumHeads, d)
	}
	if ld.Err != nil {
		return nil, fmt.Errorf("dsa: %w", ld.Err)
	}
	return w, nil
}

// Piece names a piece of an exact pass that Layer.Capture runs.
type Piece uint8

const (
	// PieceProject: the projections of the pass's rows, their absorbed
	// queries and the new keys' norms and rotations.
	PieceProject Piece = iota
	// PieceAttend: the selection (DSA) and attention over each
	// sequence's pages, once the new keys are in them.
	PieceAttend
	// PieceOutput: the value lift, the output gate and o_proj.
	PieceOutput
)

// ErrCacheFull is returned when appending beyond a cache's limit.
var ErrCacheFull = errors.New("dsa: cache full")

// Layer runs one MLA or DSA layer with intermediates for up to maxT tokens.
type Layer struct {
	cfg  Config
	W    *Weights
	b    compute.Backend
	maxT int

	*scratch
	freqs            []float64
	ropeScale, scale float64
	// MHAMin is the prefill length from which dense attention runs in MHA
	// form (keys and values decompressed from the latent once per pass,
	// cheaper than the absorbed form when many queries share them), and
	// index-sparse attention too where each row sees at most twice the
	// positions selected and the MHA form costs fewer multiply-adds
	// (mhaPays); decode, shorter passes and sparser passes use the
	// absorbed form. Both compute the same values.
	MHAMin int
	// Overlap runs the indexer's key and head-weight projections beside
	// the query and latent ones (for measuring; the backend already
	// spreads each product over the cores).
	Overlap bool
	// SplitIndexer, when set, says the layer holds a share of the
	// indexer's heads (tensor parallelism over them): a query's scores
	// are then partial sums over those heads, and SplitIndexer adds the
	// other ranks' shares in place, every rank getting the same sum,
	// before the top K are chosen (on the host, by the backend's order:
	// larger first, ties to the lower position).
	SplitIndexer func(scores compute.Tensor) error
	// Capture, when set, runs pieces of an exact pass (decode steps and
	// verification) through the caller's graph cache: fn's operations
	// have fixed shapes and addresses once piece, rows and deps are
	// given, deps listing the tensors they touch besides the layer's own
	// intermediates (and ints the host integers they follow), and the
	// host values they read are written before fn (the positions, and
	// the slots and page tables). When the pass's pages lie in one slab
	// the mixer is one piece, its cache appends scattered by slot inside
	// it; otherwise the appends run between the pieces (their rows move
	// with the positions).
	Capture func(piece Piece, rows int, deps []compute.Tensor, ints []int32, fn func() error) error
	// StaticTopK makes an exact pass's rows (decode steps, verification)
	// always attend through their selection, -1 padded while they have
	// seen fewer than TopK positions (the same positions as the dense
	// path, summed in the selection's order): a fixed sparse_count, as
	// aclnnSparseFlashAttention takes it, so that a captured step keeps
	// its shape when its sequences pass TopK. The model sets it on a
	// backend that captures, with or without graphs, so that both give
	// the same bits.
	StaticTopK bool
	// DenseSelections makes the indexer select for rows that have seen at
	// most TopK positions too, so that Indices reports every row's
	// selection (traces, conformance). Without it (and without
	// StaticTopK or a SplitIndexer) a run or chunk whose rows have all
	// seen at most TopK positions skips the indexer, and a pass none of
	// whose rows selects skips the indexer's query and head-weight
	// projections (its keys are still cached): such rows
	// attend to every position they have seen, which their top K would
	// be, so their outputs do not change, and their rows of Indices are
	// left as they were; in a prefill chunk that crosses TopK the rows
	// that have seen at most TopK attend through, and Indices holds, the
	// ascending list of those positions (allSeen).
	DenseSelections bool
	// noQueries is set while a pass none of whose rows selects projects
	// its rows: wq_b, weights_proj and the queries' rotation are skipped.
	noQueries bool
	// side is the backend's side stream 2 (compute.Side), on which a
	// device runs the indexer's key and head-weight projections; b
	// itself elsewhere.
	side      compute.Backend
	pos       []int32
	runPos    []int32  // positions of forwardRows' rows
	rowCaches []*Cache // an exact pass's cache per row
	capDeps   []compute.Tensor
	capInts   []int32
	mha       []bool // a chunk pass's choice of form per chunk
	attn      compute.AttnArgs
	// attnCalls and ixCalls hold attendRows' calls, each kind run as one
	// batch (attnPtrs, ixPtrs).
	attnCalls []compute.AttnArgs
	attnPtrs  []*compute.AttnArgs
	ixCalls   []compute.IndexerArgs
	ixPtrs    []*compute.IndexerArgs
	ixArgs    compute.IndexerArgs
	rope      compute.RopeArgs
	// posT [maxT] (I32) holds a run's positions for its rotations and its
	// indexer, written once a run from posHost (a pointer to it is what
	// Write takes without allocating); posMax bounds them.
	posT    compute.Tensor
	posHost []int32
	posMax  int
	// seenHost holds the selections writeAllSeen writes.
	seenHost []int32
	// When a captured exact pass's runs have all their pages in one slab
	// (slab): the rows' slots in the slab (the first rows of tabT), then
	// the runs' page tables, run j's at tabRun[2j] with tabRun[2j+1]
	// pages, written into tabT (I32, grown as needed) from tabHost before
	// the pass's piece, which names the slab and tabT, not the pages.
	slab    *Slab
	tabT    compute.Tensor
	tabHost []int32
	tabRun  []int32
	ready   bool // Prepare readied the next Forward
}

// scratch holds a layer's intermediates; layers of one shape that run one
// after another share one.
type scratch struct {
	cq, qn, qr, qa, ol, o, g compute.Tensor
	kn, vn                   compute.Tensor // MHA-form prefill: decompressed keys and values
	latAll, peAll            compute.Tensor // MHA-form prefill: the cache's latent and rope keys, gathered
	kvNew, peNew             compute.Tensor // batched decode: new latent and rope rows before they enter each cache
	iq, ik, iw, idx          compute.Tensor
	split                    splitIndexer
}

// Share returns a layer with weights w that uses l's intermediates (w must
// have l's shape): the layers of one session run one after another.
func (l *Layer) Share(w *Weights) *Layer {
	c := *l
	c.W = w
	// A prepared step keeps these per layer until the step ends (each
	// layer's caches and pages differ), so they are the copy's own.
	c.rowCaches, c.runPos, c.tabHost, c.tabRun, c.tabT = nil, nil, nil, nil, compute.Tensor{}
	return &c
}

// NewLayer prepares a layer for calls of up to maxT tokens.
func NewLayer(b compute.Backend, cfg Config, w *Weights, maxT int) (*Layer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	l := &Layer{cfg: cfg, W: w, b: b, side: b, maxT: maxT, pos: make([]int32, maxT), MHAMin: 16, scratch: &scratch{}}
	if cfg.Indexer != nil {
		var err error
		if l.side, err = compute.Side(b, 2); err != nil {
			return nil, fmt.Errorf("dsa: indexer's stream: %w", err)
		}
	}
	if cfg.RopeDim > 0 {
		l.freqs = cfg.ropeFreqs(cfg.RopeDim)
	}
	var smScale float64
	l.ropeScale, smScale = cfg.yarnScales()
	l.scale = smScale / math.Sqrt(float64(cfg.NopeDim+cfg.RopeDim))
	var err error
	alloc := func(dt compute.DType, dims ...int) compute.Tensor {
		if err != nil {
			return compute.Tensor{}
		}
		var t compute.Tensor
		t, err = b.Alloc(dt, dims...)
		return t
	}
	h := cfg.NumHeads
	if cfg.QLoRARank > 0 {
		l.cq = alloc(compute.F32, maxT, cfg.QLoRARank)
	}
	l.qn = alloc(compute.F32, maxT, h, cfg.NopeDim)
	l.qr = alloc(compute.F32, maxT, h, max(cfg.RopeDim, 1))
	l.qa = alloc(compute.F32, maxT, h, cfg.KVLoRARank)
	l.ol = alloc(compute.F32, maxT, h, cfg.KVLoRARank)
	l.o = alloc(compute.F32, maxT, h, cfg.VDim)
	l.kvNew = alloc(compute.F32, maxT, cfg.KVLoRARank)
	l.peNew = alloc(compute.F32, maxT, max(cfg.RopeDim, 1))
	l.posT = alloc(compute.I32, maxT)
	if cfg.OutputGate {
		l.g = alloc(compute.F32, maxT, h*cfg.VDim)
	}
	if ix := cfg.Indexer; ix != nil {
		l.iq = alloc(compute.F32, maxT, ix.NumHeads, ix.HeadDim)
		l.ik = alloc(compute.F32, maxT, ix.HeadDim)
		l.iw = alloc(compute.F32, maxT, ix.NumHeads)
		l.idx = alloc(compute.I32, maxT, 1, ix.TopK)
	}
	return l, err
}

// Indices returns the positions the indexer selected for the first t rows
// of the last Forward ([T, TopK], -1 padded); zero for a dense layer. The
// rows of a run or chunk that has seen at most TopK positions hold a
// selection only with DenseSelections (or StaticTopK).
func (l *Layer) Indices(t int) compute.Tensor {
	if l.idx.IsZero() {
		return compute.Tensor{}
	}
	return l.idxRows(0, t).Reshape(t, l.cfg.Indexer.TopK)
}

// idxRows returns rows r0 to r1-1 of the selection scratch ([n, 1, TopK]);
// zero for a dense layer.
func (l *Layer) idxRows(r0, r1 int) compute.Tensor {
	if l.idx.IsZero() {
		return compute.Tensor{}
	}
	return l.idx.Rows(r0, r1)
}

// Seqs describes the sequences whose new tokens a Forward call packs:
// sequence s owns rows Cu[s] to Cu[s+1]-1 of x (at least one), the tokens
// at positions Caches[s].Len onwards of its sequence.
//
// The first Exact sequences are exact runs: each row gets the arithmetic of
// a single-token step (its own indexer selection and attention over its
// sequence up to itself), so its output is bitwise that of feeding the
// tokens one by one, alone or beside any other rows (as long as the exact
// rows number at most compute.InvariantRows). The remaining sequences are
// prefill chunks: blocked attention over the whole chunk, the MHA form when
// long and dense or nearly so (MHAMin), within the conformance tolerance
// of the exact arithmetic.
type Seqs struct {
	Cu     []int32
	Caches []*Cache
	Exact  int
}

// Forward runs the layer over x [R, D], the packed new tokens of the
// sequences s describes, appends them to the caches and writes y [R, D].
// Every projection reads its weight once for the exact rows and once for
// the chunk rows, whatever the number of sequences: the two kinds are kept
// apart because a product over both would give the exact rows another
// summation order once the chunk rows make it long.
func (l *Layer) Forward(x compute.Tensor, s *Seqs, y compute.Tensor) error {
	if l.ready {
		return l.forwardReady(x, y)
	}
	if err := l.check(s, x.Dim(0)); err != nil {
		return err
	}
	t := x.Dim(0)
	e := int(s.Cu[s.Exact])
	if s.Exact > 0 {
		l.setRowCaches(s, s.Exact)
		err := l.forwardRows(x.Rows(0, e), l.rowCaches, y.Rows(0, e))
		clear(l.rowCaches)
		if err != nil {
			return err
		}
	}
	if e < t {
		return l.chunks(x.Rows(e, t), s.Caches[s.Exact:], s.Cu[s.Exact:], l.idxRows(e, t), y.Rows(e, t))
	}
	return nil
}

// check validates s for a call over t rows and reserves the caches' room
// for their rows.
func (l *Layer) check(s *Seqs, t int) error {
	n := len(s.Caches)
	switch {
	case len(s.Cu) != n+1 || s.Cu[0] != 0 || int(s.Cu[n]) != t:
		return fmt.Errorf("dsa: %d rows with row offsets %v for %d sequences", t, s.Cu, n)
	case s.Exact < 0 || s.Exact > n:
		return fmt.Errorf("dsa: %d exact sequences of %d", s.Exact, n)
	case t > l.maxT:
		return fmt.Errorf("dsa: %d tokens, layer sized for %d", t, l.maxT)
	}
	for i, c := range s.Caches {
		if s.Cu[i+1] <= s.Cu[i] {
			return fmt.Errorf("dsa: sequence %d has no rows (offsets %v)", i, s.Cu)
		}
		if c == nil {
			return fmt.Errorf("dsa: sequence %d has no cache", i)
		}
		for _, d := range s.Caches[:i] {
			if d == c {
				return fmt.Errorf("dsa: sequences %d and %d share a cache", i, slices.Index(s.Caches, c))
			}
		}
		if err := c.reserve(int(s.Cu[i+1] - s.Cu[i])); err != nil {
			return err
		}
	}
	return nil
}

// Prepare readies the layer's next Forward over s, all exact runs on a
// layer that captures (Capture set, no SplitIndexer), as a part of a
// step captured whole: it checks s, reserves the caches' room and writes
// the rows' positions, slots and page tables (the step's metadata,
// written before the step so that a replay reads them). It reports
// whether every run's pages lie in one slab. If they do, Commit advances
// the caches' lengths (the host's bookkeeping, which a replay skips) and
// makes the next Forward the device work alone (projections, the
// slot-mapped appends, selection and attention through the tables, the
// output) with no capture of its own; AppendKey gives what the step's
// key needs. Done ends a prepared step, run, replayed or given up (then
// Forward runs as usual: the room and the metadata it finds do no harm).
func (l *Layer) Prepare(s *Seqs, t int) (bool, error) {
	if l.Capture == nil || l.SplitIndexer != nil || s.Exact != len(s.Caches) {
		return false, nil
	}
	if err := l.check(s, t); err != nil {
		return false, err
	}
	l.setRowCaches(s, len(s.Caches))
	caches := l.rowCaches
	if err := l.writeRunPositions(caches, t); err != nil {
		return false, err
	}
	if err := l.writeTables(caches, t); err != nil {
		return false, err
	}
	return l.slab != nil, nil
}

// Commit advances a prepared step's caches and makes the next Forward
// its device work.
func (l *Layer) Commit() {
	caches := l.rowCaches
	for i := 0; i < len(caches); {
		c, n := caches[i], runOf(caches, i)
		c.Len += n
		i += n
	}
	l.ready = true
}

// AppendKey appends what a prepared step's key needs of the layer: the
// tensors its device work names (its intermediates' identity, the slab's
// pools, the positions and table tensors) and per run its first row,
// rows, dense rows and padded page count.
func (l *Layer) AppendKey(deps []compute.Tensor, ints []int32) ([]compute.Tensor, []int32) {
	deps = append(deps, l.qa, l.posT, l.slab.KV, l.slab.PE, l.slab.IK, l.tabT)
	caches := l.rowCaches
	for i, j := 0, 0; i < len(caches); j++ {
		n := runOf(caches, i)
		ints = append(ints, int32(i), int32(n), int32(l.denseRows(i, n)), l.tabRun[2*j+1])
		i += n
	}
	return deps, ints
}

// Done ends a prepared step.
func (l *Layer) Done() {
	l.ready, l.slab = false, nil
	clear(l.rowCaches)
	l.rowCaches = l.rowCaches[:0]
}

// forwardReady is a prepared step's device work.
func (l *Layer) forwardReady(x, y compute.Tensor) error {
	if t := x.Dim(0); t != len(l.rowCaches) {
		return fmt.Errorf("dsa: a step prepared for %d rows run over %d", len(l.rowCaches), t)
	}
	return l.devicePooled(x, l.rowCaches, y, x.Dim(0))
}

// chunks runs prefill rows x [T, D]: sequence i owns rows cu[i]-cu[0] to
// cu[i+1]-cu[0]-1 and continues caches[i] (each with room for them). The
// projections run over all rows at once; each chunk then appends its keys,
// selects (DSA) and attends over its own sequence; the value lift runs
// once per run of absorbed chunks, the gate and o_proj once. Selections go
// to idx [T, TopK].
func (l *Layer) chunks(x compute.Tensor, caches []*Cache, cu []int32, idx, y compute.Tensor) error {
	t := x.Dim(0)
	cfg, w, b := l.cfg, l.W, l.b
	dr := cfg.RopeDim
	if cfg.Indexer != nil {
		l.noQueries = true
		for i, c := range caches {
			l.noQueries = l.noQueries && !l.selects(c.Len+int(cu[i+1]-cu[i]))
		}
	}
	defer func() { l.noQueries = false }()
	qn, qr, kvNew, peNew, err := l.project(x)
	if err != nil {
		return err
	}
	// Which chunks attend in MHA form is known before any runs (it depends
	// on lengths only), so the absorbed ones can share the weight products.
	l.mha = l.mha[:0]
	for i, c := range caches {
		n := int(cu[i+1] - cu[i])
		seen := c.Len + n
		dense := cfg.Indexer == nil || seen <= cfg.Indexer.TopK
		masked := !dense && seen <= 2*cfg.Indexer.TopK && l.mhaPays(n, c.Len)
		l.mha = append(l.mha, n >= l.MHAMin && (dense || masked) && seen*cfg.NumHeads*(cfg.NopeDim+cfg.VDim) <= mhaBudget)
	}
	qa := l.qa.Rows(0, t)
	if err := l.absorbedRuns(cu, func(r0, r1 int) error {
		if err := b.HeadMatMul(qa.Rows(r0, r1), qn.Rows(r0, r1), w.UKT); err != nil {
			return fmt.Errorf("dsa: absorbed query: %w", err)
		}
		return nil
	}); err != nil {
		return err
	}
	for i, c := range caches {
		r0, r1 := int(cu[i]-cu[0]), int(cu[i+1]-cu[0])
		n, p0 := r1-r0, c.Len
		pos := l.pos[r0:r1]
		for j := range pos {
			pos[j] = int32(p0 + j)
		}
		qri, err := l.appendRun(c, pos, r0, qr, kvNew, peNew)
		if err != nil {
			return err
		}
		var indices compute.Tensor
		d := 0 // the first rows, which attend to all they have seen (allSeen)
		if cfg.Indexer != nil && l.selects(p0+n) {
			sel := idx.Rows(r0, r1)
			if d = l.allSeen(p0, n); d > 0 {
				if err := l.writeAllSeen(sel.Rows(0, d), p0); err != nil {
					return err
				}
			}
			if err := l.indexSelect(c, pos[d:], r0+d, d, sel.Rows(d, n)); err != nil {
				return err
			}
			indices = l.attnIndices(sel, p0+n)
		}
		if l.mha[i] {
			if err := l.attendMHA(qn.Rows(r0, r1), qri, c, pos, indices, l.o.Rows(r0, r1)); err != nil {
				return err
			}
		} else {
			l.attn = compute.AttnArgs{Q: qa.Rows(r0, r1), KPages: c.lat, PageSize: PageSize, Indices: indices, QPos: l.posT.Rows(0, n),
				MaxPos: l.posMax, KVLen: c.Len, Causal: true, Scale: float32(l.scale), Out: l.ol.Rows(r0, r1)}
			if dr > 0 {
				l.attn.QRope, l.attn.KRopePages = qri, c.pe
			}
			if err := b.Attention(&l.attn); err != nil {
				return fmt.Errorf("dsa: attention: %w", err)
			}
		}
		if d > 0 && l.DenseSelections {
			// Indices reports the indexer's selections of those rows too;
			// they attended through the lists of all they had seen.
			if err := l.indexSelect(c, pos[:d], r0, 0, idx.Rows(r0, r0+d)); err != nil {
				return err
			}
		}
	}
	if err := l.absorbedRuns(cu, func(r0, r1 int) error {
		if err := b.HeadMatMul(l.o.Rows(r0, r1), l.ol.Rows(r0, r1), w.UV); err != nil {
			return fmt.Errorf("dsa: value lift: %w", err)
		}
		return nil
	}); err != nil {
		return err
	}
	return l.gateAndProject(x, t, y)
}

// allSeen is how many of the first rows of a prefill chunk of n rows
// after p0 cached positions skip the indexer, in a chunk that crosses
// TopK (one whose rows all see at most TopK attends densely): the rows
// that have seen at most TopK, whose top K holds every position they have
// seen. They attend through the ascending list of those positions instead
// (writeAllSeen): the indexer's set in another order, so only the
// summation order differs, as between any two prefill paths. The indexer
// then scores the chunk's later rows alone (in a 512-token chunk that
// crosses TopK 256, a quarter of its scoring and half its sorts). With
// DenseSelections those rows are scored after they attend, for Indices.
// None where a captured pass (StaticTopK) or a split indexer's ranks
// (which meet in the exchange) select every row.
func (l *Layer) allSeen(p0, n int) int {
	k := l.cfg.Indexer.TopK
	if l.StaticTopK || l.SplitIndexer != nil || p0+n <= k {
		return 0 // the chunk's rows attend densely, or every row selects
	}
	return max(0, k-p0)
}

// writeAllSeen writes the selections of allSeen's rows (sel [d, 1, K]),
// the first at position p0: every position up to the row's own,
// ascending, -1 padded.
func (l *Layer) writeAllSeen(sel compute.Tensor, p0 int) error {
	d, k := sel.Dim(0), l.cfg.Indexer.TopK
	l.seenHost = slices.Grow(l.seenHost[:0], d*k)[:d*k]
	for r := range d {
		row := l.seenHost[r*k : (r+1)*k]
		for j := range row {
			row[j] = -1
			if j <= p0+r {
				row[j] = int32(j)
			}
		}
	}
	if err := l.b.Write(sel, &l.seenHost); err != nil {
		return fmt.Errorf("dsa: selections of rows that see at most top-k: %w", err)
	}
	return nil
}

// mhaPays reports whether a chunk of n rows after p0 cached positions,
// every row seeing its whole causal span (dense, or index-sparse with
// selections covering at least half of it, which the backends attend as
// masked dense passes), costs fewer multiply-adds in MHA form
// (decompressing the keys and values of all p0+n positions, then
// H·(dn+dr+dv) a query-key pair) than absorbed (absorbing the n queries
// and lifting their outputs, then H·(2·Dc+dr) a pair).
func (l *Layer) mhaPays(n, p0 int) bool {
	cfg := l.cfg
	h, dc, dn, dr, dv := cfg.NumHeads, cfg.KVLoRARank, cfg.NopeDim, cfg.RopeDim, cfg.VDim
	pairs := n*p0 + n*(n+1)/2
	mha := pairs*h*(dn+dr+dv) + (p0+n)*h*dc*(dn+dv)
	absorbed := pairs*h*(2*dc+dr) + n*h*dc*(dn+dv)
	return mha < absorbed
}

// absorbedRuns calls f on each maximal run of rows (relative to cu[0])
// whose chunks attend in the absorbed form (l.mha false).
func (l *Layer) absorbedRuns(cu []int32, f func(r0, r1 int) error) error {
	for i := 0; i < len(l.mha); {
		if l.mha[i] {
			i++
			continue
		}
		j := i + 1
		for j < len(l.mha) && !l.mha[j] {
			j++
		}
		if err := f(int(cu[i]-cu[0]), int(cu[j]-cu[0])); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// attendMHA attends in multi-head form for one chunk's rows (queries qn,
// qr at positions pos, already in cache) into o: the keys' nope part and
// the values of every cached position are decompressed from the latent
// once (c·W_UKᵀ, c·W_UVᵀ), and each head attends over them directly, to
// the positions indices lists (one list a row for all heads), or to all
// (the zero Tensor). For a long prefill this costs H·(dn+dr+dv) per
// query-key pair instead of the absorbed form's H·(2·Dc+dr); the results
// are the same.
func (l *Layer) attendMHA(qn, qr compute.Tensor, cache *Cache, pos []int32, indices, o compute.Tensor) error {
	cfg, w, b := l.cfg, l.W, l.b
	h, dn, dv, n := cfg.NumHeads, cfg.NopeDim, cfg.VDim, cache.Len
	if l.kn.IsZero() || l.kn.Dims[0] < n {
		// Decompressed keys and values, and the latent and rope keys
		// gathered from the pages, grow with the context; they are prefill
		// scratch, reallocated by doubling.
		size := max(n, 2*l.kn.Dim(0))
		for _, t := range []compute.Tensor{l.kn, l.vn, l.latAll, l.peAll} {
			if !t.IsZero() {
				b.Free(t)
			}
		}
		var err error
		alloc := func(dims ...int) compute.Tensor {
			if err != nil {
				return compute.Tensor{}
			}
			var t compute.Tensor
			t, err = b.Alloc(compute.F32, dims...)
			return t
		}
		l.kn, l.vn = alloc(size, h, dn), alloc(size, h, dv)
		l.latAll, l.peAll = alloc(size, cfg.KVLoRARank), alloc(size, max(cfg.RopeDim, 1))
		if err != nil {
			return err
		}
	}
	// One product over all positions, as from a contiguous cache.
	lat := l.latAll.Rows(0, n)
	if err := cache.gather(lat, 0, n); err != nil {
		return err
	}
	kn, vn := l.kn.Rows(0, n), l.vn.Rows(0, n)
	if err := b.MatMul(kn.Reshape(n, h*dn), lat, w.UK); err != nil {
		return fmt.Errorf("dsa: key decompression: %w", err)
	}
	if err := b.MatMul(vn.Reshape(n, h*dv), lat, w.UVRows); err != nil {
		return fmt.Errorf("dsa: value decompression: %w", err)
	}
	l.attn = compute.AttnArgs{Q: qn, K: kn, V: vn, QPos: l.posT.Rows(0, len(pos)), MaxPos: l.posMax, KVLen: n, Causal: true,
		Indices: indices, Scale: float32(l.scale), Out: o}
	if cfg.RopeDim > 0 {
		pe := l.peAll.Rows(0, n)
		if err := cache.gather(pe, 1, n); err != nil {
			return err
		}
		l.attn.QRope, l.attn.KRope = qr, pe
	}
	if err := b.Attention(&l.attn); err != nil {
		return fmt.Errorf("dsa: attention: %w", err)
	}
	return nil
}

// query projects x [T, D] to the query latent (x itself without q-LoRA)
// and the per-head nope and rope parts.
func (l *Layer) query(x compute.Tensor) (qin, qn, qr compute.Tensor, err error) {
	cfg, w, b := l.cfg, l.W, l.b
	t, h, dr := x.Dim(0), cfg.NumHeads, cfg.RopeDim
	qin = x
	if cfg.QLoRARank > 0 {
		qin = l.cq.Rows(0, t)
		if err = b.MatMul(qin, x, w.QA); err != nil {
			return qin, qn, qr, fmt.Errorf("dsa: q_a_proj: %w", err)
		}
		if err = b.RMSNorm(qin, qin, w.QANorm, latentEps); err != nil {
			return qin, qn, qr, err
		}
	}
	qn = l.qn.Rows(0, t)
	if err = b.MatMul(qn.Reshape(t, h*cfg.NopeDim), qin, w.QNope); err != nil {
		return qin, qn, qr, fmt.Errorf("dsa: query projection: %w", err)
	}
	if dr > 0 {
		qr = l.qr.Rows(0, t)
		if err = b.MatMul(qr.Reshape(t, h*dr), qin, w.QRope); err != nil {
			return qin, qn, qr, fmt.Errorf("dsa: query rope projection: %w", err)
		}
	}
	return qin, qn, qr, nil
}

// rotate applies RoPE to x's rows at the positions setPositions wrote.
func (l *Layer) rotate(x compute.Tensor, dims int, interleaved bool) error {
	l.rope = compute.RopeArgs{X: x, Pos: l.posT.Rows(0, x.Dim(0)), MaxPos: l.posMax, Dims: dims, Freqs: l.freqs,
		Scale: l.ropeScale, Interleaved: interleaved}
	return l.b.RoPE(&l.rope)
}

// setPositions writes a run's positions for its rotations and indexer.
func (l *Layer) setPositions(pos []int32) error {
	l.posHost = append(l.posHost[:0], pos...)
	l.posMax = 0
	for _, p := range pos {
		l.posMax = max(l.posMax, int(p)+1)
	}
	return l.b.Write(l.posT.Rows(0, len(pos)), &l.posHost)
}

// appendRun finishes the new keys of one run of rows (from row r of the
// projections: t = len(pos) rows, at positions pos of cache c) and appends
// them to c: the latent normed, query and key rope parts rotated, and for
// DSA the index keys normed and rotated with their queries. It returns
// the run's rope queries.
func (l *Layer) appendRun(c *Cache, pos []int32, r int, qr, kvNew, peNew compute.Tensor) (compute.Tensor, error) {
	kv, qri, pe, ik, err := l.finishRun(pos, r, qr, kvNew, peNew)
	if err != nil {
		return qri, err
	}
	if err := c.write(kv, pe, ik, len(pos)); err != nil {
		return qri, err
	}
	c.Len += len(pos)
	return qri, nil
}

// finishRun is appendRun without the cache: it returns the run's finished
// latent, rope-query, rope-key and index-key rows.
func (l *Layer) finishRun(pos []int32, r int, qr, kvNew, peNew compute.Tensor) (kv, qri, pe, ik compute.Tensor, err error) {
	if err = l.setPositions(pos); err != nil {
		return
	}
	return l.finishRows(r, len(pos), qr, kvNew, peNew)
}

// finishRows is finishRun for t rows from row r whose positions are the
// first t that setPositions wrote.
func (l *Layer) finishRows(r, t int, qr, kvNew, peNew compute.Tensor) (kv, qri, pe, ik compute.Tensor, err error) {
	cfg, w, b := l.cfg, l.W, l.b
	dr := cfg.RopeDim
	kv = kvNew.Rows(r, r+t)
	if err = b.RMSNorm(kv, kv, w.KVANorm, latentEps); err != nil {
		return
	}
	if dr > 0 {
		qri, pe = qr.Rows(r, r+t), peNew.Rows(r, r+t)
		if !cfg.NoPE {
			if err = l.rotate(qri, dr, true); err != nil {
				return
			}
			if err = l.rotate(pe, dr, true); err != nil {
				return
			}
		}
	}
	if cfg.Indexer != nil {
		ik = l.ik.Rows(r, r+t)
		if err = b.LayerNorm(ik, ik, w.IKNormW, w.IKNormB, latentEps); err != nil {
			return
		}
		if !cfg.NoPE && cfg.RopeDim > 0 {
			if !l.noQueries {
				if err = l.rotate(l.iq.Rows(r, r+t), cfg.RopeDim, false); err != nil {
					return
				}
			}
			if err = l.rotate(ik, cfg.RopeDim, false); err != nil {
				return
			}
		}
	}
	return
}

// indexSelect lets each of one run's rows (from row r of the indexer's
// projections, at positions pos, already in cache c; the positions from
// row pr of the layer's positions tensor) select its top K among the
// positions up to its own into idx.
func (l *Layer) indexSelect(c *Cache, pos []int32, r, pr int, idx compute.Tensor) error {
	return l.indexSelectIn(c, compute.Tensor{}, pos, r, pr, idx)
}

// indexSelectIn is indexSelect with the cache's index keys read from
// l.slab through table when table is set.
func (l *Layer) indexSelectIn(c *Cache, table compute.Tensor, pos []int32, r, pr int, idx compute.Tensor) error {
	ix := l.cfg.Indexer
	t := len(pos)
	l.ixArgs = l.indexerArgs(c, table, t, r, pr, idx)
	if l.SplitIndexer != nil {
		return l.split.selectSummed(l, idx.Reshape(t, ix.TopK), pos, c.Len)
	}
	if err := l.b.LightningIndexer(&l.ixArgs); err != nil {
		return fmt.Errorf("dsa: indexer: %w", err)
	}
	return nil
}

// indexerArgs is the indexer call of t query rows from row r of the
// layer's queries, their positions from row pr of posT, against cache c
// (its pages, or the slab's pool through table), selecting into idx.
func (l *Layer) indexerArgs(c *Cache, table compute.Tensor, t, r, pr int, idx compute.Tensor) compute.IndexerArgs {
	ix := l.cfg.Indexer
	a := compute.IndexerArgs{Q: l.iq.Rows(r, r+t), KPages: c.ik, PageSize: PageSize, KLen: c.Len,
		W: l.iw.Rows(r, r+t), QPos: l.posT.Rows(pr, pr+t), TopK: ix.TopK, Indices: idx.Reshape(t, ix.TopK)}
	if !table.IsZero() {
		a.KPages, a.KPool, a.PageTable = nil, l.slab.IK, table
	}
	return a
}

// forwardRows runs row i of x against caches[i]; consecutive rows of one
// sequence name its cache once each. Every cache has room for its rows.
//
// A run of rows of one cache is appended at once, selects in one indexer
// call and attends in one attention call: an exact pass has at most
// compute.InvariantRows rows, so a row's selection and its attention over
// its sequence up to itself do not depend on the rows beside it. The
// pass runs in pieces (Capture): the rows' positions are written, then
// every projection, norm and rotation runs over all rows, the runs are
// appended to their caches, and then each run selects and attends.
func (l *Layer) forwardRows(x compute.Tensor, caches []*Cache, y compute.Tensor) error {
	t := x.Dim(0)
	if err := l.writeRunPositions(caches, t); err != nil {
		return err
	}
	if l.Capture != nil && l.SplitIndexer == nil {
		if err := l.writeTables(caches, t); err != nil {
			return err
		}
		if l.slab != nil {
			err := l.forwardPooled(x, caches, y, t)
			l.slab = nil
			return err
		}
	}
	if l.Capture == nil {
		// The closures of the pieces only here: they escape, and the Go
		// backend's decode allocates nothing.
		if l.cfg.Indexer != nil {
			l.noQueries = true
			for i := 0; i < t; {
				n := runOf(caches, i)
				l.noQueries = l.noQueries && !l.selects(int(l.runPos[i])+n)
				i += n
			}
		}
		err := l.projectRows(x)
		l.noQueries = false
		if err != nil {
			return err
		}
	} else if err := l.Capture(PieceProject, t, l.deps(x), nil, func() error { return l.projectRows(x) }); err != nil {
		return err
	}
	for i := 0; i < t; {
		c, n := caches[i], runOf(caches, i)
		var pe, ik compute.Tensor
		if l.cfg.RopeDim > 0 {
			pe = l.peNew.Rows(i, i+n)
		}
		if l.cfg.Indexer != nil {
			ik = l.ik.Rows(i, i+n)
		}
		if err := c.write(l.kvNew.Rows(i, i+n), pe, ik, n); err != nil {
			return err
		}
		c.Len += n
		i += n
	}
	if l.Capture == nil || l.SplitIndexer != nil {
		if err := l.attendRows(caches, t); err != nil {
			return err
		}
	} else {
		// The piece follows each run's pages and rows and, for DSA, how
		// many of them attend densely (attendRows).
		deps := l.deps()
		l.capInts = l.capInts[:0]
		for i := 0; i < t; {
			c, n := caches[i], runOf(caches, i)
			deps = append(append(append(deps, c.lat...), c.pe...), c.ik...)
			l.capInts = append(l.capInts, int32(i), int32(n), int32(l.denseRows(i, n)))
			i += n
		}
		l.capDeps = deps
		if err := l.Capture(PieceAttend, t, deps, l.capInts, func() error { return l.attendRows(caches, t) }); err != nil {
			return err
		}
	}
	if l.Capture == nil {
		return l.output(x, t, y)
	}
	return l.Capture(PieceOutput, t, l.deps(x, y), nil, func() error { return l.output(x, t, y) })
}

// setRowCaches sets l.rowCaches to the cache of every row of the first
// k sequences of s.
func (l *Layer) setRowCaches(s *Seqs, k int) {
	l.rowCaches = l.rowCaches[:0]
	for i, c := range s.Caches[:k] {
		for range s.Cu[i+1] - s.Cu[i] {
			l.rowCaches = append(l.rowCaches, c)
		}
	}
}

// writeRunPositions sets l.runPos to the positions of t rows appended to
// caches (row i to caches[i], runs of one cache in order) and writes them.
func (l *Layer) writeRunPositions(caches []*Cache, t int) error {
	l.runPos = l.runPos[:0]
	for i := 0; i < t; {
		c, n := caches[i], runOf(caches, i)
		for r := range n {
			l.runPos = append(l.runPos, int32(c.Len+r))
		}
		i += n
	}
	return l.setPositions(l.runPos)
}

// denseRows is how many of the n rows of the run from row i attend to
// every position they have seen (for DSA, those that have seen at most
// TopK).
func (l *Layer) denseRows(i, n int) int {
	if ix := l.cfg.Indexer; ix != nil {
		if l.StaticTopK {
			return 0
		}
		return min(n, max(0, ix.TopK-int(l.runPos[i])))
	}
	return n
}

// selects reports whether the indexer runs for a run or chunk whose last
// row has seen seen positions (DenseSelections). A split indexer always
// runs: its ranks meet in SplitIndexer.
func (l *Layer) selects(seen int) bool {
	return l.DenseSelections || l.StaticTopK || l.SplitIndexer != nil || seen > l.cfg.Indexer.TopK
}

// forwardPooled is forwardRows' captured pass when every run's pages lie
// in one slab (l.slab), with the slots and tables written: the whole
// mixer is one piece (projections, the new rows scattered into the
// slab's pools by their slots, selection and attention through the page
// tables, the output), whose key names the slab and the table tensor, not
// the pages, with each run's rows, dense rows and page count.
func (l *Layer) forwardPooled(x compute.Tensor, caches []*Cache, y compute.Tensor, t int) error {
	deps := append(l.deps(x, y), l.slab.KV, l.slab.PE, l.slab.IK, l.tabT)
	l.capInts = l.capInts[:0]
	for i, j := 0, 0; i < t; j++ {
		c, n := caches[i], runOf(caches, i)
		l.capInts = append(l.capInts, int32(i), int32(n), int32(l.denseRows(i, n)), l.tabRun[2*j+1])
		c.Len += n // the rows land in the piece, at the slots written
		i += n
	}
	l.capDeps = deps
	return l.Capture(PieceAttend, t, deps, l.capInts, func() error { return l.devicePooled(x, caches, y, t) })
}

// devicePooled is the device work of a pass over one slab: projections,
// the new rows scattered by their slots, selection and attention through
// the page tables, the output.
func (l *Layer) devicePooled(x compute.Tensor, caches []*Cache, y compute.Tensor, t int) error {
	if err := l.projectRows(x); err != nil {
		return err
	}
	slots := l.tabT.Rows(0, t)
	if err := l.b.ScatterRows(l.slab.KV.Reshape(-1, l.cfg.KVLoRARank), slots, l.kvNew.Rows(0, t)); err != nil {
		return fmt.Errorf("dsa: cache write: %w", err)
	}
	if l.cfg.RopeDim > 0 {
		if err := l.b.ScatterRows(l.slab.PE, slots, l.peNew.Rows(0, t)); err != nil {
			return fmt.Errorf("dsa: cache write: %w", err)
		}
	}
	if l.cfg.Indexer != nil {
		if err := l.b.ScatterRows(l.slab.IK, slots, l.ik.Rows(0, t)); err != nil {
			return fmt.Errorf("dsa: cache write: %w", err)
		}
	}
	if err := l.attendRows(caches, t); err != nil {
		return err
	}
	return l.output(x, t, y)
}

// writeTables writes the slots of an exact pass's rows and the page
// tables of its runs (one Write, into tabT) when all their pages lie in
// one slab, and sets l.slab; else l.slab is nil and the runs append and
// attend over their page lists.
func (l *Layer) writeTables(caches []*Cache, t int) error {
	l.slab, l.tabHost, l.tabRun = nil, l.tabHost[:0], l.tabRun[:0]
	// The rows' slots first: row i goes to row page·PageSize + pos%PageSize
	// of the slab's pools, page being its position's page.
	for i := 0; i < t; {
		c, n := caches[i], runOf(caches, i)
		for r := range n {
			pos := c.Len + r
			pg := c.pages[pos/PageSize]
			if pg.slab == nil {
				l.tabHost = l.tabHost[:0]
				return nil
			}
			l.tabHost = append(l.tabHost, pg.index*PageSize+int32(pos%PageSize))
		}
		i += n
	}
	// Every run's table is padded with its last page to one width, the
	// power of two at or above the most pages a run has: the padding's
	// rows lie past every query's position, which the device masks, and
	// the pass keeps its graph while its sequences grow within the bucket
	// (a device's block table, one width for the batch).
	width := 0
	for i := 0; i < t; i += runOf(caches, i) {
		width = max(width, len(caches[i].pages))
	}
	width = pageBucket(width)
	var sl *Slab
	for i := 0; i < t; {
		c, n := caches[i], runOf(caches, i)
		s, tab := c.slabTable(l.tabHost)
		if s == nil || (sl != nil && s != sl) {
			l.tabHost, l.tabRun = l.tabHost[:0], l.tabRun[:0]
			return nil
		}
		sl = s
		np := len(tab) - len(l.tabHost)
		for range width - np {
			tab = append(tab, tab[len(tab)-1])
		}
		l.tabRun = append(l.tabRun, int32(len(l.tabHost)), int32(len(tab)-len(l.tabHost)))
		l.tabHost = tab
		i += n
	}
	if need := len(l.tabHost); l.tabT.IsZero() || l.tabT.Len() < need {
		// A new table is another tensor, so graphs naming the old one
		// are not matched again; it stays allocated with them.
		var err error
		if l.tabT, err = l.b.Alloc(compute.I32, max(need, 2*l.tabT.Len(), 64)); err != nil {
			return err
		}
	}
	if err := l.b.Write(l.tabT.Rows(0, len(l.tabHost)), &l.tabHost); err != nil {
		return err
	}
	l.slab = sl
	return nil
}

// pageBucket is the page count a page table is padded to: the next power
// of two.
func pageBucket(n int) int {
	b := 1
	for b < n {
		b *= 2
	}
	return b
}

// runOf returns the length of the run of rows of caches[i] from row i.
func runOf(caches []*Cache, i int) int {
	n := 1
	for i+n < len(caches) && caches[i+n] == caches[i] {
		n++
	}
	return n
}

// deps returns the dependencies of a piece: ts and the layer's own
// intermediates, which another Layer value with the same weights (a
// batch's) does not share.
func (l *Layer) deps(ts ...compute.Tensor) []compute.Tensor {
	l.capDeps = append(append(l.capDeps[:0], l.qa, l.posT), ts...)
	return l.capDeps
}

// projectRows projects all t rows of x, absorbs their queries into l.qa
// and finishes their new keys (the positions written).
func (l *Layer) projectRows(x compute.Tensor) error {
	t := x.Dim(0)
	_, qr, kvNew, peNew, err := l.project(x)
	if err != nil {
		return err
	}
	if err := l.b.HeadMatMul(l.qa.Rows(0, t), l.qn.Rows(0, t), l.W.UKT); err != nil {
		return fmt.Errorf("dsa: absorbed query: %w", err)
	}
	_, _, _, _, err = l.finishRows(0, t, qr, kvNew, peNew)
	return err
}

// attendRows lets every run of the t rows, its keys in its cache, select
// (DSA) and attend into l.ol. The rows that have seen at most TopK
// positions attend to all of them, as a single step does, and the rest
// to their selection: a run crossing TopK takes two calls. The runs'
// indexer calls go to the backend as one batch, then their attention
// calls (compute.LightningIndexerBatch, AttentionBatch).
func (l *Layer) attendRows(caches []*Cache, t int) error {
	cfg := l.cfg
	l.attnCalls, l.ixCalls = l.attnCalls[:0], l.ixCalls[:0]
	for i, j := 0, 0; i < t; j++ {
		c, n := caches[i], runOf(caches, i)
		p0 := int(l.runPos[i])
		var table compute.Tensor // the run's page table, with a slab
		if l.slab != nil {
			table = l.tabT.Rows(int(l.tabRun[2*j]), int(l.tabRun[2*j]+l.tabRun[2*j+1]))
		}
		var sel compute.Tensor
		if cfg.Indexer != nil {
			sel = l.idxRows(i, i+n)
			switch {
			case !l.selects(p0 + n): // every row attends densely
			case l.SplitIndexer != nil:
				if err := l.indexSelectIn(c, table, l.runPos[i:i+n], i, i, sel); err != nil {
					return err
				}
			default:
				l.ixCalls = append(l.ixCalls, l.indexerArgs(c, table, n, i, i, sel))
			}
		}
		for r0 := 0; r0 < n; {
			r1 := n
			var indices compute.Tensor
			if cfg.Indexer != nil {
				// Rows r with p0+r+1 <= TopK have seen every position.
				if dense := cfg.Indexer.TopK - p0 - r0; dense > 0 && !l.StaticTopK {
					r1 = min(n, r0+dense)
				} else {
					indices = sel.Rows(r0, r1)
				}
			}
			a := compute.AttnArgs{Q: l.qa.Rows(i+r0, i+r1), KPages: c.lat, PageSize: PageSize, Indices: indices,
				QPos: l.posT.Rows(i+r0, i+r1), KVLen: p0 + r1, Causal: true, Scale: float32(l.scale), Out: l.ol.Rows(i+r0, i+r1)}
			if cfg.RopeDim > 0 {
				a.QRope, a.KRopePages = l.qr.Rows(i+r0, i+r1), c.pe
			}
			if l.slab != nil {
				a.KPages, a.KRopePages = nil, nil
				a.KPool, a.PageTable = l.slab.KV, table
				if cfg.RopeDim > 0 {
					a.KRopePool = l.slab.PE
				}
			}
			l.attnCalls = append(l.attnCalls, a)
			r0 = r1
		}
		i += n
	}
	// The runs' calls as one batch each, the selections before the
	// attention that reads them: one dispatch over the workers for a
	// decode batch's sequences (compute.IndexerBatcher, AttentionBatcher).
	if len(l.ixCalls) > 0 {
		l.ixPtrs = l.ixPtrs[:0]
		for i := range l.ixCalls {
			l.ixPtrs = append(l.ixPtrs, &l.ixCalls[i])
		}
		if err := compute.LightningIndexerBatch(l.b, l.ixPtrs); err != nil {
			return fmt.Errorf("dsa: indexer: %w", err)
		}
	}
	l.attnPtrs = l.attnPtrs[:0]
	for i := range l.attnCalls {
		l.attnPtrs = append(l.attnPtrs, &l.attnCalls[i])
	}
	if err := compute.AttentionBatch(l.b, l.attnPtrs); err != nil {
		return fmt.Errorf("dsa: attention: %w", err)
	}
	return nil
}

// project runs the layer's input projections for the rows of x: the
// query (nope and rope parts), the new latent and rope-key rows, and for
// DSA the indexer's queries, keys and head weights (into l.iq, l.ik,
// l.iw). The indexer's key and head-weight products read x alone: on a
// backend with side streams they are queued on the side stream and
// joined after the query and latent ones; with Overlap they run on a
// goroutine beside them.
func (l *Layer) project(x compute.Tensor) (qn, qr, kvNew, peNew compute.Tensor, err error) {
	if l.cfg.Indexer != nil && l.side != l.b {
		if err = compute.Fork(l.b, l.side); err != nil {
			return
		}
		if err = l.indexKeys(l.side, x); err != nil {
			return
		}
		if qn, qr, kvNew, peNew, err = l.projectMain(x); err != nil {
			return
		}
		err = compute.Join(l.b, l.side)
		return
	}
	if l.Overlap && l.cfg.Indexer != nil {
		var g errgroup.Group
		g.Go(func() error { return l.indexKeys(l.b, x) })
		qn, qr, kvNew, peNew, err = l.projectMain(x)
		if werr := g.Wait(); err == nil {
			err = werr
		}
		return
	}
	if qn, qr, kvNew, peNew, err = l.projectMain(x); err == nil && l.cfg.Indexer != nil {
		err = l.indexKeys(l.b, x)
	}
	return
}

// projectMain is project without the indexer's keys and head weights.
func (l *Layer) projectMain(x compute.Tensor) (qn, qr, kvNew, peNew compute.Tensor, err error) {
	t := x.Dim(0)
	cfg, w, b, ix := l.cfg, l.W, l.b, l.cfg.Indexer
	var qin compute.Tensor
	if qin, qn, qr, err = l.query(x); err != nil {
		return
	}
	kvNew = l.kvNew.Rows(0, t)
	if err = b.MatMul(kvNew, x, w.KVA); err != nil {
		err = fmt.Errorf("dsa: kv_a_proj_with_mqa: %w", err)
		return
	}
	if cfg.RopeDim > 0 {
		peNew = l.peNew.Rows(0, t)
		if err = b.MatMul(peNew, x, w.KRope); err != nil {
			err = fmt.Errorf("dsa: kv_a_proj_with_mqa rope rows: %w", err)
			return
		}
	}
	if ix != nil && !l.noQueries {
		if err = b.MatMul(l.iq.Rows(0, t).Reshape(t, ix.NumHeads*ix.HeadDim), qin, w.IWq); err != nil {
			err = fmt.Errorf("dsa: indexer.wq_b: %w", err)
		}
	}
	return
}

// indexKeys projects x to the indexer's raw keys and head weights on b
// (the layer's backend or its side stream).
func (l *Layer) indexKeys(b compute.Backend, x compute.Tensor) error {
	t := x.Dim(0)
	if err := b.MatMul(l.ik.Rows(0, t), x, l.W.IWk); err != nil {
		return fmt.Errorf("dsa: indexer.wk: %w", err)
	}
	if l.noQueries {
		return nil // the head weights serve selections alone
	}
	if err := b.MatMul(l.iw.Rows(0, t), x, l.W.IWeights); err != nil {
		return fmt.Errorf("dsa: indexer.weights_proj: %w", err)
	}
	return nil
}

// output lifts the attended latents of t rows, applies the gate and o_proj.
func (l *Layer) output(x compute.Tensor, t int, y compute.Tensor) error {
	if err := l.b.HeadMatMul(l.o.Rows(0, t), l.ol.Rows(0, t), l.W.UV); err != nil {
		return fmt.Errorf("dsa: value lift: %w", err)
	}
	return l.gateAndProject(x, t, y)
}

// gateAndProject applies the output gate to the head outputs in l.o and
// projects them with o_proj.
func (l *Layer) gateAndProject(x compute.Tensor, t int, y compute.Tensor) error {
	cfg, w, b := l.cfg, l.W, l.b
	o2 := l.o.Rows(0, t).Reshape(t, cfg.NumHeads*cfg.VDim)
	if cfg.OutputGate {
		g := l.g.Rows(0, t)
		if err := b.MatMul(g, x, w.G); err != nil {
			return fmt.Errorf("dsa: g_proj: %w", err)
		}
		if err := b.GatedAct(compute.Activation{Kind: compute.SigmoidGate}, o2, g, o2); err != nil {
			return err
		}
	}
	if err := b.MatMul(y, o2, w.O); err != nil {
		return fmt.Errorf("dsa: o_proj: %w", err)
	}
	return nil
}

// attnIndices returns the index lists attention should use when the
// furthest row of a pass sees seen positions: none while seen <= K, since
// every row's top K is then all it sees, so attention is dense (the same
// sum in another order) and the dense paths are the faster ones. Exact rows
// and chunks both ask here, which keeps batched rows bit-identical to solo
// ones. The lists stay in place for Indices.
func (l *Layer) attnIndices(indices compute.Tensor, seen int) compute.Tensor {
	if seen <= l.cfg.Indexer.TopK {
		return compute.Tensor{}
	}
	return indices
}
