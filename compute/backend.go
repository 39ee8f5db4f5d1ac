package compute

import (
	"fmt"
	"math"
)

// Backend runs k3's operations on one device (or the host). Methods that
// take a destination write into it; shapes are checked and reported as
// errors wrapping ErrShape. A Backend is safe for concurrent use.
type Backend interface {
	// Name identifies the backend ("go", "ascend").
	Name() string

	// Alloc returns a zeroed tensor.
	Alloc(dt DType, dims ...int) (Tensor, error)
	// FromHost makes a tensor from little-endian host bytes of dtype src,
	// converted to dt. A host backend may alias data instead of copying it
	// (weights memory-mapped from a checkpoint), so data must stay valid
	// and unmodified while the tensor lives.
	FromHost(dt DType, src DType, data []byte, dims ...int) (Tensor, error)
	// Write copies dst.Len() host values into dst. Their type says how:
	// a []float32 fills an F32 tensor, or a BF16 or F16 one rounded to
	// nearest even; an []int32 fills an I32 tensor; a []uint16 fills a
	// BF16 or F16 tensor with those bits. A pointer to a slice does the
	// same (boxing a pointer allocates nothing, which keeps a decode step
	// allocation-free). Another pairing, or another length, is an error
	// wrapping ErrShape; a tensor over the caller's bytes (FromHost) or a
	// prepared weight is not written.
	Write(dst Tensor, src any) error
	// Read copies src's elements to the host, typed as Write: into a
	// []float32 from F32, BF16 or F16 (widened exactly), an []int32 from
	// I32, a []uint16 from BF16 or F16 (the bits). A prepared weight
	// reads in its row-major order.
	Read(dst any, src Tensor) error
	// Free releases a tensor made by Alloc or FromHost; views are not freed.
	Free(t Tensor)

	// MatMul computes dst[M,N] = x[M,K] · w[N,K]ᵀ (the Linear layout);
	// w may be F32 or BF16, x and dst are F32. For M <= InvariantRows a
	// row's result must not depend on M or on the other rows.
	MatMul(dst, x, w Tensor) error
	// HeadMatMul is a per-head product: dst[t,h,:] = x[t,h,:] · w[h]ᵀ for
	// x [T, H, K], w [H, N, K], dst [T, H, N] (MLA's absorbed W_UK and W_UV).
	HeadMatMul(dst, x, w Tensor) error
	// RMSNorm normalises each row of x (last dimension) and multiplies by w
	// (zero w: no weight). dst may be x.
	RMSNorm(dst, x, w Tensor, eps float32) error
	// LayerNorm normalises each row to zero mean and unit variance, then
	// applies weight w and bias b.
	LayerNorm(dst, x, w, b Tensor, eps float32) error
	// Unary applies op elementwise. dst may be x.
	Unary(op UnaryOp, dst, x Tensor) error
	// Binary applies op elementwise; b has a's shape, or is one row that
	// broadcasts over a's rows, or is a column [T, 1] (a has T rows of
	// more than one element) whose value for each row broadcasts over
	// that row. dst may be a.
	Binary(op BinaryOp, dst, a, b Tensor) error
	// GatedAct computes dst = act(gate) * up: the SwiGLU/SiTU feed-forward
	// core, or an output gate (SigmoidGate).
	GatedAct(act Activation, dst, gate, up Tensor) error
	// RoPE rotates the leading dimensions of every row of X in place.
	RoPE(a *RopeArgs) error
	// Embedding gathers rows of table (F32 or BF16) for the I32 ids.
	Embedding(dst, table, ids Tensor) error
	// Copy copies src into dst (same element count and dtype).
	Copy(dst, src Tensor) error
	// Fill sets every element of dst to v, converted to dst's dtype (I32:
	// truncated): a state is reset without shipping zeros from the host.
	Fill(dst Tensor, v float32) error
	// ScatterRows copies row i of src into row idx[i] of dst (rows along
	// the first dimension, of one width and dtype; idx I32 [n], n the
	// rows of src, each in range, no two alike): a device's cache write
	// by slot mapping, the indices staying on the device.
	ScatterRows(dst, idx, src Tensor) error

	// KDAChunk runs Kimi Delta Attention's core over packed sequences,
	// chunked (FlashKDA's token-parallel then sequential split) or token by
	// token; see KDAArgs.
	KDAChunk(a *KDAArgs) error
	// KDAStep runs one whole KDA layer (MegaKDA) for one token per sequence.
	KDAStep(a *KDAStepArgs) error
	// CausalConv is KDA's short depthwise causal convolution with SiLU over
	// packed sequences, reading and updating each sequence's conv cache.
	CausalConv(a *ConvArgs) error
	// LightningIndexer scores past positions and selects the top K.
	LightningIndexer(a *IndexerArgs) error
	// Attention is dense or index-sparse attention over a KV cache, in
	// MLA-MQA (absorbed latent) or multi-head/GQA form.
	Attention(a *AttnArgs) error
	// AttnResPrepare is Block AttnRes phase 1: all queries of a block
	// against the committed blocks in one pass.
	AttnResPrepare(a *AttnResPrepareArgs) error
	// AttnResUpdate is phase 2: add the sublayer delta to the partial sum
	// and merge it with the phase-1 statistics (online softmax).
	AttnResUpdate(a *AttnResUpdateArgs) error
	// MoERoute selects experts and their weights from router logits.
	MoERoute(a *RouteArgs) error
	// MoEExperts runs the selected experts, grouped by expert so that each
	// active expert's weights are read once per batch.
	MoEExperts(a *ExpertArgs) error

	// Close releases the backend's resources.
	Close() error
}

// WeightPreparer is implemented by a backend that lays matmul weights out
// for its hardware when a model is loaded (the Ascend backend's
// FRACTAL_NZ). PrepareMatMul receives a weight [N, K] that from then on
// is read only as the w of MatMul and returns the tensor to use in its
// place: w itself, or a new tensor, w being freed.
type WeightPreparer interface {
	PrepareMatMul(w Tensor) (Tensor, error)
}

// HostReader is implemented by a backend whose tensors may go on reading
// the host bytes they were made from (FromHost without a copy, as over a
// memory-mapped checkpoint). ReadsHost reports whether a tensor made from
// bytes overlapping b may still read them: one still reachable, or not yet
// found unreachable by a garbage collection (runtime.GC). A loader
// releases the pages of a tensor's stored bytes that nothing reads, such
// as those of weights PrepareMatMul laid out anew.
type HostReader interface {
	ReadsHost(b []byte) bool
}

// ExpertPreparer is implemented by a backend whose MoEExperts reads a
// layer's experts as one stacked weight per kind (a device's grouped
// matmul). PrepareExperts receives one layer's expert weights, each as
// PrepareMatMul returned it, that from then on are read only through
// ExpertArgs (and MatMul); it may replace the slices' entries in place
// with views of stacked tensors, the originals being freed. Experts that
// cannot share a stack are refused before anything moves; after a later
// failure (the device's memory) every entry is still a valid weight.
type ExpertPreparer interface {
	PrepareExperts(w1, w3, w2 []Tensor) error
}

// PrepareExperts is b's PrepareExperts when b is an ExpertPreparer, and
// nothing otherwise.
func PrepareExperts(b Backend, w1, w3, w2 []Tensor) error {
	if p, ok := b.(ExpertPreparer); ok {
		return p.PrepareExperts(w1, w3, w2)
	}
	return nil
}

// AttentionBatcher is implemented by a backend that runs several
// attention calls, each over its own cache, as one (a decode batch's
// sequences, one call each): every call's outputs are bitwise those it
// gets alone. An error names the call it comes from.
type AttentionBatcher interface {
	AttentionBatch(calls []*AttnArgs) error
}

// AttentionBatch runs calls as one where b is an AttentionBatcher, and
// one after another otherwise.
func AttentionBatch(b Backend, calls []*AttnArgs) error {
	if ab, ok := b.(AttentionBatcher); ok {
		return ab.AttentionBatch(calls)
	}
	for i, a := range calls {
		if err := b.Attention(a); err != nil {
			return CallErr("attention", i, len(calls), err)
		}
	}
	return nil
}

// CallErr names call i of a batch of n calls of op in err, where n > 1.
func CallErr(op string, i, n int, err error) error {
	if n <= 1 {
		return err
	}
	return fmt.Errorf("%s call %d of %d: %w", op, i, n, err)
}

// IndexerBatcher is implemented by a backend that runs several Lightning
// Indexer calls, each over its own keys, as one (a decode batch's
// sequences): every call's indices (and counts and scores) are those it
// gets alone. An error names the call it comes from.
type IndexerBatcher interface {
	LightningIndexerBatch(calls []*IndexerArgs) error
}

// LightningIndexerBatch runs calls as one where b is an IndexerBatcher,
// and one after another otherwise.
func LightningIndexerBatch(b Backend, calls []*IndexerArgs) error {
	if ib, ok := b.(IndexerBatcher); ok {
		return ib.LightningIndexerBatch(calls)
	}
	for i, a := range calls {
		if err := b.LightningIndexer(a); err != nil {
			return CallErr("indexer", i, len(calls), err)
		}
	}
	return nil
}

// Capturer is implemented by a backend that records operations into a
// graph replayed later instead of running them (a device's graph
// capture). Capture runs fn, which queues operations on the backend and
// its side streams; nothing else may use the backend meanwhile, and an
// operation that waits for the device fails inside fn. Every replay reads
// and writes the tensors fn used, at their addresses.
type Capturer interface {
	Capture(fn func() error) (Graph, error)
}

// Graph is captured work.
type Graph interface {
	// Replay queues the captured work again.
	Replay() error
	// Close releases the graph after the replays queued so far.
	Close() error
	// Bytes is the device memory the graph keeps for its replays (the
	// scratch and workspaces of the captured operations).
	Bytes() int64
}

// Streams is implemented by a backend that runs work on more than one
// queue (a device's streams), so that independent work overlaps.
type Streams interface {
	// Side returns a view of the backend whose operations queue on side
	// stream i (1, 2, ...), created on first use and owned by the
	// backend: its Close does nothing.
	Side(i int) (Backend, error)
	// Fork orders the work queued on side from now on after the work
	// queued on the backend so far.
	Fork(side Backend) error
	// Join orders the backend's later work after the work queued on side
	// so far.
	Join(side Backend) error
}

// Side is b's side stream i when b implements Streams, and b itself
// otherwise.
func Side(b Backend, i int) (Backend, error) {
	if s, ok := b.(Streams); ok {
		return s.Side(i)
	}
	return b, nil
}

// Fork is b.Fork(side), or nothing when side is b.
func Fork(b, side Backend) error {
	if s, ok := b.(Streams); ok && side != b {
		return s.Fork(side)
	}
	return nil
}

// Join is b.Join(side), or nothing when side is b.
func Join(b, side Backend) error {
	if s, ok := b.(Streams); ok && side != b {
		return s.Join(side)
	}
	return nil
}

// PrepareMatMul is b's PrepareMatMul when b is a WeightPreparer, and w
// otherwise.
func PrepareMatMul(b Backend, w Tensor) (Tensor, error) {
	if p, ok := b.(WeightPreparer); ok && !w.IsZero() {
		return p.PrepareMatMul(w)
	}
	return w, nil
}

// UnaryOp is an elementwise function.
type UnaryOp uint8

const (
	SiLU UnaryOp = iota + 1
	Sigmoid
	Softplus
	Exp
)

// BinaryOp is an elementwise operation of two tensors.
type BinaryOp uint8

const (
	Add BinaryOp = iota + 1
	Mul
	Sub // a - b
	Max // the larger of a and b
	Div // a / b
)

// IsColumn reports whether b is a column [T, 1] that broadcasts over the
// rows of a (Binary's third form).
func IsColumn(a, b Tensor) bool {
	d := a.Dim(-1)
	return b.Rank >= 2 && b.Dim(-1) == 1 && d > 1 && b.Len()*d == a.Len()
}

// Activation selects the gated feed-forward activation.
type Activation struct {
	Kind ActKind
	// SiTU parameters: gate branch Beta·tanh(g/Beta)·sigmoid(g), up branch
	// LinearBeta·tanh(u/LinearBeta) (LinearBeta 0: unclipped).
	Beta, LinearBeta float32
}

// ActKind names a gated activation.
type ActKind uint8

const (
	SwiGLU ActKind = iota + 1
	SiTU
	// SigmoidGate is sigmoid(gate)·up: the output gates of KDA and of
	// gated attention, in one pass (GatedAct only; MoEExperts take SwiGLU
	// and SiTU). Its bits are those of Unary(Sigmoid), then Binary(Mul).
	SigmoidGate
)

// KDAGate selects how KDAArgs.G becomes the log decay g.
type KDAGate uint8

const (
	// GateGiven: G already holds g (<= 0, natural log).
	GateGiven KDAGate = iota
	// GateSoftplus (Kimi Linear): g = -exp(A_log[h]) · softplus(G + dt_bias).
	GateSoftplus
	// GateLowerBound (Kimi K3): g = LowerBound · sigmoid(exp(A_log[h]) · (G + dt_bias)).
	GateLowerBound
)

// KDAArgs are the operands of KDAChunk. Tokens of several sequences are
// packed along T; CuSeqlens (host, N+1 prefix sums) separates them, nil
// meaning one sequence. Layouts: Q, K [T,H,Dk]; V, Out [T,H,Dv]; G [T,H,Dk];
// Beta [T,H]; State [N,H,Dv,Dk] (V-first: element [v][k] is S[k][v] of the
// equations, so o = Sᵀq reads contiguous rows), read as the initial state
// and overwritten with the final one.
type KDAArgs struct {
	Q, K, V, G, Beta Tensor
	// QKV, when set, replaces Q, K and V (Dk = Dv = D): [T, 3·H·D] rows
	// ordered q | k | v, the short conv's output as the layer produces it.
	QKV          Tensor
	ALog, DTBias Tensor // [H], [H*Dk]; used by the gate modes that need them
	Gate         KDAGate
	LowerBound   float32
	// Preprocess applies the in-kernel steps of the released models: L2
	// norm of q and k (eps 1e-6 inside the root) and beta = sigmoid(Beta).
	Preprocess bool
	Scale      float32
	CuSeqlens  []int32
	State, Out Tensor
	// StateIdx, when set, makes State a pool of P states [P,H,Dv,Dk]:
	// sequence s reads and writes row StateIdx[s] (I32 [N], a tensor of
	// the backend, each in [0, P), no two alike). The indices stay on the
	// device, so a captured step serves whichever sequences the indices
	// written before its replay name (aclnnRecurrentGatedDeltaRule's
	// ssmStateIdx).
	StateIdx Tensor
	// ChunkSize is the chunk length of the WY form (16 or 64); 0 runs the
	// recurrence token by token.
	ChunkSize int
	// Records, when set (token by token only, ChunkSize 0; Dk = Dv = D),
	// receives each token's replay record, [T, 6·H·D] F32 in the layout of
	// KDAStepArgs.Records: the key as the update used it, the decay
	// factors α = exp(g), the corrected values u = β(v - (Diag(α)S)ᵀk),
	// then Raw's row. A backend that cannot write them refuses the call
	// with ErrUnsupported; it never leaves them unwritten.
	Records Tensor
	// Raw is what each record ends with: the raw q|k|v projections that
	// entered the short conv, [T, 3·H·D].
	Raw Tensor
}

// KDAWeights are one KDA layer's weights. The q, k and v projections and
// their conv taps are stacked at load so that one product and one conv
// serve all three (channels ordered q | k | v, as in the conv cache).
type KDAWeights struct {
	QKV          Tensor // [3*H*D, hidden]
	Conv         Tensor // [3*H*D, W]
	FA, FB       Tensor // [D, hidden], [H*D, D]
	B            Tensor // [H, hidden]
	G            Tensor // full-rank output gate [H*D, hidden], or zero
	GA, GB       Tensor // low-rank output gate [D, hidden], [H*D, D]
	ONorm, OProj Tensor // [D], [hidden, H*D]
	ALog, DTBias Tensor // [H], [H*D]
	NumHeads     int
	HeadDim      int
	Gate         KDAGate
	LowerBound   float32
	Eps          float32 // of the output RMSNorm
}

// KDAStepArgs are the operands of KDAStep: X and Y [B·T, hidden] (T
// tokens per sequence, sequence-major), Conv [B, W-1, 3*H*D] (raw
// projections of the last tokens, q|k|v, oldest first), State [B, H, D, D]
// (V-first, as in KDAArgs); Conv and State are updated in place.
//
// A sequence's T tokens go through the recurrence one after another with
// the arithmetic of T single-token steps, so the states and outputs are
// bitwise those of T calls with Tokens 1 (the projections, over all rows
// at once, keep that as long as B·T is at most InvariantRows): a
// verification pass over drafted tokens is exact.
type KDAStepArgs struct {
	W              *KDAWeights
	X, Conv, State Tensor
	Y              Tensor
	// Tokens is T, the tokens per sequence; 0 means 1.
	Tokens int
	// CuSeqlens, when set, replaces Tokens with a count per sequence: B+1
	// row offsets into X (host), sequence s owning rows CuSeqlens[s] to
	// CuSeqlens[s+1]-1, each at least one; every sequence's rows are
	// stepped in order with the single-step arithmetic, as with Tokens.
	CuSeqlens []int32
	// Convs and States, when set, replace Conv and State with one tensor
	// per sequence ([W-1, 3*H*D] and [H, D, D]): sessions batched for one
	// step keep their own state in place.
	Convs, States []Tensor
	// Records, when set, receives each token's replay record of the step,
	// [B·T, 6*H*D] F32: the key as the update used it (L2-normed), the
	// decay factors α = exp(g), the corrected values u = β(v - (Diag(α)S)ᵀk)
	// (each [H*D], head-major) and the raw q|k|v projection that entered
	// the conv window ([3*H*D]): the layout of replay.Record.
	Records Tensor
	// QKVIn, GIn, BetaIn and GateIn, when QKVIn is set, are X's
	// projections computed by the caller, rows as X's: the raw q|k|v
	// [rows, 3*H*D], the raw decay gate f_b(f_a(x)) [rows, H*D], b_proj(x)
	// [rows, H] and the output gate before its sigmoid [rows, H*D]. The
	// step then skips those products, so that a pass that also prefills
	// other sequences computes them for all its rows at once.
	QKVIn, GIn, BetaIn, GateIn Tensor
	// Core, when set, receives the step's normed and gated output [rows,
	// H*D] in place of Y's o_proj of it (Y is not written): the caller
	// projects it together with other rows.
	Core Tensor
}

// ConvArgs are the operands of CausalConv: X and Out [T, C] packed over
// sequences (CuSeqlens, nil: one), Weight [C, W], State [N, W-1, C] holding
// the raw inputs of each sequence's previous W-1 tokens (oldest first),
// updated to the last W-1 rows of [State; X]. Out = SiLU(depthwise causal
// convolution), tap W-1 being the current token.
//
// StateIdx, when set, makes State a pool [P, W-1, C]: sequence s reads
// and writes row StateIdx[s] (I32 [N], each in [0, P), no two alike), as
// in KDAArgs.
type ConvArgs struct {
	X, Weight, State, Out Tensor
	CuSeqlens             []int32
	StateIdx              Tensor
}

// IndexerArgs are the operands of LightningIndexer. Query row t (at
// position QPos[t] of its sequence) scores keys s <= QPos[t] of its
// sequence: I[t,s] = Σ_h W[t,h] · ReLU(Q[t,h]·K[s]). The top TopK by score
// (ties to the lower position) go to Indices [T, TopK] (I32, -1 padded,
// positions local to the sequence) and their number to Counts [T] (I32).
// Scores [T, maxL] is optional (-Inf where invisible).
type IndexerArgs struct {
	Q Tensor // [T, HI, DI]
	K Tensor // [L, DI], packed over sequences
	W Tensor // [T, HI]
	// KPages, when set, replaces K for one sequence's paged cache: key s
	// is row s%PageSize of KPages[s/PageSize] ([PageSize, DI]); the keys
	// are the pages' first L = KLen rows.
	KPages []Tensor
	// KPool and PageTable, when set, replace KPages: the pages are rows of
	// a pool [N·PageSize, DI], page i being the pool's page PageTable[i]
	// (I32 [P], a tensor of the backend, as AttnArgs.PageTable).
	KPool, PageTable       Tensor
	PageSize, KLen         int
	QPos                   Tensor  // [T] I32, a tensor of the backend (see RopeArgs)
	CuSeqlensQ, CuSeqlensK []int32 // host prefix sums; nil: one sequence
	TopK                   int
	Indices, Counts        Tensor
	Scores                 Tensor
}

// AttnArgs are the operands of Attention. Keys are [L, Hkv, Dk] plus an
// optional shared rope part KRope [L, Dr]; queries [T, Hq, Dk] plus QRope
// [T, Hq, Dr]; query head h uses kv head h/(Hq/Hkv). For MLA in MQA form K
// and V are the same latent cache viewed [L, 1, Dc]. Indices [T, Hkv, Kn]
// (I32) restricts each row to the listed positions (-1 and out-of-range
// entries skipped; with Causal, entries beyond QPos[t] too); Indices
// [T, 1, Kn] shares one list among all kv heads; the zero
// Indices means dense causal attention over 0..QPos[t]. Out [T, Hq, Dv];
// LSE [T, Hq] optional (natural log; -Inf for a row with nothing to attend).
//
// A paged cache leaves K, V and KRope zero and sets KPages: position s is
// row s%PageSize of page s/PageSize, KPages[i] [PageSize, Hkv, Dk],
// VPages[i] [PageSize, Hkv, Dv] (VPages nil: the values are the keys, as
// in MLA's MQA form) and KRopePages[i] [PageSize, Dr]. PageSize is a
// multiple of 64; the pages hold KVLen positions or more.
//
// Or the pages are rows of pools, as a device's block table has them:
// PageTable (I32 [P], a tensor of the backend) lists the sequence's
// pages, page i being rows PageTable[i]·PageSize onwards of KPool
// [N·PageSize, Hkv, Dk], VPool [N·PageSize, Hkv, Dv] (zero: the values
// are the keys) and KRopePool [N·PageSize, Dr]. The table stays on the
// device, so a captured step reads the pages written before its replay.
type AttnArgs struct {
	Q, QRope, K, KRope, V      Tensor
	KPages, VPages, KRopePages []Tensor
	KPool, VPool, KRopePool    Tensor
	PageTable                  Tensor
	PageSize                   int
	Indices                    Tensor
	QPos                       Tensor // [T] I32, a tensor of the backend (see RopeArgs)
	// MaxPos, when not 0, bounds the positions (each < MaxPos; 0: KVLen),
	// which sizes a device's dense candidate rows.
	MaxPos   int
	KVLen    int
	Causal   bool
	Scale    float32
	Out, LSE Tensor
}

// AttnResPrepareArgs: Blocks are the committed block representations
// ([T, D] each), Queries [S, D] the fused pseudo-queries w·g of a block's
// sublayers. Outputs per query and token: Num [S, T, D] (Σ e^{z-m} b),
// Max [S, T] and Sum [S, T] (Σ e^{z-m}); with no blocks, Num = 0,
// Max = lowest finite float32, Sum = 0.
type AttnResPrepareArgs struct {
	Blocks        []Tensor
	Queries       Tensor
	Eps           float32
	Num, Max, Sum Tensor
}

// AttnResUpdateArgs: Partial [T, D] is the running partial sum of the
// block (valid only when HasPartial). A non-zero Delta (the previous
// sublayer's output) is first added to it (or becomes it when there is no
// partial yet), and HasPartial is set. Then the partial is merged with one
// query's phase-1 statistics Num [T, D], Max [T], Sum [T] into H [T, D];
// without a partial, H = Num / Sum.
//
// A non-zero Normed [T, D] also receives the next sublayer's pre-norm,
// RMSNorm(H) with NormWeight [D] (the zero Tensor: none) and NormEps,
// with the bits of the backend's RMSNorm: a fused backend normalises each
// row of H while it is in cache instead of reading H back.
type AttnResUpdateArgs struct {
	Partial       Tensor
	HasPartial    bool
	Delta         Tensor
	Query         Tensor // [D], fused w·g
	Eps           float32
	Num, Max, Sum Tensor
	H             Tensor

	Normed, NormWeight Tensor
	NormEps            float32
}

// RouteArgs: sigmoid scores of Logits [T, E], plus Bias [E] for selection
// only; group-limited top-k; weights from the unbiased scores, optionally
// renormalised, times Scale. Indices [T, TopK] I32 and Weights [T, TopK].
type RouteArgs struct {
	Logits, Bias         Tensor
	TopK                 int
	NumGroups, TopKGroup int
	Renormalize          bool
	Scale                float32
	Indices, Weights     Tensor
}

// CheckGroups checks the routing parameters against e experts and returns
// the group count and the groups kept (each at least 1). Every backend
// applies the same rules.
func (a *RouteArgs) CheckGroups(e int) (groups, kept int, err error) {
	k, g, kg := a.TopK, max(a.NumGroups, 1), max(a.TopKGroup, 1)
	switch {
	case k <= 0 || k > e:
		err = fmt.Errorf("router: top_k %d outside 1..%d experts", k, e)
	case e%g != 0:
		err = fmt.Errorf("router: num_expert_group %d does not divide %d experts", g, e)
	case kg > g:
		err = fmt.Errorf("router: topk_group %d > num_expert_group %d", kg, g)
	case g > 1 && e/g < 2:
		err = fmt.Errorf("router: groups of %d experts (need 2 for the group score)", e/g)
	case k > kg*(e/g):
		err = fmt.Errorf("router: top_k %d exceeds the %d experts of topk_group groups", k, kg*(e/g))
	}
	return g, kg, err
}

// ExpertArgs: Out [T, Din] = Σ_k Weights[t,k] · expert_{Indices[t,k]}(X[t])
// with expert e(x) = (act(x W1[e]ᵀ) * (x W3[e]ᵀ)) W2[e]ᵀ; W1[e], W3[e]
// [I, Din], W2[e] [Din, I]. Out is overwritten. A slot whose index is
// -1 adds nothing (an expert another rank holds, under expert
// parallelism).
type ExpertArgs struct {
	X                Tensor
	Indices, Weights Tensor
	W1, W3, W2       []Tensor
	Act              Activation
	Out              Tensor
}

// RopeArgs: X [T, ...] is rotated in place; every row of its last
// dimension (D wide) rotates its first Dims entries (0: all D) by the
// angles Pos[t]·Theta^(-2i/Dims), pairing (2i, 2i+1) when Interleaved (MLA)
// or (i, i+Dims/2) otherwise (the Lightning Indexer's layout). Pos [T]
// (I32) is a tensor of the backend with one position per first-dimension
// row, each in [0, MaxPos): the positions stay on the device (a captured
// step reads the ones written before its replay), and MaxPos, which the
// caller knows from its cache, sizes a device's table of angles.
type RopeArgs struct {
	X           Tensor
	Pos         Tensor
	MaxPos      int
	Dims        int
	Theta       float64
	Interleaved bool
	// Freqs, when set, replaces Theta: the angle of pair i is Pos[t]·Freqs[i]
	// (YaRN-scaled frequencies). Scale, when not 0, multiplies cos and sin.
	Freqs []float64
	Scale float64
}

// Angle is the rotation angle of pair i at position pos, rotating r dims
// (Dims, or the row width when Dims is 0): every backend computes the
// same float64 before rounding its cos and sin.
func (a *RopeArgs) Angle(pos int32, i, r int) float64 {
	if a.Freqs != nil {
		return float64(pos) * a.Freqs[i]
	}
	return float64(pos) * math.Pow(a.Theta, -2*float64(i)/float64(r))
}
