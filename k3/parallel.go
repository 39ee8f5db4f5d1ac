package k3

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"

	"k3/comm"
	"k3/compute"
	"k3/config"
	"k3/internal/backends"
	"k3/internal/moe"
	"k3/internal/weights"
)

// Layout splits a model over ranks. TP ranks split the attention heads
// (KDA, MLA) and the MLP columns, including the shared experts'; EP ranks
// split the routed experts. The layout has max(TP, EP) ranks, and the
// smaller of the two must divide the larger: TP groups are blocks of TP
// consecutive ranks, each holding the whole attention, and the routed
// experts are spread over ranks 0..EP-1. CP ranks split a sequence's
// positions (context parallelism): each holds the attention keys of its
// positions (see GroupSession) and, with TP, is a TP group of its own
// (TP·CP ranks, CP slice c being ranks c·TP to c·TP+TP-1). Beside CP, EP
// must be the rank count TP·CP: every rank holds whole routed experts
// (E/(TP·CP) of them) and whole shared experts, and the MoE dispatches
// tokens (Dispatch is implied), since ranks of different CP slices hold
// different tokens. Zero means 1.
type Layout struct {
	TP, EP, CP int
	// Serial runs each rank's shared experts after its routed ones
	// instead of beside them (for measuring what the overlap gains).
	Serial bool
	// Dispatch sends each token's routed slots to the experts' ranks and
	// the results back by all-to-all-v (each rank taking a share of the
	// rows, holding whole experts and whole shared experts, and
	// all-gathering the rows after) instead of all-reducing partial sums.
	// It needs EP to be the layout's rank count.
	Dispatch bool
	// SplitIndexer splits the Lightning Indexer's heads over the TP ranks
	// too, as the attention's: each rank scores every visible key with
	// its heads and the TP group all-reduces the [T, L] scores before the
	// top K. By default the indexer is replicated: that all-reduce moves L
	// floats per query row and layer, more than a decode step's other
	// collectives at long contexts (docs/ARCHITECTURE.md). It needs TP > 1.
	SplitIndexer bool
}

func (l Layout) norm() Layout {
	l.TP, l.EP, l.CP = max(l.TP, 1), max(l.EP, 1), max(l.CP, 1)
	if l.CP > 1 && l.EP > 1 {
		l.Dispatch = true
	}
	return l
}

// Ranks is the number of ranks the layout has.
func (l Layout) Ranks() int {
	l = l.norm()
	if l.CP > 1 {
		return l.TP * l.CP
	}
	return max(l.TP, l.EP)
}

func (l Layout) String() string {
	l = l.norm()
	s := fmt.Sprintf("tp%d ep%d", l.TP, l.EP)
	if l.CP > 1 {
		s += fmt.Sprintf(" cp%d", l.CP)
	}
	if l.Dispatch {
		s += " dispatch"
	}
	if l.SplitIndexer {
		s += " split-indexer"
	}
	return s
}

// Validate reports a layout no model can take (a config may refuse more:
// LoadGroup checks both).
func (l Layout) Validate() error {
	if l.TP < 0 || l.EP < 0 || l.CP < 0 {
		return fmt.Errorf("%w: layout %+v: negative rank counts", ErrInvalidOption, l)
	}
	l = l.norm()
	if l.CP > 1 && l.EP == 1 && l.Dispatch {
		return fmt.Errorf("%w: layout %v: dispatch beside CP needs the routed experts spread over every rank (EP %d)", ErrInvalidOption, l, l.TP*l.CP)
	}
	if l.CP > 1 && l.EP > 1 && l.EP != l.TP*l.CP {
		return fmt.Errorf("%w: layout %v: beside CP, EP must be the rank count TP·CP = %d (each rank holding whole experts), not %d",
			ErrInvalidOption, l, l.TP*l.CP, l.EP)
	}
	lo, hi := min(l.TP, l.EP), max(l.TP, l.EP)
	if hi%lo != 0 {
		return fmt.Errorf("%w: layout %v: %d does not divide %d", ErrInvalidOption, l, lo, hi)
	}
	if l.Dispatch && l.EP < l.TP {
		return fmt.Errorf("%w: layout %v: dispatch needs every rank to hold experts (EP %d < TP %d)", ErrInvalidOption, l, l.EP, l.TP)
	}
	if l.SplitIndexer && l.TP == 1 {
		return fmt.Errorf("%w: layout %v: splitting the indexer's heads needs TP ranks", ErrInvalidOption, l)
	}
	return nil
}

// ErrLayoutMismatch is wrapped, beside ErrInvalidOption, by LoadGroup's
// errors about a valid layout that a checkpoint cannot take: expert ranks
// for a model without routed experts, more of them than experts, or more
// TP ranks than vocabulary entries.
var ErrLayoutMismatch = errors.New("layout does not fit the model")

// check reports a layout the config cannot take.
func (l Layout) check(cfg *config.Config) error {
	if err := l.Validate(); err != nil {
		return err
	}
	l = l.norm()
	if l.TP > cfg.VocabSize {
		// Each TP rank holds a slice of the vocabulary (vocabulary
		// parallelism); a slice cannot be empty.
		return fmt.Errorf("%w: %w: layout %v: a vocabulary of %d over %d TP ranks", ErrInvalidOption, ErrLayoutMismatch, l, cfg.VocabSize, l.TP)
	}
	if l.EP > 1 {
		if cfg.MoE == nil || cfg.MoE.NumExperts == 0 {
			return fmt.Errorf("%w: %w: layout %v: the model has no routed experts to split", ErrInvalidOption, ErrLayoutMismatch, l)
		}
		if l.EP > cfg.MoE.NumExperts {
			return fmt.Errorf("%w: %w: layout %v: %d experts over %d ranks", ErrInvalidOption, ErrLayoutMismatch, l, cfg.MoE.NumExperts, l.EP)
		}
	}
	return nil
}

// rankPar is what a model needs to run as one rank of a layout.
type rankPar struct {
	layout     Layout
	rank       int
	numExperts int               // routed experts per MoE layer (for Dispatch's bounds)
	world      comm.Communicator // every rank of the layout
	tp         comm.Communicator // this rank's TP group
	// vocabLo and vocabHi bound the token ids whose embedding and lm_head
	// rows this rank holds (both 0 without vocabulary parallelism).
	vocabLo, vocabHi int
	be               compute.Backend
	// budgeted: the ranks have a memory budget (all the same one), so a
	// reservation may fail and agree votes; without one it cannot.
	budgeted bool
	// vote and voted carry agree's one number (a pass at a time runs on
	// a rank, so one of each serves every pass).
	vote   compute.Tensor
	voted  []float32 // one float
	ballot any       // voted as Write and Read take it, boxed once
}

// groupRefusal is a pass that every rank of a group refused together, before
// any of the pass's collectives (agree): no rank changed, no rank waits,
// so the group need not abort. own says whether this rank's state was
// the one past its budget.
type groupRefusal struct {
	err error
	own bool
}

func (e *groupRefusal) Error() string { return e.err.Error() }
func (e *groupRefusal) Unwrap() error { return e.err }

// agree tells every rank of the world whether this one can run the pass
// it is about to start (err, what reserving the pass's memory returned)
// and learns the same of the others. When any rank cannot, every rank
// returns a groupRefusal (its own error, or ErrMemoryBudget naming another
// rank's) instead of starting the pass: ranks hold shares of unequal size
// (heads that do not divide, a split indexer), so one may pass its budget
// where the others do not, and alone it would leave them waiting in the
// pass's first collective. Every rank of the world reaches agree in every
// pass, which is what makes it a collective like the others.
func (p *rankPar) agree(err error) error {
	if p == nil || !p.budgeted {
		return err
	}
	p.voted[0] = 0
	if err != nil {
		p.voted[0] = 1
	}
	b := p.be
	if werr := b.Write(p.vote, p.ballot); werr != nil {
		return errors.Join(err, werr)
	}
	if cerr := p.world.AllReduce(context.Background(), p.vote); cerr != nil {
		return errors.Join(err, cerr)
	}
	if rerr := b.Read(p.ballot, p.vote); rerr != nil {
		return errors.Join(err, rerr)
	}
	switch {
	case err != nil:
		return &groupRefusal{err: err, own: true}
	case p.voted[0] > 0:
		return &groupRefusal{err: fmt.Errorf("%w: %g other rank(s) of the group would pass their budget in this pass", ErrMemoryBudget, p.voted[0])}
	}
	return nil
}

func (p *rankPar) tpIndex() int { return p.rank % p.layout.TP }

// splitIndexer reports whether the model holds a share of the indexer's
// heads.
func (p *rankPar) splitIndexer() bool { return p != nil && p.layout.SplitIndexer && p.layout.TP > 1 }

// part returns the units [lo, hi) of n that TP rank i of ranks holds:
// with at least as many units as ranks, consecutive blocks; with fewer,
// unit i mod n, which the first rank holding it (i < n) counts and the
// others hold as a duplicate whose contribution to the sum over ranks
// must be zero, so that the sum adds the unit once and exactly. (Weighting
// each holder by one over their count instead rounds the weights unless
// the count is a power of two: see ARCHITECTURE, "Parallel inference".)
func part(n, ranks, i int) (lo, hi int, dup bool) {
	if n >= ranks {
		return i * n / ranks, (i + 1) * n / ranks, false
	}
	return i % n, i%n + 1, i >= n
}

// experts returns the routed experts [lo, hi) this rank holds: those of
// its expert-parallel index, rank mod EP.
func (p *rankPar) experts(e int) (lo, hi int) {
	i := p.rank % p.layout.EP
	return i * e / p.layout.EP, (i + 1) * e / p.layout.EP
}

// expertColumns says how the ranks sharing an expert-parallel index split
// each of its experts' columns: over how many ranks, and this rank's
// place among them.
func (p *rankPar) expertColumns() (ranks, i int) {
	return p.layout.Ranks() / p.layout.EP, p.rank / p.layout.EP
}

// reduceTP adds the TP group's partial sums of t.
func (p *rankPar) reduceTP(t compute.Tensor) error {
	if p == nil || p.layout.TP == 1 {
		return nil
	}
	return p.tp.AllReduce(context.Background(), t)
}

// moeSplit is how this rank runs a MoE layer.
func (p *rankPar) moeSplit() *moe.Split {
	sp := &moe.Split{
		Reduce:  func(t compute.Tensor) error { return p.world.AllReduce(context.Background(), t) },
		Overlap: !p.layout.Serial,
	}
	if p.layout.Dispatch {
		n := p.layout.Ranks()
		d := &moe.Dispatch{Rank: p.rank, Ranks: n,
			AllToAllV: func(dst compute.Tensor, recv []int, src compute.Tensor, send []int) error {
				return p.world.AllToAllV(context.Background(), dst, recv, src, send)
			},
			AllGather: func(dst, src compute.Tensor) error { return p.world.AllGather(context.Background(), dst, src) }}
		for r := range n {
			d.Bounds = append(d.Bounds, r*p.numExperts/n)
		}
		d.Bounds = append(d.Bounds, p.numExperts)
		sp.Dispatch = d
	}
	return sp
}

// cutRule says how a tensor splits over TP ranks: by its first dimension
// (or, with cols, its last) in blocks of block elements per unit (a head,
// or one MLP column), keeping units [lo, hi); zero serves them as zeros
// (a duplicate's output projection: see part).
type cutRule struct {
	cols   bool
	block  int
	lo, hi int
	zero   bool
	flat   int // > 0: the tensor is read as its first flat values (A_log's padding)
}

// cutSource serves src's tensors with the rules applied; held counts the
// bytes of the parts served.
func cutSource(src weights.Source, rules map[string]cutRule, held *int64) weights.Source {
	return func(name string) (compute.DType, []int, []byte, error) {
		dt, shape, data, err := src(name)
		if err != nil {
			return dt, shape, data, err
		}
		r, ok := rules[name]
		if !ok {
			*held += int64(len(data))
			return dt, shape, data, nil
		}
		dt, shape, data, err = r.apply(name, dt, shape, data)
		*held += int64(len(data))
		return dt, shape, data, err
	}
}

func (r cutRule) apply(name string, dt compute.DType, shape []int, data []byte) (compute.DType, []int, []byte, error) {
	es := dt.Size()
	if es == 0 || len(shape) == 0 {
		return dt, shape, data, fmt.Errorf("tensor %s (%v %v) cannot be split over ranks", name, dt, shape)
	}
	if r.flat > 0 {
		n := 1
		for _, s := range shape {
			n *= s
		}
		if n < r.flat {
			return dt, shape, data, fmt.Errorf("tensor %s has shape %v, need at least %d values", name, shape, r.flat)
		}
		shape, data = []int{r.flat}, data[:r.flat*es]
	}
	n := 1
	for _, s := range shape {
		n *= s
	}
	if !r.cols {
		rowElems := n / max(shape[0], 1)
		if shape[0]%r.block != 0 || shape[0] < r.hi*r.block {
			return dt, shape, data, fmt.Errorf("tensor %s has %d rows, which do not hold unit %d of %d rows each", name, shape[0], r.hi-1, r.block)
		}
		out := append([]int{(r.hi - r.lo) * r.block}, shape[1:]...)
		kept := data[r.lo*r.block*rowElems*es : r.hi*r.block*rowElems*es]
		return dt, out, r.zeroed(kept), nil
	}
	if len(shape) != 2 || shape[1]%r.block != 0 || shape[1] < r.hi*r.block {
		return dt, shape, data, fmt.Errorf("tensor %s has shape %v, whose columns do not hold unit %d of %d columns each", name, shape, r.hi-1, r.block)
	}
	rows, cols := shape[0], shape[1]
	w := (r.hi - r.lo) * r.block
	out := make([]byte, 0, rows*w*es)
	for i := range rows {
		row := data[(i*cols+r.lo*r.block)*es : (i*cols+r.hi*r.block)*es]
		out = append(out, row...)
	}
	return dt, []int{rows, w}, r.zeroed(out), nil
}

// zeroed returns data, or zeros in its place under r.zero (all-zero
// bits are +0 in every float format the source serves).
func (r cutRule) zeroed(data []byte) []byte {
	if r.zero {
		return make([]byte, len(data))
	}
	return data
}

// kdaRules cuts a KDA layer's tensors to heads [lo, hi) of dk channels.
func kdaRules(h, dk, lo, hi int, dup bool) map[string]cutRule {
	rows := cutRule{block: dk, lo: lo, hi: hi}
	r := map[string]cutRule{
		"b_proj.weight": {block: 1, lo: lo, hi: hi},
		"A_log":         {block: 1, lo: lo, hi: hi, flat: h},
		"o_proj.weight": {cols: true, block: dk, lo: lo, hi: hi, zero: dup},
	}
	for _, n := range []string{"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_conv1d.weight", "k_conv1d.weight",
		"v_conv1d.weight", "f_b_proj.weight", "g_b_proj.weight", "g_proj.weight", "dt_bias"} {
		r[n] = rows
	}
	return r
}

// indexerRules cuts a DSA layer's indexer to heads [lo, hi) of dim
// channels: the query rows and the head weights (zeros on a duplicate,
// so that the sum of the scores adds a shared head once).
func indexerRules(dim, lo, hi int, dup bool) map[string]cutRule {
	return map[string]cutRule{
		"indexer.wq_b.weight":         {block: dim, lo: lo, hi: hi},
		"indexer.weights_proj.weight": {block: 1, lo: lo, hi: hi, zero: dup},
	}
}

// mlaRules cuts an MLA/DSA layer's tensors to heads [lo, hi); the
// indexer and the low-rank projections stay whole.
func mlaRules(c config.MLAConfig, lo, hi int, dup bool) map[string]cutRule {
	q := cutRule{block: c.QKNopeHeadDim + c.QKRopeHeadDim, lo: lo, hi: hi}
	return map[string]cutRule{
		"q_b_proj.weight":  q,
		"q_proj.weight":    q,
		"kv_b_proj.weight": {block: c.QKNopeHeadDim + c.VHeadDim, lo: lo, hi: hi},
		"g_proj.weight":    {block: c.VHeadDim, lo: lo, hi: hi},
		"o_proj.weight":    {cols: true, block: c.VHeadDim, lo: lo, hi: hi, zero: dup},
	}
}

// mlpRules cuts a gated MLP of width inter (tensors gate, up, down) to
// the columns rank i of ranks holds, and returns that width.
func mlpRules(inter, ranks, i int, gate, up, down string) (map[string]cutRule, int) {
	lo, hi, dup := part(inter, ranks, i)
	return map[string]cutRule{
		gate: {block: 1, lo: lo, hi: hi},
		up:   {block: 1, lo: lo, hi: hi},
		down: {cols: true, block: 1, lo: lo, hi: hi, zero: dup},
	}, hi - lo
}

// ShardBytes is the bytes of checkpoint tensors the model holds: all of
// them, or one rank's part of a Group.
func (m *Model) ShardBytes() int64 { return m.held }

// Group is a model split over ranks by a Layout, each rank a Model on its
// own backend, exchanging partial sums through comm.Local. Its sessions
// run on every rank in lockstep.
type Group struct {
	layout   Layout
	ranks    []*Model
	backends []compute.Backend
	world    []*comm.Local
	tp       [][]*comm.Local
	cp       [][]*comm.Local // CP groups, by TP index: rank c·TP+i is member c of cp[i]
	closeMu  sync.Mutex
	closed   bool
	// pass is held while a session's ranks run a pass: the ranks share
	// the communicators, so two sessions' collectives must not
	// interleave (they would pair one session's partial sums with the
	// other's).
	pass sync.Mutex
}

// LoadGroup loads the checkpoint in dir split by layout: one Model per
// rank, each reading only its part of the weights (WithBackend chooses
// the ranks' backend; WithComputeBackend is refused, since every rank
// needs one of its own). Bad layouts fail with ErrInvalidOption, and so
// does WithPrefixCache, which a group does not have yet.
func LoadGroup(ctx context.Context, dir string, layout Layout, opts ...Option) (*Group, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if o.be != nil {
		return nil, fmt.Errorf("%w: a group opens one backend per rank; use WithBackend, not WithComputeBackend", ErrInvalidOption)
	}
	if o.prefixBytes > 0 {
		// Each rank would keep a cache of its own and resume from it: where
		// the ranks hold shares of unequal size (heads that do not divide),
		// their budgets fill apart, they evict apart, and one rank would
		// resume a prompt where another runs it.
		return nil, fmt.Errorf("%w: WithPrefixCache on a group (not built)", ErrInvalidOption)
	}
	cfg, err := config.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("k3: %w", err)
	}
	if err := layout.check(cfg); err != nil {
		return nil, err
	}
	layout = layout.norm()
	n := layout.Ranks()
	g := &Group{layout: layout}
	for r := range n {
		bo := o.bopts
		bo.Device += r
		b, err := backends.OpenWith(o.backend, bo)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("k3: %w", err)
		}
		g.backends = append(g.backends, b)
	}
	if g.world, err = comm.NewLocal(g.backends); err != nil {
		g.Close()
		return nil, err
	}
	for lo := 0; lo < n; lo += layout.TP {
		tp, err := comm.NewLocal(g.backends[lo : lo+layout.TP])
		if err != nil {
			g.Close()
			return nil, err
		}
		g.tp = append(g.tp, tp)
	}
	if layout.CP > 1 {
		// The ranks sharing a TP index form a CP group.
		for i := range layout.TP {
			var bs []compute.Backend
			for c := range layout.CP {
				bs = append(bs, g.backends[c*layout.TP+i])
			}
			cp, err := comm.NewLocal(bs)
			if err != nil {
				g.Close()
				return nil, err
			}
			g.cp = append(g.cp, cp)
		}
	}
	for r := range n {
		if layout.CP > 1 && layout.TP == 1 && layout.EP == 1 {
			// Every CP rank holds the whole model; the sequence is what splits.
			m, err := Load(ctx, dir, append(append([]Option(nil), opts...), WithComputeBackend(g.backends[r]))...)
			if err != nil {
				g.Close()
				return nil, fmt.Errorf("k3: rank %d of %v: %w", r, layout, err)
			}
			g.ranks = append(g.ranks, m)
			continue
		}
		p := &rankPar{layout: layout, rank: r, world: g.world[r], tp: g.tp[r/layout.TP][r%layout.TP], be: g.backends[r], budgeted: o.budget > 0}
		p.voted = make([]float32, 1)
		p.ballot = p.voted
		if p.vote, err = p.be.Alloc(compute.F32, 1); err != nil {
			g.Close()
			return nil, fmt.Errorf("k3: rank %d of %v: %w", r, layout, err)
		}
		switch {
		case layout.CP > 1 && layout.EP > 1:
			// Every rank holds whole experts, and the MoE dispatches
			// tokens over the world; the dense MLPs split over the TP group.
			p.layout = Layout{TP: layout.TP, EP: layout.EP, Dispatch: true, Serial: layout.Serial, SplitIndexer: layout.SplitIndexer}.norm()
		case layout.CP > 1:
			// A CP slice is a TP group of its own: its ranks hold the same
			// tokens, so the MoE sums over it alone.
			p.layout = Layout{TP: layout.TP, Serial: layout.Serial, SplitIndexer: layout.SplitIndexer}.norm()
			p.rank, p.world = r%layout.TP, p.tp
		}
		if cfg.MoE != nil {
			p.numExperts = cfg.MoE.NumExperts
		}
		rankOpts := append(append([]Option(nil), opts...), WithComputeBackend(g.backends[r]), func(o *options) { o.par = p })
		m, err := Load(ctx, dir, rankOpts...)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("k3: rank %d of %v: %w", r, layout, err)
		}
		g.ranks = append(g.ranks, m)
	}
	return g, nil
}

// Layout is the group's layout.
func (g *Group) Layout() Layout { return g.layout }

// Ranks returns the ranks' models, rank 0 first (for their ShardBytes and
// MemoryUsage; their sessions do not take part in the group's
// collectives).
func (g *Group) Ranks() []*Model { return append([]*Model(nil), g.ranks...) }

// Stats sums the collectives of every rank, in the world and TP groups.
func (g *Group) Stats() comm.Stats {
	var s comm.Stats
	for _, r := range g.world {
		s = s.Add(r.Stats())
	}
	for _, tp := range g.tp {
		for _, r := range tp {
			s = s.Add(r.Stats())
		}
	}
	for _, cp := range g.cp {
		for _, r := range cp {
			s = s.Add(r.Stats())
		}
	}
	return s
}

// abort releases every rank waiting in a collective after one failed.
func (g *Group) abort(err error) {
	for _, r := range g.world {
		r.Abort(err)
	}
	for _, tp := range g.tp {
		for _, r := range tp {
			r.Abort(err)
		}
	}
	for _, cp := range g.cp {
		for _, r := range cp {
			r.Abort(err)
		}
	}
}

// Close closes every rank's model and backend.
func (g *Group) Close() error {
	g.closeMu.Lock()
	defer g.closeMu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	g.abort(ErrClosed)
	var errs []error
	for _, m := range g.ranks {
		errs = append(errs, m.Close())
	}
	for _, b := range g.backends {
		errs = append(errs, b.Close())
	}
	return errors.Join(errs...)
}

// GroupSession is one sequence held by every rank of a Group. Under
// context parallelism (Layout.CP) each rank holds the attention keys of
// its share of the positions and the same KDA states; see cpSeq.
type GroupSession struct {
	g      *Group
	ranks  []*Session
	cp     []*cpSeq
	shell  *Session // CP: rank 0's view of the sequence (tokens, logits) for Generate
	broken error    // CP: a pass failed halfway
}

// NewSession starts an empty sequence on every rank.
func (g *Group) NewSession() (*GroupSession, error) {
	gs := &GroupSession{g: g}
	if g.layout.CP > 1 {
		for r, m := range g.ranks {
			tp := g.layout.TP
			q, err := m.newCPSeq(g.cp[r%tp][r/tp])
			if err != nil {
				gs.Close()
				return nil, err
			}
			gs.cp = append(gs.cp, q)
		}
		gs.shell = &Session{m: g.ranks[0], limit: gs.cp[0].limit}
		return gs, nil
	}
	for _, m := range g.ranks {
		s, err := m.NewSession()
		if err != nil {
			gs.Close()
			return nil, err
		}
		gs.ranks = append(gs.ranks, s)
	}
	return gs, nil
}

// Close closes every rank's session.
func (gs *GroupSession) Close() error {
	for _, q := range gs.cp {
		q.close()
	}
	gs.cp = nil
	var errs []error
	for _, s := range gs.ranks {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// onRanks runs f for every rank's session on its own goroutine (each).
func (gs *GroupSession) onRanks(f func(r int, s *Session) error) error {
	return gs.each(len(gs.ranks), func(r int) error { return f(r, gs.ranks[r]) })
}

// each runs f for ranks 0..n-1, each on its own goroutine; the first
// error aborts the group's collectives, so that no rank waits for one
// that stopped, and is returned.
func (gs *GroupSession) each(n int, f func(r int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[r] = f(r); errs[r] != nil && !groupRefused(errs[r]) {
				gs.g.abort(fmt.Errorf("rank %d: %w", r, errs[r]))
			}
		}()
	}
	wg.Wait()
	return firstCause(errs)
}

// groupRefused reports whether err is a pass every rank refused together
// (agree), which leaves the group as it was.
func groupRefused(err error) bool {
	var r *groupRefusal
	return errors.As(err, &r)
}

// firstCause picks, of the ranks' errors, the one that caused the others:
// a rank's own error rather than the aborts it caused, and of a refusal
// the rank whose budget it was.
func firstCause(errs []error) error {
	for _, err := range errs {
		if err == nil || errors.Is(err, comm.ErrAborted) {
			continue
		}
		if r := (*groupRefusal)(nil); !errors.As(err, &r) || r.own {
			return err
		}
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, comm.ErrAborted) {
			return err
		}
	}
	return errors.Join(errs...)
}

// Forward is Session.Forward on every rank; it returns rank 0's logits,
// which every rank computed bitwise alike. A Trace on ctx records rank 0.
// Bad input (no tokens, a token outside the vocabulary, more than the
// context holds) is refused before any rank runs. A pass that passes
// one rank's memory budget is refused by every rank (ErrMemoryBudget), and
// the sequence and the group stay as they were; any other failure inside
// the ranks' pass (a backend error) aborts the group.
func (gs *GroupSession) Forward(ctx context.Context, tokens []int32) ([]float32, error) {
	if gs.g.layout.CP > 1 {
		tr, _ := ctx.Value(traceKey{}).(*Trace)
		return gs.forwardCP(ctx, tokens, true, tr)
	}
	if err := gs.checkFeed(tokens); err != nil {
		return nil, err
	}
	gs.g.pass.Lock()
	defer gs.g.pass.Unlock()
	var out []float32
	err := gs.onRanks(func(r int, s *Session) error {
		c := ctx
		if r > 0 {
			c = context.WithValue(ctx, traceKey{}, (*Trace)(nil))
		}
		logits, err := s.Forward(c, tokens)
		if r == 0 {
			out = logits
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// checkFeed refuses what every rank would refuse at the start of a
// pass, before any rank starts: each would abort the group's collectives
// for the others (which share the ranks' state), and the group would
// have to be loaded again.
func (gs *GroupSession) checkFeed(tokens []int32) error {
	if err := gs.ranks[0].usable(); err != nil {
		return err
	}
	return gs.ranks[0].checkFeed(tokens)
}

// lead is the session whose tokens and logits stand for the group's:
// rank 0's, or under context parallelism the shell.
func (gs *GroupSession) lead() *Session {
	if gs.shell != nil {
		return gs.shell
	}
	return gs.ranks[0]
}

// Len is the number of tokens the sequence holds.
func (gs *GroupSession) Len() int { return gs.lead().pos }

// Tokens returns a copy of the tokens fed so far.
func (gs *GroupSession) Tokens() []int32 { return gs.lead().Tokens() }

// Logits returns a copy of the next-token logits (every rank holds them
// alike), nil before the sequence holds a token.
func (gs *GroupSession) Logits() []float32 { return gs.lead().Logits() }

// Truncate is Session.Truncate on every rank: it keeps the first n
// tokens, a cursor move within the ranks' rollback depth (WithRollback
// given to LoadGroup). Under context parallelism, which keeps no replay
// logs, the ranks start afresh and run the n tokens again.
func (gs *GroupSession) Truncate(ctx context.Context, n int) error {
	if gs.g.layout.CP > 1 {
		if gs.cp == nil {
			return ErrSessionClosed
		}
		if held := gs.Len(); n < 0 || n > held {
			return fmt.Errorf("%w: truncate to %d tokens, the session holds %d", ErrOutOfRange, n, held)
		}
		keep := slices.Clone(gs.shell.tokens[:n])
		if err := gs.Reset(); err != nil || n == 0 {
			return err
		}
		_, err := gs.forwardCP(ctx, keep, false, nil)
		return err
	}
	if err := gs.ranks[0].usable(); err != nil {
		return err
	}
	// Checked once here: the same error from every rank would abort the
	// group (only a budget refusal is agreed on; see agree).
	if held := gs.Len(); n < 0 || n > held {
		return fmt.Errorf("%w: truncate to %d tokens, the session holds %d", ErrOutOfRange, n, held)
	}
	// A truncation may run a pass, whose collectives need every rank.
	gs.g.pass.Lock()
	defer gs.g.pass.Unlock()
	return gs.onRanks(func(_ int, s *Session) error { return s.Truncate(ctx, n) })
}

// Reset empties the sequence on every rank.
func (gs *GroupSession) Reset() error {
	if gs.g.layout.CP == 1 {
		var errs []error
		for _, s := range gs.ranks {
			errs = append(errs, s.Reset())
		}
		return errors.Join(errs...)
	}
	if gs.cp == nil {
		return ErrSessionClosed
	}
	fresh := make([]*cpSeq, 0, len(gs.cp))
	for r, m := range gs.g.ranks {
		tp := gs.g.layout.TP
		q, err := m.newCPSeq(gs.g.cp[r%tp][r/tp])
		if err != nil {
			for _, q := range fresh {
				q.close()
			}
			return err
		}
		fresh = append(fresh, q)
	}
	for _, q := range gs.cp {
		q.close()
	}
	gs.cp = fresh
	gs.shell.pos, gs.shell.tokens, gs.shell.last = 0, gs.shell.tokens[:0], nil
	gs.broken = nil
	return nil
}

// Fork returns a copy of the sequence on every rank (Session.Fork: the
// attention caches share their full pages), under context parallelism
// too (each rank's share of the keys and the placement copied).
func (gs *GroupSession) Fork() (*GroupSession, error) {
	if gs.g.layout.CP > 1 {
		if gs.cp == nil {
			return nil, ErrSessionClosed
		}
		if gs.broken != nil {
			return nil, fmt.Errorf("k3: cannot fork a failed group session: %w", gs.broken)
		}
		c := &GroupSession{g: gs.g}
		for _, q := range gs.cp {
			f, err := q.fork()
			if err != nil {
				c.Close()
				return nil, err
			}
			c.cp = append(c.cp, f)
		}
		sh := gs.shell
		c.shell = &Session{m: sh.m, limit: sh.limit, pos: sh.pos, tokens: slices.Clone(sh.tokens), last: slices.Clone(sh.last)}
		return c, nil
	}
	c := &GroupSession{g: gs.g}
	for _, s := range gs.ranks {
		f, err := s.Fork()
		if err != nil {
			c.Close()
			return nil, err
		}
		c.ranks = append(c.ranks, f)
	}
	return c, nil
}

// Generate is GenerateTokens with a text prompt, which the model's
// tokenizer encodes as Session.Generate's.
func (gs *GroupSession) Generate(ctx context.Context, prompt string, opts ...GenerateOption) iter.Seq2[Token, error] {
	return gs.GenerateTokens(ctx, gs.g.ranks[0].tok.Encode(prompt, true), opts...)
}

// GenerateTokens is Session.GenerateTokens on every rank in lockstep; the
// stream is rank 0's. Every rank samples the same token from the same
// logits (the seed is part of opts), and when the caller stops reading
// every rank stops at the same token. Options and the prompt are checked
// before any rank starts, so that bad ones leave the group usable.
//
// WithSpeculation speculates at its fixed depth (not under context
// parallelism): every rank calls the drafter with the same history,
// concurrently, so it must be safe for concurrent use and propose the
// same drafts for the same history (specdec.NGram, a DraftModel of a
// model outside the group); each rank verifies them as a session alone
// would, so the tokens are plain decoding's. The adaptive depth, which
// each rank would choose from its own measured costs, and drafters that
// read the session's own state (DSpark, a self-draft) are not supported
// on a group.
func (gs *GroupSession) GenerateTokens(ctx context.Context, prompt []int32, opts ...GenerateOption) iter.Seq2[Token, error] {
	return func(yield func(Token, error) bool) {
		if err := groupSpeculation(opts, gs.g.layout.CP > 1, "a Group (each rank would choose its own from its own costs)"); err != nil {
			yield(Token{}, err)
			return
		}
		if gs.g.layout.CP > 1 {
			gs.generateCP(ctx, prompt, opts, yield)
			return
		}
		// Rank 0 stands for every rank: what it refuses at the start,
		// each would, aborting the group's collectives.
		if _, err := gs.ranks[0].prepareGeneration(prompt, opts); err != nil {
			yield(Token{}, err)
			return
		}
		if len(prompt) > 0 {
			if err := gs.ranks[0].checkFeed(prompt); err != nil {
				yield(Token{}, err)
				return
			}
		}
		n := len(gs.ranks)
		// next[r] carries rank 0's word after each token: go on or stop;
		// ended[r] closes when rank r's generation returned. One advance
		// of a generation may yield several tokens (text held back), so
		// each word waits for its rank rather than queueing.
		// stepped[r] says that rank r holds its next token, so its pass
		// is over: the group's pass lock (one sequence's pass at a time,
		// so that the collectives of two sessions never interleave) is
		// held from the word to go on until every rank has said so.
		next, ended, stepped := make([]chan bool, n), make([]chan struct{}, n), make([]chan struct{}, n)
		for r := 1; r < n; r++ {
			next[r], ended[r], stepped[r] = make(chan bool), make(chan struct{}), make(chan struct{}, 1)
		}
		errs := make([]error, n)
		gs.g.pass.Lock()
		held := true
		release := func() {
			if held {
				gs.g.pass.Unlock()
				held = false
			}
		}
		defer release()
		var wg sync.WaitGroup
		for r := 1; r < n; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer close(ended[r])
				for _, err := range gs.ranks[r].GenerateTokens(context.Background(), prompt, opts...) {
					if err != nil {
						errs[r] = err
						if !groupRefused(err) {
							gs.g.abort(fmt.Errorf("rank %d: %w", r, err))
						}
						return
					}
					stepped[r] <- struct{}{}
					if !<-next[r] {
						return
					}
				}
			}()
		}
		tell := func(goOn bool) {
			for r := 1; r < n; r++ {
				select {
				case next[r] <- goOn:
				case <-ended[r]:
				}
			}
		}
		settled := func() {
			for r := 1; r < n; r++ {
				select {
				case <-stepped[r]:
				case <-ended[r]:
				}
			}
		}
		stopped := false
		for tok, err := range gs.ranks[0].GenerateTokens(ctx, prompt, opts...) {
			if err != nil {
				if !groupRefused(err) {
					gs.g.abort(fmt.Errorf("rank 0: %w", err))
				}
				tell(false)
				wg.Wait()
				release()
				errs[0] = err
				yield(tok, firstCause(errs))
				return
			}
			settled()
			release()
			if !yield(tok, nil) || ctx.Err() != nil {
				// A context that ended while the caller held the token
				// stops every rank here, between passes, rather than
				// inside the next one's collectives. What the ranks do
				// as they stop (drafts rolled back) runs no pass.
				stopped = true
				tell(false)
				wg.Wait()
				if err := ctx.Err(); err != nil && tok.Finish == FinishNone {
					yield(Token{}, err)
				}
				return
			}
			gs.g.pass.Lock()
			held = true
			tell(true)
		}
		// Rank 0's generation ended with its final feed; the others end
		// with theirs.
		if !stopped {
			tell(false)
		}
		wg.Wait()
		release()
		if !stopped {
			for _, err := range errs {
				if err != nil {
					yield(Token{}, err)
					return
				}
			}
		}
	}
}

// groupSpeculation refuses the speculation in opts that a group cannot
// run: any under context parallelism (cp), an adaptive depth (on says
// where, and why), and drafters that read the session's own state.
func groupSpeculation(opts []GenerateOption, cp bool, on string) error {
	var o genOptions
	for _, f := range opts {
		f(&o)
	}
	if o.drafter == nil {
		return nil
	}
	r, ok := o.drafter.(interface{ readsSession() bool })
	switch {
	case cp:
		return fmt.Errorf("%w: speculation under context parallelism", compute.ErrUnsupported)
	case o.adaptive:
		return fmt.Errorf("%w: an adaptive draft depth on %s; use WithSpeculation", compute.ErrUnsupported, on)
	case ok && r.readsSession():
		return fmt.Errorf("%w: a drafter that reads the session's own state (DSpark, a self-draft) on a group", compute.ErrUnsupported)
	}
	return nil
}

// vocabSplit reports whether the model holds a slice of the vocabulary.
func (p *rankPar) vocabSplit() bool { return p != nil && p.vocabHi > p.vocabLo }

// vocab is a pass's scratch for vocabulary parallelism.
type vocab struct {
	zero             compute.Tensor // [1, D] zeros: the embedding of an id another rank holds
	off              []int          // rows of the pass whose ids another rank holds
	local            compute.Tensor // [max, Vr] this rank's logits
	send, all        compute.Tensor // [max·Vpad], [TP·max·Vpad]
	hl, hs, ha, full []float32
}

func newVocab(m *Model, max int) (*vocab, error) {
	p := m.par
	b, d, v := m.b, m.Config.HiddenSize, m.Config.VocabSize
	tp := p.layout.TP
	pad := (v + tp - 1) / tp
	vc := &vocab{}
	var err error
	alloc := func(dims ...int) compute.Tensor {
		if err != nil {
			return compute.Tensor{}
		}
		var t compute.Tensor
		t, err = b.Alloc(compute.F32, dims...)
		return t
	}
	vc.zero = alloc(1, d)
	vc.local = alloc(max, p.vocabHi-p.vocabLo)
	vc.send = alloc(max * pad)
	vc.all = alloc(tp * max * pad)
	return vc, err
}

// embedSplit writes the embeddings of the pass's ids into x from this
// rank's rows (ids rewritten in place to them; zeros for ids another rank
// holds) and adds the other ranks' rows.
func (p *pass) embedSplit(x, ids compute.Tensor) error {
	m, b, vc := p.m, p.m.b, p.vocab
	lo, hi := int32(m.par.vocabLo), int32(m.par.vocabHi)
	vc.off = vc.off[:0]
	for i, id := range p.idsHost {
		if id >= lo && id < hi {
			p.idsHost[i] = id - lo
		} else {
			p.idsHost[i] = 0
			vc.off = append(vc.off, i)
		}
	}
	if err := b.Write(ids, &p.idsHost); err != nil {
		return err
	}
	if err := b.Embedding(x, m.embed, ids); err != nil {
		return err
	}
	for _, i := range vc.off {
		if err := b.Copy(x.Rows(i, i+1), vc.zero); err != nil {
			return err
		}
	}
	return m.par.reduceTP(x)
}

// head writes dst [rows, V] = src · lm_headᵀ: under vocabulary
// parallelism, this rank's slice of the vocabulary, then every TP rank's
// slice gathered.
func (p *pass) head(dst, src compute.Tensor) error {
	m, b := p.m, p.m.b
	if p.vocab == nil {
		return b.MatMul(dst, src, m.lmHead)
	}
	vc, par := p.vocab, m.par
	rows, v, tp := src.Dim(0), m.Config.VocabSize, par.layout.TP
	vr, pad := par.vocabHi-par.vocabLo, (v+tp-1)/tp
	local := vc.local.Rows(0, rows)
	if err := b.MatMul(local, src, m.lmHead); err != nil {
		return err
	}
	vc.hl = growF32(vc.hl, rows*vr)
	if err := b.Read(&vc.hl, local); err != nil {
		return err
	}
	vc.hs = growF32(vc.hs, rows*pad)
	clear(vc.hs)
	for r := range rows {
		copy(vc.hs[r*pad:], vc.hl[r*vr:(r+1)*vr])
	}
	send, all := vc.send.Rows(0, rows*pad), vc.all.Rows(0, tp*rows*pad)
	if err := b.Write(send, &vc.hs); err != nil {
		return err
	}
	if err := par.tp.AllGather(context.Background(), all, send); err != nil {
		return err
	}
	vc.ha, vc.full = growF32(vc.ha, tp*rows*pad), growF32(vc.full, rows*v)
	if err := b.Read(&vc.ha, all); err != nil {
		return err
	}
	for q := range tp {
		lo, hi, _ := part(v, tp, q)
		for r := range rows {
			copy(vc.full[r*v+lo:r*v+hi], vc.ha[(q*rows+r)*pad:(q*rows+r)*pad+hi-lo])
		}
	}
	return b.Write(dst, &vc.full)
}

func growF32(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}
