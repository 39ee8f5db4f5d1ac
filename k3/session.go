package k3

import (
	"context"
	"errors"
	"fmt"

	"k3/config"
	"k3/dsa"
	"k3/kda"
	"k3/replay"
)

// ErrContextFull is returned when a session has no room for more tokens.
var ErrContextFull = errors.New("k3: context length exceeded")

// ErrSessionClosed is returned by every operation on a Session after its
// Close.
var ErrSessionClosed = errors.New("k3: session closed")

// ErrOutOfRange is wrapped when a position lies outside the session
// (Truncate beyond its length).
var ErrOutOfRange = errors.New("k3: out of range")

// ErrBadToken is wrapped when a token id lies outside the vocabulary.
var ErrBadToken = errors.New("k3: token id outside the vocabulary")

// Session holds one sequence's state: KDA conv and recurrent states, the
// latent KV and index-key caches of the MLA/DSA layers, and, when the model
// keeps them, the KDA layers' replay logs (WithRollback) and snapshots
// (WithSnapshots). The scratch of a forward pass is borrowed from the model
// for the pass. Close returns the state; a Session is not safe for
// concurrent use: run many sessions for many conversations.
type Session struct {
	m      *Model
	kdaSt  []*kda.State
	caches []*dsa.Cache
	// slab, when set, holds the KDA states (kdaSt are views of its slot).
	slab *slab
	slot int
	ws   *workspace // borrowed from the model for the length of a run
	// one and cuOne describe the session as a batch of one for its passes
	// (fields, so a step allocates nothing).
	one   [1]*Session
	cuOne [2]int32
	pos   int
	limit int

	tokens []int32   // every token fed so far
	last   []float32 // logits after the last token (nil before any)
	broken error     // set when a forward pass failed halfway

	logs      []*replay.Log  // per layer: the KDA layers' rollback logs (nil: none kept)
	scratch   [][2][]float32 // rollback's host copies of a state and conv window, one per worker
	snaps     []*snapshot    // oldest first (WithSnapshots)
	nextSnap  int            // the position from which the next snapshot is due
	turn      *snapshot      // the KDA state at the last block end passed (WithPrefixCache)
	resumed   int            // prompt tokens the last run took from the prefix cache
	uncached  bool           // the prefix cache neither serves nor keeps this session (Batcher.Warm)
	charged   int64          // the bytes the model's ledger counts for the session
	reserving bool           // a run has reserved the memory it grows by
	closed    bool
	// group, on rank 0's session of a GroupSession that a GroupBatcher
	// serves, is that GroupSession (the pass's other ranks' sessions).
	group *GroupSession

	// With a DSpark draft module: the last pass's rows of the target
	// layers' MLP-sublayer inputs (per target layer, rows·D), from
	// position tapsPos on.
	taps              [][]float32
	tapsPos, tapsRows int
}

// Close returns the session's state (KDA states, attention caches, replay
// logs) to the backend. Every later call on the session fails with
// ErrSessionClosed; Close itself is idempotent. A Session that is not
// closed is reclaimed by the garbage collector on the Go backend, but a
// device backend's memory comes back only through Close.
func (s *Session) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	// The charge goes back first: the kept states are counted anew
	// (freeStates.put) within the budget.
	s.m.mem.add(-s.charged)
	s.charged = 0
	if s.slab != nil {
		s.m.slabs.give(s.slab, s.slot)
		s.slab = nil
	} else if !s.m.free.put(s.m, s.kdaSt) {
		freeSet(s.m, s.kdaSt)
	}
	for _, c := range s.caches {
		if c != nil {
			c.Free()
		}
	}
	s.logs, s.last, s.tokens, s.scratch, s.snaps, s.turn = nil, nil, nil, nil, nil, nil
	return nil
}

// usable reports why the session cannot run, if it cannot.
func (s *Session) usable() error {
	if s.closed {
		return ErrSessionClosed
	}
	return nil
}

// NewSession starts an empty sequence.
func (m *Model) NewSession() (*Session, error) {
	if err := m.life.enter(); err != nil {
		return nil, err
	}
	defer m.life.exit()
	cfg := m.Config
	s := &Session{m: m, limit: cfg.MaxPositionEmbeddings}
	if s.limit <= 0 {
		s.limit = 1 << 20
	}
	b := m.b
	var err error
	if s.logs, err = m.newLogs(); err != nil {
		return nil, err
	}
	fail := func(err error) (*Session, error) {
		s.Close() // what was allocated goes back
		return nil, err
	}
	var slotted []*kda.State
	if m.slabs != nil {
		sl, slot, err := m.slabs.take()
		switch {
		case err == nil:
			s.slab, s.slot, slotted = sl, slot, sl.slotStates(slot)
		case !errors.Is(err, ErrMemoryBudget):
			return fail(err)
		}
		// Past the budget a slab could not be made: the session keeps its
		// own states, as on the Go backend.
	}
	var kept []*kda.State // a closed session's states, zeroed
	if slotted == nil {
		kept = m.free.take(m)
	}
	for l, ly := range m.layers {
		var ks *kda.State
		var c *dsa.Cache
		switch {
		case ly.kind == config.KDA && slotted != nil:
			ks = slotted[l]
		case ly.kind == config.KDA && kept != nil:
			ks = kept[l]
		case ly.kind == config.KDA:
			if ks, err = kda.NewState(b, ly.kdaCfg, 1); err != nil {
				return fail(err)
			}
		default:
			if c, err = dsa.NewCache(ly.pages, s.limit); err != nil {
				return fail(err)
			}
		}
		s.kdaSt, s.caches = append(s.kdaSt, ks), append(s.caches, c)
	}
	n := s.StateBytes() - s.slabBytes() // a new session's caches hold no pages yet
	if err := m.mem.take(n, "a new session"); err != nil {
		s.Close()
		return nil, err
	}
	s.charged = n
	return s, nil
}

// Len returns the number of tokens in the session.
func (s *Session) Len() int { return s.pos }

// Trace collects per-layer intermediate tensors of a forward pass (host
// copies, row-major over the pass's tokens) for debugging and conformance.
// Slices are indexed by layer, or by DSA/MoE layer in layer order; a
// Forward that runs as several prefill chunks still records one entry a
// layer, its rows those of every token of the call. Each further Forward
// recording into the same Trace appends entries of its own.
type Trace struct {
	HiddenAfterLayer      [][]float32
	AttnInput, MLPInput   [][]float32
	AttnOutput, MLPOutput [][]float32
	FinalHidden           []float32
	DSAIndices            [][]int32
	MoEIndices            [][]int32
	MoEWeights            [][]float32
}

// traceMark is where a call's entries begin in a Trace: the entry counts
// before it.
type traceMark [8]int

func (t *Trace) mark() traceMark {
	return traceMark{len(t.HiddenAfterLayer), len(t.AttnInput), len(t.MLPInput), len(t.AttnOutput),
		len(t.MLPOutput), len(t.DSAIndices), len(t.MoEIndices), len(t.MoEWeights)}
}

// fold records pass c, which continues the tokens of the call whose
// entries begin at m: its entries are the call's first, or their rows
// follow the earlier passes' rows of the same entries.
func (t *Trace) fold(m traceMark, c *Trace) {
	t.HiddenAfterLayer = foldEntries(t.HiddenAfterLayer, m[0], c.HiddenAfterLayer)
	t.AttnInput = foldEntries(t.AttnInput, m[1], c.AttnInput)
	t.MLPInput = foldEntries(t.MLPInput, m[2], c.MLPInput)
	t.AttnOutput = foldEntries(t.AttnOutput, m[3], c.AttnOutput)
	t.MLPOutput = foldEntries(t.MLPOutput, m[4], c.MLPOutput)
	t.FinalHidden = append(t.FinalHidden, c.FinalHidden...)
	t.DSAIndices = foldEntries(t.DSAIndices, m[5], c.DSAIndices)
	t.MoEIndices = foldEntries(t.MoEIndices, m[6], c.MoEIndices)
	t.MoEWeights = foldEntries(t.MoEWeights, m[7], c.MoEWeights)
}

func foldEntries[E any](dst [][]E, from int, pass [][]E) [][]E {
	if len(dst) == from {
		return append(dst, pass...)
	}
	for i, rows := range pass {
		dst[from+i] = append(dst[from+i], rows...)
	}
	return dst
}

// Forward appends tokens to the sequence and returns the logits of every
// new position ([len(tokens)][vocab], row-major). Up to ExactTokens tokens
// are computed as that many single steps would be, bitwise; longer inputs
// run as prefill chunks, with ctx checked between chunks. A Trace attached
// to ctx with WithTrace receives the pass's intermediates.
func (s *Session) Forward(ctx context.Context, tokens []int32) ([]float32, error) {
	tr, _ := ctx.Value(traceKey{}).(*Trace)
	return s.run(ctx, tokens, true, tr)
}

type traceKey struct{}

// WithTrace returns a context that makes Session.Forward record the
// intermediates of its passes into tr (as net/http/httptrace attaches its
// hooks), for debugging and the conformance runner.
func WithTrace(ctx context.Context, tr *Trace) context.Context {
	return context.WithValue(ctx, traceKey{}, tr)
}

// Tokens returns the tokens the session holds.
func (s *Session) Tokens() []int32 { return append([]int32(nil), s.tokens...) }

// run feeds tokens and keeps the last position's logits; with all it also
// returns every position's logits. Inputs are checked before any state
// changes, so bad input leaves the session as it was.
func (s *Session) run(ctx context.Context, tokens []int32, all bool, tr ...*Trace) ([]float32, error) {
	var out []float32
	if all {
		out = make([]float32, len(tokens)*s.m.Config.VocabSize)
	}
	var trace *Trace
	if len(tr) > 0 {
		trace = tr[0]
	}
	if err := s.runTo(ctx, tokens, out, trace); err != nil {
		return nil, err
	}
	return out, nil
}

// runInto is run with every position's logits written to out
// (len(tokens)·vocab floats), which the caller owns and reuses.
func (s *Session) runInto(ctx context.Context, tokens []int32, out []float32) error {
	return s.runTo(ctx, tokens, out, nil)
}

// checkFeed says why tokens cannot be fed to s, before anything changes:
// a broken session, no tokens, a token outside the vocabulary, or more
// than the context holds.
func (s *Session) checkFeed(tokens []int32) error {
	if s.broken != nil {
		return fmt.Errorf("k3: session unusable after an earlier failure (Reset or Truncate it): %w", s.broken)
	}
	if len(tokens) == 0 {
		return ErrEmptyPrompt
	}
	v := s.m.Config.VocabSize
	for i, t := range tokens {
		if t < 0 || int(t) >= v {
			return fmt.Errorf("%w: token %d at index %d (vocabulary %d)", ErrBadToken, t, i, v)
		}
	}
	if s.pos+len(tokens) > s.limit {
		return fmt.Errorf("%w: %d tokens after %d exceed %d", ErrContextFull, len(tokens), s.pos, s.limit)
	}
	return nil
}

// runTo feeds tokens, keeps the last position's logits and, when out is
// not nil, writes every position's logits to it.
func (s *Session) runTo(ctx context.Context, tokens []int32, out []float32, trace *Trace) error {
	all := out != nil
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.m.life.enter(); err != nil {
		return err
	}
	defer s.m.life.exit()
	if err := s.checkFeed(tokens); err != nil {
		return err
	}
	v := s.m.Config.VocabSize
	// The whole run's growth is reserved first (a prefix-cache hit only
	// grows the caches to the same length): past the budget the run fails
	// before anything changes.
	grow := s.growth(len(tokens))
	taken := s.m.mem.take(grow, "the session's tokens")
	if err := s.m.par.agree(taken); err != nil {
		if taken == nil {
			s.m.mem.add(-grow) // taken here, refused elsewhere
		}
		return err
	}
	s.reserving = true
	defer func() {
		s.reserving = false
		s.m.mem.add(-grow)
		s.charge()
	}()
	ws, err := s.m.workspace()
	if err != nil {
		return err
	}
	s.ws = ws
	defer func() { s.ws = nil; s.m.release(ws) }()
	if all && len(out) < len(tokens)*v {
		return fmt.Errorf("k3: %d floats for the logits of %d tokens", len(out), len(tokens))
	}
	// With the prefix cache a new session's prompt may resume from a
	// cached state (not when every position's logits are wanted), and
	// every run is cut at the cache's fixed positions.
	s.resumed = 0
	var pts []int
	if s.m.prefix != nil {
		matched := 0
		if !all {
			if s.resumed, matched, err = s.resume(tokens); err != nil {
				return err
			}
		}
		pts = prefillPoints(s.pos, s.pos-s.resumed+len(tokens), matched)
	}
	if s.last == nil {
		s.last = make([]float32, v)
	}
	base := s.pos - s.resumed // the position of tokens[0]
	var mark traceMark
	if trace != nil {
		mark = trace.mark()
	}
	for c0 := s.resumed; c0 < len(tokens); {
		// Between chunks the state is consistent: it holds c0 tokens.
		if err := ctx.Err(); err != nil {
			return err
		}
		if c0 > s.resumed && s.m.life.isClosed() {
			return ErrClosed
		}
		c1 := s.nextCut(s.pos, base+len(tokens), s.m.chunk, pts) - base
		var pass *Trace
		if trace != nil {
			pass = new(Trace)
		}
		if err := s.step(tokens[c0:c1], pass, all); err != nil {
			s.broken = err
			return err
		}
		if trace != nil {
			trace.fold(mark, pass)
		}
		rows := 1
		if all {
			rows = c1 - c0
			if err := s.m.b.Read(out[c0*v:c1*v], ws.bt.p.logits.Rows(0, rows)); err != nil {
				return err
			}
			copy(s.last, out[(c1-1)*v:c1*v])
		}
		if err := s.atPoint(pts); err != nil {
			return err
		}
		c0 = c1
	}
	return nil
}

// Reset empties the session.
func (s *Session) Reset() error {
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.m.life.enter(); err != nil {
		return err
	}
	defer s.m.life.exit()
	for _, st := range s.kdaSt {
		if st == nil {
			continue
		}
		if err := s.m.b.Fill(st.Conv, 0); err != nil {
			return err
		}
		if err := s.m.b.Fill(st.S, 0); err != nil {
			return err
		}
	}
	for _, c := range s.caches {
		if c != nil {
			c.Truncate(0)
		}
	}
	for _, lg := range s.logs {
		if lg != nil {
			lg.Reset()
		}
	}
	s.pos, s.tokens, s.last, s.broken = 0, s.tokens[:0], nil, nil
	s.snaps, s.nextSnap, s.turn = s.snaps[:0], 0, nil
	s.charge()
	return nil
}

// Truncate keeps the first n tokens. Attention caches truncate in place.
// Within the model's rollback depth (WithRollback) the KDA states come back
// from their replay logs, and the last kept token runs once more for its
// logits: about one decode step. Further back, the newest snapshot before
// the cut (WithSnapshots) is restored and the tokens after it run again;
// with neither, the session is rebuilt by running all n kept tokens.
func (s *Session) Truncate(ctx context.Context, n int) error {
	if err := s.usable(); err != nil {
		return err
	}
	if n < 0 || n > len(s.tokens) {
		return fmt.Errorf("%w: truncate to %d tokens, the session holds %d", ErrOutOfRange, n, len(s.tokens))
	}
	if n == len(s.tokens) && s.broken == nil {
		return nil
	}
	if s.turn != nil && s.turn.pos > n {
		s.turn = nil // the tokens before it may change
	}
	if n > 0 && s.broken == nil {
		last := s.tokens[n-1]
		ok, err := s.rollback(n - 1)
		if err != nil {
			s.broken = err
			return err
		}
		if ok {
			_, err := s.run(ctx, []int32{last}, false)
			return err
		}
		rest := append([]int32(nil), s.tokens[:n]...)
		if ok, err = s.restoreSnapshot(n - 1); err != nil {
			s.broken = err
			return err
		}
		if ok {
			_, err := s.run(ctx, rest[s.pos:], false)
			return err
		}
	}
	keep := append([]int32(nil), s.tokens[:n]...)
	if err := s.Reset(); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	_, err := s.run(ctx, keep, false)
	return err
}

// Fork returns a session that continues from where s stands, independent
// of it from then on (a conversation's branch, n completions of one
// prompt): the KDA states are copied, the attention caches share every
// full page with s and copy only the partial last one, and either
// session copies a shared page before it writes into it. The rows a
// DSpark drafter reads are copied too: the fork drafts as s would.
func (s *Session) Fork() (*Session, error) { return s.Clone() }

// Clone is Fork, by its older name.
func (s *Session) Clone() (*Session, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	if err := s.m.life.enter(); err != nil {
		return nil, err
	}
	defer s.m.life.exit()
	if s.broken != nil {
		return nil, fmt.Errorf("k3: cannot clone a failed session: %w", s.broken)
	}
	c, err := s.m.NewSession()
	if err != nil {
		return nil, err
	}
	b := s.m.b
	for l := range s.kdaSt {
		if st := s.kdaSt[l]; st != nil {
			if err := b.Copy(c.kdaSt[l].Conv, st.Conv); err != nil {
				return nil, err
			}
			if err := b.Copy(c.kdaSt[l].S, st.S); err != nil {
				return nil, err
			}
		}
		if src := s.caches[l]; src != nil {
			if err := c.caches[l].Fork(src); err != nil {
				return nil, err
			}
		}
	}
	for l, lg := range s.logs {
		if lg != nil {
			if err := c.logs[l].CopyFrom(lg); err != nil {
				return nil, err
			}
		}
	}
	c.pos, c.tokens = s.pos, append([]int32(nil), s.tokens...)
	if s.last != nil {
		c.last = append([]float32(nil), s.last...)
	}
	// A DSpark module's rows, so that the fork's first draft is the one
	// the session would draft (keepTaps reslices them up to their
	// capacity).
	if s.taps != nil {
		c.taps = make([][]float32, len(s.taps))
		for i, tp := range s.taps {
			c.taps[i] = append(make([]float32, 0, cap(tp)), tp...)
		}
		c.tapsPos, c.tapsRows = s.tapsPos, s.tapsRows
	}
	return c, nil
}

// StateBytes returns the memory the session's per-sequence state holds:
// KDA states and conv caches and attention caches. Scratch is not the
// session's: runs borrow it from the model (one set per pass running at
// once).
func (s *Session) StateBytes() int64 {
	var n int64
	for l := range s.kdaSt {
		if st := s.kdaSt[l]; st != nil {
			n += 4 * int64(st.Conv.Len()+st.S.Len())
		}
		if c := s.caches[l]; c != nil {
			n += c.Bytes()
		}
		if s.logs != nil && s.logs[l] != nil {
			n += s.logs[l].Bytes()
		}
	}
	return n + s.snapshotBytes()
}

// step runs one forward pass over at most chunk tokens, through the
// workspace's batch: the one forward path sessions and batches share.
func (s *Session) step(tokens []int32, tr *Trace, allLogits bool) error {
	if s.pos+len(tokens) > s.limit {
		return fmt.Errorf("%w: %d tokens after %d exceed %d", ErrContextFull, len(tokens), s.pos, s.limit)
	}
	s.one[0], s.cuOne[0], s.cuOne[1] = s, 0, int32(len(tokens))
	return s.ws.bt.execute(s.one[:], s.cuOne[:], tokens, nil, nil, tr, allLogits)
}

// ExactTokens is the longest run of new tokens that one forward pass
// computes with the decode arithmetic, token after token: its logits and
// states are bitwise those of as many single-token steps (what verifying
// drafted tokens needs). Longer runs are prefill chunks, which take the
// chunked KDA form and the blocked attention paths: faster, and within the
// conformance tolerance of the decode arithmetic.
const ExactTokens = 16

// slabBytes returns the bytes of the session's KDA states when a slab
// holds them, which the slab has counted.
func (s *Session) slabBytes() int64 {
	if s.slab == nil {
		return 0
	}
	return s.KDAStateBytes()
}

// KDAStateBytes returns the bytes of the session's KDA recurrent states and
// conv caches, which every decode step reads and writes.
func (s *Session) KDAStateBytes() int64 {
	var n int64
	for _, st := range s.kdaSt {
		if st != nil {
			n += 4 * int64(st.Conv.Len()+st.S.Len())
		}
	}
	return n
}

// A workspace holds the intermediates of one forward pass: a batch sized
// for the prefill chunk. Sessions borrow one for each run and give it
// back, so memory grows with the number of passes running at once, not
// with the number of sessions.
type workspace struct {
	bt *Batch
}

func (m *Model) newWorkspace() (*workspace, error) {
	bt, err := m.newBatchExact(max(m.chunk, ExactTokens), ExactTokens)
	if err != nil {
		return nil, err
	}
	return &workspace{bt: bt}, nil
}

// workspace lends a free workspace, making one when all are in use.
func (m *Model) workspace() (*workspace, error) {
	m.wsMu.Lock()
	if n := len(m.wsFree); n > 0 {
		w := m.wsFree[n-1]
		m.wsFree = m.wsFree[:n-1]
		m.wsMu.Unlock()
		return w, nil
	}
	m.wsMu.Unlock()
	return m.newWorkspace()
}

// release returns a workspace for the next run.
func (m *Model) release(w *workspace) {
	m.wsMu.Lock()
	m.wsFree = append(m.wsFree, w)
	m.wsMu.Unlock()
}

// Logits returns a copy of the session's next-token logits (after its last
// token, [vocab]); nil before the session holds a token. Batch.Step leaves
// each session's logits here. Sampler.Next reads them without the copy.
func (s *Session) Logits() []float32 {
	if s.last == nil {
		return nil
	}
	return append([]float32(nil), s.last...)
}
