package k3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"maps"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"sync"

	"k3/attnres"
	"k3/compute"
	"k3/config"
	"k3/dsa"
	"k3/internal/backends"
	"k3/internal/moe"
	"k3/internal/safetensors"
	"k3/internal/tokenizer"
	"k3/internal/weights"
	"k3/kda"
	"k3/specdec"
)

// kdaPrefillChunk is the chunk size of KDA prefill: the chunked (WY) form,
// which on the go backend is at least as fast as the token-by-token
// recurrence (docs/bench/README.md, "KDA prefill chunk"). Chunk 64 (its
// local stage in blocks of 16) is slower: the longer state products gain
// less than the blocks below the diagonal and the larger Mqk·U cost.
const kdaPrefillChunk = 16

// ErrCheckpoint is wrapped by every error about a checkpoint's files other
// than config.json (which wraps ErrInvalidConfig): missing, unexpected or
// mis-shaped tensors, unusable dtypes, malformed or truncated safetensors
// files, missing shards, malformed tokenizer files, and a tokenizer that
// does not fit the config's vocabulary.
var ErrCheckpoint = errors.New("k3: bad checkpoint")

// badCheckpoint wraps a loading error with ErrCheckpoint (once).
func badCheckpoint(err error) error {
	if err == nil || errors.Is(err, ErrCheckpoint) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrCheckpoint, err)
}

// tokenizerErr names config.json beside the tokenizer file when the two
// disagree about the vocabulary.
func tokenizerErr(dir string, vocab int, err error) error {
	if errors.Is(err, tokenizer.ErrVocabMismatch) {
		return fmt.Errorf("%w: config/tokenizer mismatch: %s gives vocab_size %d: %w", ErrCheckpoint, path.Join(dir, "config.json"), vocab, err)
	}
	return badCheckpoint(err)
}

// Option configures Load.
type Option func(*options)

type options struct {
	backend  string
	bopts    backends.Options
	be       compute.Backend
	progress func(done, total int64)
	chunk    int
	dense    bool
	rollback int
	eager    bool

	snapInterval, snapKeep int
	prefixBytes            int64
	budget                 int64

	par *rankPar // LoadGroup: the rank this model is
}

// WithDenseAttention runs DSA layers as dense MLA: every query attends to
// every earlier position and the Lightning Indexer is skipped (its weights
// are still checked). For comparisons; K3.1 Pro was trained sparse.
func WithDenseAttention() Option { return func(o *options) { o.dense = true } }

// WithoutGraphs runs every operation eagerly on a backend that captures
// graphs (ascend), instead of capturing the feed-forward sublayers of
// decode passes once per row count and replaying them (see GraphStats).
func WithoutGraphs() Option { return func(o *options) { o.eager = true } }

// WithBackend selects the compute backend by name: "go" (the default),
// "go-fastbf16" (the Go backend with its bf16-weight products rounding x
// to bfloat16 on the CPU's bf16 dot product where that pays: faster, not
// exact; a session's results still do not depend on its batch), "ascend"
// or "ascend-host".
func WithBackend(name string) Option { return func(o *options) { o.backend = name } }

// BackendOptions carries what a device backend needs beyond its name (the
// Go backends ignore them, but for FusedAttention on go-fastbf16).
type BackendOptions struct {
	// Device is the accelerator index; a Group's rank r uses Device+r.
	Device int
	// LibDirs are searched for the vendor's runtime libraries (for
	// ascend: libascendcl.so and friends) before the loader's path.
	LibDirs []string
	// MemoryBytes is the device memory the backend takes at open (0: its
	// default).
	MemoryBytes int
	// HostFallback runs the operations a device backend has not mapped on
	// the host, slowly, instead of failing with them.
	HostFallback bool
	// FusedAttention lets a backend run DSA in bf16: on Ascend its fused
	// operators (aclnnLightningIndexer and aclnnSparseFlashAttention) over
	// bf16 copies of the caches (ascend.Options.FusedAttention); on
	// go-fastbf16, where its products take the bf16 dot product, the
	// Lightning Indexer's scores and index-sparse attention's logits and
	// values over operands rounded to bf16 as they are used (the caches
	// stay float32). Faster, not exact: near-tied top-K choices may change and
	// attention outputs move by the rounding. The exact go backend ignores
	// it.
	FusedAttention bool
}

// WithBackendOptions sets the options of the backend WithBackend names.
func WithBackendOptions(bo BackendOptions) Option {
	return func(o *options) {
		o.bopts = backends.Options{Device: bo.Device, LibDirs: bo.LibDirs, MemoryBytes: bo.MemoryBytes, HostFallback: bo.HostFallback,
			FusedAttention: bo.FusedAttention}
	}
}

// WithProgress receives, after each layer, the bytes of checkpoint tensors
// read so far (mapped in place or copied) and the checkpoint's total, so a
// large checkpoint's progress moves with the work. The last call has
// done == total.
func WithProgress(f func(done, total int64)) Option { return func(o *options) { o.progress = f } }

// WithPrefillChunk sets how many prompt tokens one forward pass takes at
// most (default 512): longer prompts run in chunks, bounding memory. A
// Batcher's default token budget carries a whole chunk beside its
// sequences, so a smaller chunk (or WithTokenBudget) also shortens the
// passes that carry a prompt beside running streams.
func WithPrefillChunk(n int) Option { return func(o *options) { o.chunk = n } }

// Model is a loaded checkpoint. It is safe for concurrent use by many
// sessions; each Session holds one sequence's state.
type Model struct {
	Config *Config
	b      compute.Backend
	ownB   bool
	ck     *safetensors.Checkpoint
	fpOnce sync.Once // fingerprint, for saved sessions

	grammarOnce sync.Once // the grammar options' tables (grammar)
	grammarT    *grammarTables

	toolTextOnce  sync.Once // WithOptionalToolCalls' free-text mask (toolTextTables)
	toolText      []bool
	toolTextTrial []int32
	toolTextEnd   []int32

	fp    [32]byte
	chunk int

	embed, norm, lmHead compute.Tensor
	layers              []*layer
	// AttnRes: fused queries of every sublayer [2L, D] and the output's [D].
	resQueries, outQuery compute.Tensor
	act                  compute.Activation
	tok                  tokenizer.Tokenizer
	graphs               *graphs      // decode graphs on a capturing backend, or nil
	slabs                *slabs       // KDA states in slabs, with graphs
	free                 freeStates   // closed sessions' KDA states for new ones, without slabs
	pads                 []*Session   // padding sessions of whole steps (Batch.pad), under graphs.mu
	dense                bool         // run DSA layers densely
	rollback             int          // tokens back the sessions' replay logs reach (0: no logs)
	snapInterval         int          // tokens between the sessions' state snapshots (0: none)
	snapKeep             int          // snapshots a session keeps
	prefix               *prefixCache // nil without WithPrefixCache
	mem                  ledger       // all sequence state against WithMemoryBudget

	wsMu   sync.Mutex
	wsFree []*workspace // scratch for session runs, lent one per run
	// views are the early-exit views of the first n layers made so far
	// (self-speculative drafters), kept so that every drafter of one
	// depth shares a view's workspaces instead of allocating its own.
	viewsMu sync.Mutex
	views   map[int]*Model

	specMu    sync.Mutex
	specCosts specdec.Costs         // SpeculationCosts, measured once
	specBatch map[int]specdec.Costs // SpeculationCostsAt, by power-of-two batch

	life life // open operations, for Close

	draft *dsparkWeights // the checkpoint's DSpark draft module, nil without one

	par  *rankPar // nil unless the model is one rank of a Group
	held int64    // bytes of checkpoint tensors loaded (ShardBytes)
}

// layer holds one decoder layer's weights.
type layer struct {
	kind              config.LayerKind
	attnNorm, mlpNorm compute.Tensor
	kda               *compute.KDAWeights
	kdaCfg            kda.Config
	mla               *dsa.Weights
	mlaCfg            dsa.Config
	pages             *dsa.Pool // the layer's cache pages, shared by its sessions
	mlp               *moe.MLP
	moe               *moe.Weights
	router            moe.Router
}

// Load reads a checkpoint directory: config.json and the safetensors
// weights (one file or shards with model.safetensors.index.json; F32, BF16,
// F16, fp8 with DeepSeek's block scales or compressed-tensors' row or
// tensor scales, and compressed-tensors MXFP4, which load as bf16; see
// docs/ARCHITECTURE.md, "Quantised weights"). Weights used in their stored
// dtype are mapped, not copied. Every expected tensor must be present with
// its shape, and no unexpected tensor may be left over.
func Load(ctx context.Context, dir string, opts ...Option) (*Model, error) {
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s is a file; want the checkpoint's directory (config.json and the weights)", ErrCheckpoint, dir)
	}
	cfg, err := config.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("k3: %w", err)
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return nil, badCheckpoint(err)
	}
	tok, err := tokenizer.Load(dir, cfg.VocabSize)
	if err != nil {
		ck.Close()
		return nil, tokenizerErr(dir, cfg.VocabSize, err)
	}
	return newModel(ctx, cfg, ck, tok, opts)
}

// LoadFS reads a checkpoint from a file system (for instance one embedded
// in the program), reading the weights into memory. name labels errors.
func LoadFS(ctx context.Context, fsys fs.FS, name string, opts ...Option) (*Model, error) {
	raw, err := fs.ReadFile(fsys, "config.json")
	if err != nil {
		return nil, fmt.Errorf("k3: %s: %w", name, err)
	}
	cfg, err := config.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("k3: %s/config.json: %w", name, err)
	}
	shards := []string{"model.safetensors"}
	if idx, err := fs.ReadFile(fsys, safetensors.IndexName); err == nil {
		var m struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(idx, &m); err != nil {
			return nil, fmt.Errorf("%w: %s/%s: %w", ErrCheckpoint, name, safetensors.IndexName, err)
		}
		if len(m.WeightMap) == 0 {
			return nil, fmt.Errorf("%w: %s/%s: empty weight_map", ErrCheckpoint, name, safetensors.IndexName)
		}
		seen := map[string]bool{}
		shards = shards[:0]
		for _, f := range m.WeightMap {
			if !seen[f] {
				seen[f] = true
				shards = append(shards, f)
			}
		}
		sort.Strings(shards)
	}
	var files []*safetensors.File
	for _, sh := range shards {
		b, err := fs.ReadFile(fsys, sh)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: shard %s: %w", ErrCheckpoint, name, sh, err)
		}
		f, err := safetensors.FromBytes(name+"/"+sh, b)
		if err != nil {
			return nil, badCheckpoint(err)
		}
		files = append(files, f)
	}
	ck, err := safetensors.NewCheckpoint(name, files...)
	if err != nil {
		return nil, badCheckpoint(err)
	}
	tok, err := tokenizer.LoadFS(fsys, name, cfg.VocabSize)
	if err != nil {
		return nil, tokenizerErr(name, cfg.VocabSize, err)
	}
	return newModel(ctx, cfg, ck, tok, opts)
}

func newModel(ctx context.Context, cfg *config.Config, ck *safetensors.Checkpoint, tok tokenizer.Tokenizer, opts []Option) (*Model, error) {
	o := options{backend: "go", chunk: 512}
	for _, f := range opts {
		f(&o)
	}
	if o.chunk <= 0 {
		ck.Close()
		return nil, fmt.Errorf("k3: prefill chunk %d must be positive", o.chunk)
	}
	if o.rollback < 0 {
		ck.Close()
		return nil, fmt.Errorf("k3: rollback depth %d must not be negative", o.rollback)
	}
	if o.snapInterval < 0 || (o.snapInterval > 0 && o.snapKeep < 1) {
		ck.Close()
		return nil, fmt.Errorf("k3: snapshots every %d tokens, keeping %d: want a positive interval and count, or interval 0", o.snapInterval, o.snapKeep)
	}
	if o.budget < 0 {
		ck.Close()
		return nil, fmt.Errorf("k3: memory budget of %d bytes", o.budget)
	}
	if o.prefixBytes < 0 {
		ck.Close()
		return nil, fmt.Errorf("k3: prefix cache of %d bytes", o.prefixBytes)
	}
	m := &Model{Config: cfg, ck: ck, chunk: o.chunk, b: o.be, tok: tok, dense: o.dense, rollback: o.rollback,
		snapInterval: o.snapInterval, snapKeep: o.snapKeep, par: o.par}
	m.mem.budget = o.budget
	if o.prefixBytes > 0 {
		m.prefix = newPrefixCache(o.prefixBytes, &m.mem)
	}
	m.mem.spare = m.spare
	m.life.init()
	if m.b == nil {
		var err error
		if m.b, err = backends.OpenWith(o.backend, o.bopts); err != nil {
			ck.Close()
			return nil, fmt.Errorf("k3: %w", err)
		}
		m.ownB = true
	}
	if err := m.load(ctx, o.progress); err != nil {
		m.Close()
		return nil, err
	}
	if !o.eager && m.par == nil {
		m.graphs = newGraphs(m.b)
		m.slabs = newSlabs(m)
		if m.graphs != nil {
			for _, ly := range m.layers {
				if ly.pages != nil {
					ly.pages.Slabs = pageSlab
				}
			}
		}
	}
	return m, nil
}

// Close releases the weights' mapping and the backend. It waits for the
// forward passes already running, then every operation on the model (and
// every generation still streaming, within one decode step or prefill
// chunk) fails with ErrClosed. Close is idempotent: later calls return nil.
func (m *Model) Close() error {
	if !m.life.shut() {
		return nil
	}
	m.graphs.close()
	for _, s := range m.pads {
		s.Close()
	}
	if m.slabs != nil {
		m.slabs.close()
	}
	m.free.close(m)
	var err error
	if m.ownB && m.b != nil {
		err = m.b.Close()
	}
	if m.ck != nil {
		if cerr := m.ck.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// source serves checkpoint tensors relative to a prefix, records what was
// used, and dequantises fp8 and MXFP4 weights (quant.go).
type source struct {
	ck    *safetensors.Checkpoint
	strip string // "language_model." for Kimi K3 checkpoints
	used  map[string]bool

	usedBytes, total int64  // for WithProgress
	held             *int64 // bytes served, when loading is not cut by a layout
}

func (s *source) markUsed(name string, size int64) {
	if !s.used[name] {
		s.used[name] = true
		s.usedBytes += size
	}
}

func (s *source) name(n string) string { return s.strip + n }

// skip marks a tensor (name relative to the strip prefix) used without
// reading it: another rank holds it. A missing one is left for the
// holder to report.
func (s *source) skip(full string) {
	name := s.name(full)
	for _, n := range append([]string{name}, companions(name)...) {
		if _, ti, err := s.ck.Bytes(n); err == nil {
			s.markUsed(n, ti.Size)
		}
	}
}

// cut serves src's tensors as this rank's parts (rules, when the model
// is a rank of a Group), counting the bytes served.
func (m *Model) cut(src weights.Source, rules map[string]cutRule) weights.Source {
	if m.par == nil {
		return src
	}
	return cutSource(src, rules, &m.held)
}

// get serves a tensor as the model holds it, counting its bytes (those of
// the bf16 copy for a quantised one) in s.held.
func (s *source) get(full string) (compute.DType, []int, []byte, error) {
	dt, shape, data, err := s.read(s.name(full))
	if err == nil && s.held != nil {
		*s.held += int64(len(data))
	}
	return dt, shape, data, err
}

func (s *source) read(name string) (compute.DType, []int, []byte, error) {
	data, ti, err := s.ck.Bytes(name)
	if err != nil {
		if base, ok := strings.CutSuffix(name, ".weight"); ok {
			if _, _, err := s.ck.Bytes(base + ".weight_packed"); err == nil {
				return s.unpackFP4(base)
			}
		}
		return 0, nil, nil, fmt.Errorf("missing tensor %s", name)
	}
	s.markUsed(name, ti.Size)
	switch ti.DType {
	case safetensors.F32:
		return compute.F32, ti.Shape, data, nil
	case safetensors.BF16:
		return compute.BF16, ti.Shape, data, nil
	case safetensors.F16:
		return compute.F16, ti.Shape, data, nil
	case safetensors.F8E4M3:
		return s.dequantE4M3(name, ti, data)
	}
	return 0, nil, nil, fmt.Errorf("tensor %s has dtype %s, which k3 cannot use", name, ti.DType)
}

// release drops the mapped pages of tensors (names relative to prefix)
// that loading only copied; the copies are what the model reads. Names the
// checkpoint lacks are skipped.
func (s *source) release(prefix string, names ...string) {
	for _, n := range names {
		s.ck.Release(s.name(prefix + n))
	}
}

func (s *source) prefixed(prefix string) weights.Source {
	return func(name string) (compute.DType, []int, []byte, error) { return s.get(prefix + name) }
}

func (m *Model) load(ctx context.Context, progress func(done, total int64)) error {
	cfg := m.Config
	src := &source{ck: m.ck, used: map[string]bool{}, total: m.WeightBytes()}
	if m.par == nil {
		src.held = &m.held
	}
	// Kimi K3 checkpoints prefix the text model's tensors.
	for _, name := range m.ck.Names() {
		if strings.HasPrefix(name, "language_model.") {
			src.strip = "language_model."
			break
		}
	}
	// Beside it a multimodal checkpoint holds its vision encoder and
	// projector, which k3 does not run: they count as used, unread (and
	// never paged in).
	if src.strip != "" && cfg.Vision {
		for _, name := range m.ck.Names() {
			if !strings.HasPrefix(name, src.strip) {
				t, _, _ := m.ck.Tensor(name)
				src.markUsed(name, t.Size)
			}
		}
	}
	d, v := cfg.HiddenSize, cfg.VocabSize
	// A TP rank holds a slice of the vocabulary: its rows of the embedding
	// and of lm_head (vocabulary parallelism).
	var vocab map[string]cutRule
	vr := v
	if p := m.par; p != nil && p.layout.TP > 1 {
		lo, hi, _ := part(v, p.layout.TP, p.tpIndex())
		r := cutRule{block: 1, lo: lo, hi: hi}
		vocab = map[string]cutRule{"model.embed_tokens.weight": r, "lm_head.weight": r}
		p.vocabLo, p.vocabHi, vr = lo, hi, hi-lo
	}
	top := &weights.Loader{B: m.b, Src: m.cut(src.prefixed(""), vocab), Prefix: src.strip}
	m.embed = top.Matrix("model.embed_tokens.weight", vr, d)
	m.norm = top.F32("model.norm.weight", d)
	if cfg.TieWordEmbeddings {
		m.lmHead = m.embed
	} else {
		m.lmHead = top.Linear("lm_head.weight", vr, d)
	}
	m.act = compute.Activation{Kind: compute.SwiGLU}
	if cfg.HiddenAct == "situ" {
		m.act = compute.Activation{Kind: compute.SiTU, Beta: float32(cfg.SiTUBeta), LinearBeta: float32(cfg.SiTULinearBeta)}
	}
	var resQ []float32
	if cfg.AttnResBlockSize > 0 {
		w := top.Host("model.output_attn_res_proj.weight", d)
		g := top.Host("model.output_attn_res_norm.weight", d)
		if top.Err == nil {
			q := make([]float32, d)
			attnres.FuseQuery(q, w, g)
			m.outQuery = top.Upload(q, d)
		}
		// resQ grows as layers load: sizing it from the config up front
		// would allocate before any tensor has confirmed the config.
	}
	if top.Err != nil {
		return fmt.Errorf("%w: %s: %w", ErrCheckpoint, m.ck.Dir, top.Err)
	}
	for l := range cfg.Layers {
		if err := ctx.Err(); err != nil {
			return err
		}
		ly, q, err := m.loadLayer(src, l)
		if err != nil {
			return fmt.Errorf("%w: %s: layer %d: %w", ErrCheckpoint, m.ck.Dir, l, err)
		}
		m.layers = append(m.layers, ly)
		resQ = append(resQ, q...)
		if progress != nil {
			progress(src.usedBytes, src.total)
		}
	}
	if cfg.AttnResBlockSize > 0 {
		ld := &weights.Loader{B: m.b}
		m.resQueries = ld.Upload(resQ, 2*cfg.NumLayers, d)
		if ld.Err != nil {
			return ld.Err
		}
	}
	if d := cfg.Draft; d != nil && m.par == nil {
		var err error
		if m.draft, err = loadDSpark(m, src, d); err != nil {
			return fmt.Errorf("%w: %s: draft module: %w", ErrCheckpoint, m.ck.Dir, err)
		}
	}
	var extra []string
	for _, name := range m.ck.Names() {
		// A rank of a Group leaves the draft module alone (it drafts on
		// one model only).
		if d := cfg.Draft; d != nil && m.par != nil && strings.HasPrefix(name, src.name(d.TensorPrefix)) {
			continue
		}
		if !src.used[name] {
			extra = append(extra, name)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		if len(extra) > 5 {
			extra = append(extra[:5], fmt.Sprintf("and %d more", len(extra)-5))
		}
		return fmt.Errorf("%w: %s: unexpected tensors %s", ErrCheckpoint, m.ck.Dir, strings.Join(extra, ", "))
	}
	releaseUnread(m.ck, m.b, maps.Keys(src.used))
	return nil
}

// releaseUnread releases the mapped pages of the named tensors that no
// tensor of b reads any more: weights b laid out anew (k-major panels,
// AMX tiles), so that the process does not keep both forms resident. A
// backend that cannot tell (not a compute.HostReader) keeps them all.
func releaseUnread(ck *safetensors.Checkpoint, b compute.Backend, names iter.Seq[string]) {
	hr, ok := b.(compute.HostReader)
	if !ok {
		return
	}
	// The tensors loading replaced are unreachable now; a collection makes
	// them count as gone.
	runtime.GC()
	for name := range names {
		if data := ck.Mapped(name); data != nil && !hr.ReadsHost(data) {
			ck.Release(name)
		}
	}
}

func (m *Model) loadLayer(src *source, l int) (*layer, []float32, error) {
	cfg := m.Config
	d := cfg.HiddenSize
	prefix := fmt.Sprintf("model.layers.%d.", l)
	ld := &weights.Loader{B: m.b, Src: m.cut(src.prefixed(prefix), nil), Prefix: src.strip + prefix}
	ly := &layer{kind: cfg.Layers[l]}
	ly.attnNorm = ld.F32("input_layernorm.weight", d)
	ly.mlpNorm = ld.F32("post_attention_layernorm.weight", d)
	var resQ []float32
	if cfg.AttnResBlockSize > 0 {
		for _, side := range []string{"self_attention_res", "mlp_res"} {
			w := ld.Host(side+"_proj.weight", d)
			g := ld.Host(side+"_norm.weight", d)
			if ld.Err == nil {
				q := make([]float32, d)
				attnres.FuseQuery(q, w, g)
				resQ = append(resQ, q...)
			}
		}
	}
	if ld.Err != nil {
		return nil, nil, ld.Err
	}
	attn := src.prefixed(prefix + "self_attn.")
	var err error
	switch ly.kind {
	case config.KDA:
		k := cfg.KDA
		heads := k.NumHeads
		if p := m.par; p != nil {
			lo, hi, dup := part(k.NumHeads, p.layout.TP, p.tpIndex())
			attn, heads = m.cut(attn, kdaRules(k.NumHeads, k.HeadDim, lo, hi, dup)), hi-lo
		} else {
			attn = m.cut(attn, nil)
		}
		ly.kdaCfg = kda.Config{Hidden: d, NumHeads: heads, HeadDim: k.HeadDim, ConvKernel: k.ConvKernel,
			FullRankGate: k.FullRankGate, Eps: float32(cfg.RMSNormEps), ChunkSize: kdaPrefillChunk}
		if k.GateLowerBound != nil {
			ly.kdaCfg.LowerBound = float32(*k.GateLowerBound)
		}
		if ly.kda, err = kda.LoadWeights(m.b, ly.kdaCfg, attn); err != nil {
			return nil, nil, err
		}
		src.release(prefix+"self_attn.", kda.CopiedTensors[:]...)
	default:
		c := cfg.MLA
		heads := c.NumHeads
		ixHeads := 0
		if cfg.Indexer != nil {
			ixHeads = cfg.Indexer.NumHeads
		}
		if p := m.par; p != nil {
			lo, hi, dup := part(c.NumHeads, p.layout.TP, p.tpIndex())
			rules := mlaRules(c, lo, hi, dup)
			if ly.kind == config.DSA && p.splitIndexer() {
				lo, hi, dup := part(ixHeads, p.layout.TP, p.tpIndex())
				maps.Copy(rules, indexerRules(cfg.Indexer.HeadDim, lo, hi, dup))
				ixHeads = hi - lo
			}
			attn, heads = m.cut(attn, rules), hi-lo
		} else {
			attn = m.cut(attn, nil)
		}
		ly.mlaCfg = dsa.Config{Hidden: d, NumHeads: heads, QLoRARank: c.QLoRARank, KVLoRARank: c.KVLoRARank,
			NopeDim: c.QKNopeHeadDim, RopeDim: c.QKRopeHeadDim, VDim: c.VHeadDim, NoPE: c.UseNoPE, OutputGate: c.OutputGate,
			RopeTheta: c.RopeTheta}
		if rs := c.RopeScaling; rs != nil {
			ly.mlaCfg.Yarn = &dsa.Yarn{Factor: rs.Factor, OriginalMaxPositions: rs.OriginalMaxPositionEmbeddings,
				MaxPositions: cfg.MaxPositionEmbeddings, BetaFast: rs.BetaFast, BetaSlow: rs.BetaSlow,
				MScale: rs.MScale, MScaleAllDim: rs.MScaleAllDim}
		}
		if ly.kind == config.DSA {
			ix := cfg.Indexer
			ly.mlaCfg.Indexer = &dsa.IndexerConfig{NumHeads: ixHeads, HeadDim: ix.HeadDim, TopK: ix.TopK, AllHeads: ix.NumHeads}
		}
		if ly.mla, err = dsa.LoadWeights(m.b, ly.mlaCfg, attn); err != nil {
			return nil, nil, err
		}
		src.release(prefix+"self_attn.", dsa.CopiedTensors[:]...)
		if m.dense {
			ly.mlaCfg.Indexer = nil
		}
		ly.pages = dsa.NewPool(m.b, ly.mlaCfg)
		ly.pages.Account = m.mem.add
	}
	if cfg.IsMoELayer(l) {
		ly.moe, ly.router, err = m.loadMoE(src, prefix+"block_sparse_moe.")
	} else {
		ly.mlp, err = m.loadMLP(src, prefix+"mlp.", "gate_proj.weight", "up_proj.weight", "down_proj.weight", cfg.IntermediateSize, false)
	}
	if err != nil {
		return nil, nil, err
	}
	return ly, resQ, nil
}

// loadMLP loads a gated MLP of width inter: under a layout, a dense
// layer's MLP splits over the rank's TP group and the shared experts
// (overAll) over every rank, as the MoE sum adds over every rank.
func (m *Model) loadMLP(src *source, prefix, gate, up, down string, inter int, overAll bool) (*moe.MLP, error) {
	d := m.Config.HiddenSize
	var rules map[string]cutRule
	if p := m.par; p != nil && !(overAll && p.layout.Dispatch) {
		// Under Dispatch each rank runs the shared experts whole, on its
		// own rows.
		ranks, i := p.layout.TP, p.tpIndex()
		if overAll {
			ranks, i = p.layout.Ranks(), p.rank
		}
		rules, inter = mlpRules(inter, ranks, i, "gate_proj.weight", "up_proj.weight", "down_proj.weight")
	}
	ld := &weights.Loader{B: m.b, Src: m.cut(src.prefixed(prefix), rules), Prefix: src.strip + prefix}
	mlp := &moe.MLP{Act: m.act}
	mlp.Gate = ld.Linear(gate, inter, d)
	mlp.Up = ld.Linear(up, inter, d)
	mlp.Down = ld.Linear(down, d, inter)
	return mlp, ld.Err
}

func (m *Model) loadMoE(src *source, prefix string) (*moe.Weights, moe.Router, error) {
	cfg := m.Config
	mc := cfg.MoE
	d := cfg.HiddenSize
	ld := &weights.Loader{B: m.b, Src: m.cut(src.prefixed(prefix), nil), Prefix: src.strip + prefix}
	w := &moe.Weights{Act: m.act, Eps: float32(cfg.RMSNormEps)}
	w.Gate = ld.Linear("gate.weight", mc.NumExperts, d)
	w.Bias = ld.F32("gate.e_score_correction_bias", mc.NumExperts)
	din := d
	if mc.LatentSize > 0 {
		din = mc.LatentSize
		w.LatentDown = ld.Linear("routed_expert_down_proj.weight", din, d)
		if mc.LatentNorm {
			w.LatentNorm = ld.F32("routed_expert_norm.weight", din)
		}
		w.LatentUp = ld.Linear("routed_expert_up_proj.weight", d, din)
	}
	// The loop stops at the first bad tensor: the expert count is the
	// config's word until the checkpoint confirms it.
	lo, hi := 0, mc.NumExperts
	if m.par != nil {
		lo, hi = m.par.experts(mc.NumExperts)
		w.First = lo
		// The other ranks' experts count as used without being read.
		for e := 0; e < mc.NumExperts; e++ {
			if e < lo || e >= hi {
				for _, n := range []string{"w1", "w3", "w2"} {
					src.skip(fmt.Sprintf("%sexperts.%d.%s.weight", prefix, e, n))
				}
			}
		}
	}
	inter := mc.IntermediateSize
	if m.par != nil {
		// Each expert's columns split over the ranks that share its
		// expert-parallel index.
		ranks, i := m.par.expertColumns()
		rules := map[string]cutRule{}
		for e := lo; e < hi; e++ {
			p := fmt.Sprintf("experts.%d.", e)
			var r map[string]cutRule
			r, inter = mlpRules(mc.IntermediateSize, ranks, i, p+"w1.weight", p+"w3.weight", p+"w2.weight")
			maps.Copy(rules, r)
		}
		ld.Src = m.cut(src.prefixed(prefix), rules)
	}
	for e := lo; e < hi && ld.Err == nil; e++ {
		p := fmt.Sprintf("experts.%d.", e)
		w.W1 = append(w.W1, ld.Linear(p+"w1.weight", inter, din))
		w.W3 = append(w.W3, ld.Linear(p+"w3.weight", inter, din))
		w.W2 = append(w.W2, ld.Linear(p+"w2.weight", din, inter))
	}
	if ld.Err != nil {
		return nil, moe.Router{}, ld.Err
	}
	if err := compute.PrepareExperts(m.b, w.W1, w.W3, w.W2); err != nil {
		return nil, moe.Router{}, fmt.Errorf("tensors %sexperts.*: %w", ld.Prefix, err)
	}
	if mc.NumShared > 0 {
		sh, err := m.loadMLP(src, prefix+"shared_experts.", "gate_proj.weight", "up_proj.weight", "down_proj.weight", mc.IntermediateSize*mc.NumShared, true)
		if err != nil {
			return nil, moe.Router{}, err
		}
		w.Shared = sh
	}
	r := moe.Router{TopK: mc.TopK, NumGroups: mc.NumGroups, TopKGroup: mc.TopKGroup, Renormalize: mc.Renormalize, Scale: float32(mc.ScalingFactor)}
	return w, r, nil
}

// WithComputeBackend runs the model on b, which the caller owns (Close on
// the model does not close it): a backend from OpenBackend, shared by
// several models, or one that wraps another (k3's per-operation profiler
// wraps the Go backend this way). WithBackend chooses one by name instead.
func WithComputeBackend(b compute.Backend) Option { return func(o *options) { o.be = b } }

// OpenBackend opens a compute backend by name ("go" or "ascend"), for
// WithComputeBackend and for running the layer packages (kda, dsa,
// attnres) directly. The caller closes it.
func OpenBackend(name string) (compute.Backend, error) {
	b, err := backends.Open(name)
	if err != nil {
		return nil, fmt.Errorf("k3: %w", err)
	}
	return b, nil
}
