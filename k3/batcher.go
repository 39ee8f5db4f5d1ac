package k3

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync/atomic"
	"time"

	"k3/dsa"
)

// ErrBatcherClosed is returned for requests a stopped Batcher cannot serve.
var ErrBatcherClosed = errors.New("k3: batcher stopped")

// ErrBatcherNotRunning is returned by Generate on a Batcher whose Run has
// not started: the request fails at once rather than waiting for a loop
// that may never come.
var ErrBatcherNotRunning = errors.New("k3: batcher not running (call Start or Run first)")

// Batcher serves Generate calls from many goroutines with continuous
// batching: requests join as they arrive, their prompts prefill in chunks
// inside the decode passes, they leave when they finish, and every pass
// runs all active sequences over the weights once.
//
// A consumer that stops reading its stream holds up only its own
// sequence: once its buffer of tokens is full, the sequence pauses (it
// takes no part in the passes) until the consumer reads again, while the
// other sequences go on.
type Batcher struct {
	m     *Model
	batch *Batch
	max   int // sequences at once
	chunk int // prompt tokens per pass
	reqs  chan *batchReq
	done  chan struct{}
	wake  chan struct{} // a paused sequence's consumer has read
	state atomic.Int32  // batcherNew, batcherRunning, batcherStopped
	err   error         // Run's result, once done is closed
	// What Stats reports: sequences in the loop's passes, requests the
	// loop holds back, and requests not yet handed to the loop.
	gauges gauges
	// kept holds each rank's promise (Batch.promised, the memory the loop
	// keeps for what its admitted sequences may still grow by) before
	// keep changes it, to undo the change.
	kept []int64
}

// BatcherStats is what a Batcher holds at one moment.
type BatcherStats struct {
	Running int // sequences admitted into the passes (paused ones too)
	Waiting int // requests submitted and not yet admitted
}

// Stats reports the batcher's running and waiting requests, as a server's
// metrics export them for a router.
func (b *Batcher) Stats() BatcherStats {
	running, waiting, sending := b.gauges.load()
	return BatcherStats{Running: running, Waiting: waiting + sending}
}

// received queues r, which Generate handed to the loop: it moves from the
// sending count to the waiting one here, in the loop, so that Stats never
// counts it twice while Generate's goroutine waits to be scheduled.
func (b *Batcher) received(waiting *[]*batchReq, r *batchReq) {
	*waiting = append(*waiting, r)
	b.gauges.received()
}

// gauges holds Stats' three counts in one word, so that a reader sees
// them as they were at one moment: a request moving from one count to
// another is never counted twice nor missed. Running and waiting take 21
// bits each (the loop's sequences and queue), sending the top 22
// (Generate calls not yet received, each a goroutine).
type gauges struct{ w atomic.Uint64 }

const (
	gaugeBits    = 21
	gaugeWaiting = gaugeBits
	gaugeSending = 2 * gaugeBits
	gaugeMask    = 1<<gaugeBits - 1
)

func (g *gauges) load() (running, waiting, sending int) {
	w := g.w.Load()
	return int(w & gaugeMask), int(w >> gaugeWaiting & gaugeMask), int(w >> gaugeSending)
}

// set stores the loop's running and waiting counts, keeping sending; a
// count past its field reads as the field's largest.
func (g *gauges) set(running, waiting int) {
	running, waiting = min(running, gaugeMask), min(waiting, gaugeMask)
	for {
		old := g.w.Load()
		w := old&^(1<<gaugeSending-1) | uint64(waiting)<<gaugeWaiting | uint64(running)
		if g.w.CompareAndSwap(old, w) {
			return
		}
	}
}

// send adds d (1 or -1) to the sending count. The count is the top
// field, so a decrement wraps into no other.
func (g *gauges) send(d int) { g.w.Add(uint64(int64(d)) << gaugeSending) }

// received moves one request from sending to waiting in one step.
func (g *gauges) received() { g.w.Add(1<<gaugeWaiting + ^uint64(1<<gaugeSending-1)) }

const (
	batcherNew int32 = iota
	batcherRunning
	batcherStopped
)

// streamBuffer is how many tokens a stream holds for a consumer that is
// slower than the decode loop before its sequence pauses.
const streamBuffer = 64

type batchReq struct {
	ctx     context.Context
	s       *Session
	prompt  []int32
	opts    []GenerateOption
	out     chan batchItem
	stop    chan struct{} // closed by the consumer to abandon the request
	dropped chan struct{} // closed by the loop once it no longer uses the session
	prefill bool          // feed the prompt only (Batcher.Prefill)
	g       *generation
	fed     int     // prompt tokens fed so far; the prompt is in prefill until all are
	base    int     // the position of the prompt's first token
	pts     []int   // the prompt's snapshot points (WithPrefixCache)
	pending []Token // ready tokens the full stream could not take yet
}

type batchItem struct {
	tok Token
	err error
}

// BatcherOption configures a Batcher.
type BatcherOption func(*batcherOptions)

type batcherOptions struct{ budget int }

// WithTokenBudget bounds the rows of one pass: a decode row for each
// running sequence plus one prompt chunk. The chunk is the model's prefill
// chunk (WithPrefillChunk) or, when the budget leaves less room beside the
// batcher's sequences, that room; the default budget, the sequences plus
// the larger of the chunk and ExactTokens-1, has room for the whole chunk
// and for the deepest speculation's verify run. A speculating sequence's
// verify run is one pass's rows, so under a budget of n it drafts at most
// n-1 tokens a run. Smaller chunks shorten the passes that carry them,
// which bounds the running sequences' inter-token latency while a long
// prompt prefills.
func WithTokenBudget(n int) BatcherOption { return func(o *batcherOptions) { o.budget = n } }

// NewBatcher makes a batcher for up to max concurrent generations; call
// Start (or Run) to serve.
//
// Every pass decodes all running sequences and prefills one chunk of at
// most one waiting prompt (oldest first), so a long prompt no longer
// stalls the streams: it arrives chunk by chunk between their tokens.
// Each sequence's chunks are cut at the same places whatever else runs,
// and a pass keeps each kind of rows' arithmetic apart, so a sequence's
// tokens and log-probabilities do not depend on the other traffic; with
// the default budget they are bitwise those of Session.Generate.
func (m *Model) NewBatcher(max int, opts ...BatcherOption) (*Batcher, error) {
	if max <= 0 {
		return nil, fmt.Errorf("k3: batcher for %d sequences", max)
	}
	// The default has room for the whole chunk, and for the deepest
	// verify run (ExactTokens rows): a smaller one drafts less.
	o := batcherOptions{budget: max + m.chunk}
	if m.chunk < ExactTokens-1 {
		o.budget = max + ExactTokens - 1
	}
	for _, opt := range opts {
		opt(&o)
	}
	if o.budget <= max {
		return nil, fmt.Errorf("k3: token budget %d leaves no room for a prompt chunk beside %d sequences", o.budget, max)
	}
	bt, err := m.NewBatch(o.budget)
	if err != nil {
		return nil, err
	}
	return &Batcher{m: m, batch: bt, max: max, chunk: min(m.chunk, o.budget-max), reqs: make(chan *batchReq),
		done: make(chan struct{}), wake: make(chan struct{}, 1), kept: make([]int64, 1)}, nil
}

// Start runs the batcher's loop in a goroutine of its own and returns once
// it serves; Wait returns its result. Serving ends when ctx is cancelled
// or the model is closed.
func (b *Batcher) Start(ctx context.Context) error {
	if !b.state.CompareAndSwap(batcherNew, batcherRunning) {
		return errors.New("k3: batcher already started")
	}
	go b.serve(ctx)
	return nil
}

// Wait blocks until the batcher stops and returns why (the ctx error, or
// ErrClosed when the model was closed).
func (b *Batcher) Wait() error {
	<-b.done
	return b.err
}

// Generate submits a generation for session s and yields its tokens. The
// session belongs to the batcher until the iteration returns, however it
// ends (the last token, an error, or a loop body that breaks out early):
// then the batcher has let go of it. It fails at
// once with ErrBatcherNotRunning before the batcher starts and with
// ErrBatcherClosed after it stops.
func (b *Batcher) Generate(ctx context.Context, s *Session, prompt string, opts ...GenerateOption) iter.Seq2[Token, error] {
	return b.GenerateTokens(ctx, s, b.m.tok.Encode(prompt, true), opts...)
}

// GenerateTokens is Generate with a tokenized prompt.
func (b *Batcher) GenerateTokens(ctx context.Context, s *Session, prompt []int32, opts ...GenerateOption) iter.Seq2[Token, error] {
	return b.submit(ctx, s, prompt, false, opts)
}

// Warm runs one throwaway request through the batcher's passes: a prompt
// of one prefill chunk, then a decode step, on a session of its own that
// the prefix cache neither serves nor keeps. The scratch the passes grow
// on first use, and the first touch of the weights, are then paid before
// the first real request (docs/bench has what they cost). The batcher
// must be running.
func (b *Batcher) Warm(ctx context.Context) error {
	s, err := b.m.NewSession()
	if err != nil {
		return err
	}
	defer s.Close()
	return b.warm(ctx, s)
}

// warm runs Warm's request on s, a new session.
func (b *Batcher) warm(ctx context.Context, s *Session) error {
	s.uncached = true
	prompt := make([]int32, max(1, min(b.chunk, b.m.ContextLength()-2)))
	for i := range prompt {
		prompt[i] = int32(i % b.m.Config.VocabSize)
	}
	for _, err := range b.submit(ctx, s, prompt, false, []GenerateOption{WithMaxTokens(2), WithoutDefaultStops()}) {
		if err != nil {
			return fmt.Errorf("k3: batcher warm-up: %w", err)
		}
	}
	return nil
}

// Prefill feeds prompt to session s in the batcher's passes, chunk by
// chunk beside the running sequences, and generates nothing: the session
// then holds the prompt and its next-token logits, ready to Fork into
// several generations that share the prompt's state. It returns how many
// of the prompt's tokens came from the prefix cache (WithPrefixCache)
// rather than being computed.
func (b *Batcher) Prefill(ctx context.Context, s *Session, prompt []int32) (cached int, err error) {
	if len(prompt) == 0 {
		return 0, ErrEmptyPrompt
	}
	for tok, err := range b.submit(ctx, s, prompt, true, []GenerateOption{WithMaxTokens(1)}) {
		if err != nil {
			return 0, err
		}
		if tok.Usage != nil {
			cached = tok.Usage.CachedTokens
		}
	}
	return cached, nil
}

func (b *Batcher) submit(ctx context.Context, s *Session, prompt []int32, prefill bool, opts []GenerateOption) iter.Seq2[Token, error] {
	return func(yield func(Token, error) bool) {
		switch {
		case s == nil:
			yield(Token{}, errors.New("k3: batcher: nil session"))
			return
		case s.m != b.m:
			yield(Token{}, errors.New("k3: batcher: the session belongs to another model"))
			return
		case b.state.Load() == batcherNew:
			yield(Token{}, ErrBatcherNotRunning)
			return
		}
		for _, id := range prompt {
			if id < 0 || int(id) >= b.m.Config.VocabSize {
				yield(Token{}, fmt.Errorf("%w: prompt token %d (vocabulary %d)", ErrBadToken, id, b.m.Config.VocabSize))
				return
			}
		}
		r := &batchReq{ctx: ctx, s: s, prompt: prompt, opts: opts, prefill: prefill,
			out: make(chan batchItem, streamBuffer), stop: make(chan struct{}), dropped: make(chan struct{})}
		b.gauges.send(1) // the loop takes it off when it receives r
		select {
		case b.reqs <- r:
			// However the consumer leaves, the session is its own again
			// only once the loop has let go of it.
			defer func() {
				close(r.stop)
				select {
				case b.wake <- struct{}{}: // a paused loop notices at once
				default:
				}
				<-r.dropped
			}()
		case <-b.done:
			b.gauges.send(-1)
			yield(Token{}, ErrBatcherClosed)
			return
		case <-ctx.Done():
			b.gauges.send(-1)
			yield(Token{}, ctx.Err())
			return
		}
		for it := range r.out {
			// A read may make room for a paused sequence: tell the loop.
			select {
			case b.wake <- struct{}{}:
			default:
			}
			if !yield(it.tok, it.err) || it.err != nil {
				return
			}
		}
	}
}

// Run serves requests until ctx is cancelled (pending requests then fail
// with ErrBatcherClosed) or the model is closed (they fail with ErrClosed,
// and so does Run). Generate calls made before Run has begun fail with
// ErrBatcherNotRunning; Start has no such window.
func (b *Batcher) Run(ctx context.Context) error {
	if !b.state.CompareAndSwap(batcherNew, batcherRunning) {
		return errors.New("k3: batcher already started")
	}
	return b.serve(ctx)
}

// serve is the batcher's loop; its result is also kept for Wait.
func (b *Batcher) serve(ctx context.Context) (err error) {
	defer func() {
		b.keep(nil, nil)
		b.err = err
		b.gauges.set(0, 0)
		b.state.Store(batcherStopped)
		close(b.done)
	}()
	var active []*batchReq
	var sessions []*Session
	var tokens []int32
	var cu []int32
	var ending []*batchReq
	var rowsOut [][]float32   // per session of the pass: where a verify pass's rows go (nil: last row only)
	var verifying []*batchReq // sequences whose verify pass is in this pass
	// send hands a token to r's stream without blocking; it reports false
	// when the consumer abandoned the request. A full stream keeps the
	// token in r.pending.
	send := func(r *batchReq, tok Token) bool {
		if len(r.pending) > 0 {
			r.pending = append(r.pending, tok)
			return true
		}
		select {
		case r.out <- batchItem{tok: tok}:
		case <-r.stop:
			return false
		default:
			r.pending = append(r.pending, tok)
		}
		return true
	}
	// flush moves r's pending tokens into its stream while there is room;
	// false when the consumer abandoned the request.
	flush := func(r *batchReq) bool {
		for len(r.pending) > 0 {
			select {
			case r.out <- batchItem{tok: r.pending[0]}:
				r.pending = r.pending[1:]
			case <-r.stop:
				return false
			default:
				return true
			}
		}
		r.pending = nil
		return true
	}
	// finish ends r's stream: its pending tokens, then err if any. The
	// sequence is done, so this may wait for the consumer (or for it to
	// abandon the request) without holding up any pass.
	finish := func(r *batchReq, err error) {
		if r.g != nil && r.s.broken == nil {
			// Drafts past the draws leave the session before it goes back
			// (a failure marks the session broken, which its next use
			// reports).
			_ = r.g.settle()
		}
		close(r.dropped)
		go func() {
			for _, tok := range r.pending {
				select {
				case r.out <- batchItem{tok: tok}:
				case <-r.stop:
					close(r.out)
					return
				}
			}
			if err != nil {
				select {
				case r.out <- batchItem{err: err}:
				case <-r.stop:
				}
			}
			close(r.out)
		}()
	}
	join := func(r *batchReq) {
		g, err := r.s.prepareGeneration(r.prompt, r.opts)
		if err != nil {
			finish(r, err)
			return
		}
		r.base = r.s.pos
		if len(r.prompt) > 0 && b.m.prefix != nil && !r.s.uncached {
			held, matched, err := r.s.resume(r.prompt)
			if err != nil {
				finish(r, err)
				return
			}
			r.fed = held
			g.usage.CachedTokens += held
			r.pts = prefillPoints(r.s.pos, r.base+len(r.prompt), matched)
		}
		r.g = g
		active = append(active, r)
	}
	// admit moves waiting requests into the batch, oldest first, while
	// the memory budget holds what every admitted sequence may still grow
	// by; a request that cannot fit even alone fails at once.
	var waiting []*batchReq
	var stalled time.Time // since when nothing has run while the oldest waited for memory
	admit := func() {
		for len(waiting) > 0 && len(active) < b.max {
			r := waiting[0]
			if err := r.ctx.Err(); err != nil {
				waiting = waiting[1:]
				finish(r, err)
				continue
			}
			if b.m.mem.budget > 0 {
				if err := b.fitsAlone(r); err != nil {
					waiting = waiting[1:]
					finish(r, err)
					continue
				}
				if need, ok := b.keep(active, r); !ok {
					if len(active) == 0 {
						if stalled.IsZero() {
							stalled = time.Now()
						}
						late := time.Since(stalled) >= stallLimit
						waiting = b.unblock(waiting, need, late, finish)
						if late {
							stalled = time.Now() // the next gives way a limit later
						}
					}
					return // it waits for memory to come back
				}
			}
			stalled = time.Time{}
			waiting = waiting[1:]
			join(r)
		}
	}
	paused := 0 // active sequences whose streams were full in the last round
	for {
		b.gauges.set(len(active), len(waiting))
		// Wait for work when idle or when every sequence is paused;
		// otherwise take whoever is waiting.
		if len(active) == 0 || paused == len(active) {
			var retry <-chan time.Time
			if len(waiting) > 0 {
				// Memory comes back when callers close their sessions,
				// which nothing here hears of: look again soon.
				retry = time.After(5 * time.Millisecond)
			}
			select {
			case r := <-b.reqs:
				b.received(&waiting, r)
			case <-retry:
			case <-b.wake:
			case <-ctx.Done():
				for _, r := range append(active, waiting...) {
					finish(r, ErrBatcherClosed)
				}
				return ctx.Err()
			case <-b.m.life.closing:
				for _, r := range append(active, waiting...) {
					finish(r, ErrClosed)
				}
				return ErrClosed
			}
		}
	receive:
		for {
			select {
			case r := <-b.reqs:
				b.received(&waiting, r)
			default:
				break receive
			}
		}
		admit()
		b.gauges.set(len(active), len(waiting))
		if err := ctx.Err(); err != nil {
			for _, r := range append(active, waiting...) {
				finish(r, ErrBatcherClosed)
			}
			return err
		}
		sessions, tokens, cu = sessions[:0], tokens[:0], append(cu[:0], 0)
		rowsOut, verifying = rowsOut[:0], verifying[:0]
		ending = ending[:0] // finished, but their last token is still to be fed
		kept := active[:0]
		paused = 0
		var chunkReq *batchReq // the prompt that prefills a chunk in this pass
		decoding := 0
		for _, r := range active {
			if r.fed >= len(r.prompt) {
				decoding++
			}
		}
		for _, r := range active {
			if r.fed < len(r.prompt) {
				// Still prefilling: the oldest such prompt takes a chunk.
				if err := r.ctx.Err(); err != nil {
					finish(r, err)
					continue
				}
				if chunkReq == nil {
					chunkReq = r
				}
				kept = append(kept, r)
				continue
			}
			if r.prefill {
				// The prompt is in: the session goes back with its logits.
				u := r.g.usage
				send(r, Token{ID: -1, Finish: FinishLength, Usage: &u})
				finish(r, nil)
				continue
			}
			if !flush(r) {
				finish(r, nil)
				continue
			}
			if len(r.pending) > 0 {
				// The consumer is behind: this sequence sits the pass out.
				paused++
				kept = append(kept, r)
				continue
			}
			// Draw, then find the pass that feeds the draw. A speculating
			// sequence whose draw confirms a draft needs none, so it draws
			// again at once, until a draw needs a pass (or its stream is
			// full, or it ends).
			var st stepResult
			var pass []int32
			var err error
			abandoned := false
			if sp := r.g.spec; sp != nil {
				sp.batch = decoding // the adaptive depth prices its verify run at this batch
				// A verify run is one sequence's rows, which one pass must
				// hold: under a small token budget it drafts less.
				sp.passRows = b.batch.max
			}
			for {
				st, err = r.g.advance(r.ctx)
				for _, tok := range st.ready {
					if !send(r, tok) {
						abandoned = true
						break
					}
				}
				if err != nil || abandoned || !st.feed {
					break
				}
				if pass, err = r.g.feedPass(r.ctx, st.id, st.done); err != nil || pass != nil || st.done || len(r.pending) > 0 {
					break
				}
			}
			switch {
			case err != nil || abandoned:
				finish(r, err)
				continue
			case st.done:
				if pass != nil {
					sessions, tokens = append(sessions, r.s), append(tokens, pass...)
					cu = append(cu, int32(len(tokens)))
					rowsOut = append(rowsOut, nil)
					ending = append(ending, r)
				} else {
					r.s.endTurn()
					finish(r, nil)
				}
				continue
			}
			if pass != nil {
				sessions, tokens = append(sessions, r.s), append(tokens, pass...)
				cu = append(cu, int32(len(tokens)))
				if len(pass) > 1 {
					// A verify pass: every row's logits, for the draws
					// that may confirm its drafts.
					rowsOut = append(rowsOut, r.g.spec.out)
					verifying = append(verifying, r)
				} else {
					rowsOut = append(rowsOut, nil)
				}
			}
			kept = append(kept, r)
		}
		active = kept
		chunkLen := 0
		if chunkReq != nil {
			// The chunk starts where the last one ended and has the
			// batcher's size whatever else runs: its arithmetic does not
			// depend on the other sequences.
			end := chunkReq.base + len(chunkReq.prompt)
			chunkLen = chunkReq.s.nextCut(chunkReq.s.pos, end, b.chunk, chunkReq.pts) - chunkReq.s.pos
			sessions = append(sessions, chunkReq.s)
			tokens = append(tokens, chunkReq.prompt[chunkReq.fed:chunkReq.fed+chunkLen]...)
			cu = append(cu, int32(len(tokens)))
			rowsOut = append(rowsOut, nil)
		}
		if len(sessions) > 0 {
			rows := rowsOut
			if len(verifying) == 0 {
				rows = nil
			}
			testHookBeforePass()
			if err := b.batch.run(ctx, sessions, cu, tokens, nil, rows); err != nil {
				if ctx.Err() != nil {
					// Stopped in the pass: as a stop between passes ends them.
					err = ErrBatcherClosed
				}
				err = fmt.Errorf("k3: batched step: %w", err)
				for _, r := range active {
					finish(r, err)
				}
				for _, r := range ending {
					finish(r, err)
				}
				active, ending = active[:0], ending[:0]
				paused = 0
			} else {
				for _, r := range verifying {
					r.g.landed()
				}
				if chunkReq != nil {
					chunkReq.fed += chunkLen
					// An error costs only the cache a block; the sequence goes on.
					_ = chunkReq.s.atPoint(chunkReq.pts)
				}
			}
		}
		// The gauges first: a caller that sees its stream end and then
		// reads Stats must not count itself still running. The promise
		// shrinks to what the sequences still running may grow by before
		// the finished ones' callers, or anyone, look for room.
		b.gauges.set(len(active), len(waiting))
		b.keep(active, nil)
		// Only now do the finished sessions belong to their callers again.
		for _, r := range ending {
			r.s.endTurn()
			finish(r, nil)
		}
	}
}

// testHookBeforePass is called before each of the loop's passes (tests
// stop the loop there).
var testHookBeforePass = func() {}

// stallLimit is how long the oldest waiting request waits for memory
// from outside the queue while nothing runs before the newest gives way
// (the memory may be held by a caller who waits on the queue itself, as
// a request that forks its prompt's session does).
var stallLimit = 2 * time.Second

// unblock handles an oldest request that nothing running can make room
// for (need bytes, its growth; the ledger has given back all it could).
// When the memory outside the queue (the ledger's count less what the
// waiting requests' sessions hold) would leave too little room even if
// it all came back, the waiting requests wait on each other: the newest
// fails with ErrMemoryBudget, and its caller's Close gives its session's
// memory back. Otherwise that memory may come back from sessions outside
// the queue, and the request waits for it, until stallLimit has passed
// (late): then the newest gives way too, the oldest itself when it waits
// alone.
func (b *Batcher) unblock(waiting []*batchReq, need int64, late bool, finish func(*batchReq, error)) []*batchReq {
	last := len(waiting) - 1
	if late {
		finish(waiting[last], fmt.Errorf("%w: nothing has run for %v while the oldest request waited for %d bytes, held outside the queue: the newest gives way", ErrMemoryBudget, stallLimit, need))
		return waiting[:last]
	}
	if len(waiting) < 2 {
		return waiting
	}
	held := queuedBytes(waiting)
	if need+held <= b.m.mem.budget {
		return waiting
	}
	finish(waiting[last], fmt.Errorf("%w: the sessions of the %d requests waiting hold %d of %d bytes, and the oldest needs %d more to run: the newest gives way", ErrMemoryBudget, len(waiting), held, b.m.mem.budget, need))
	return waiting[:last]
}

// queuedBytes returns the memory the sessions of reqs hold: the ledger's
// charges, KDA state slots and attention pages, each page once.
func queuedBytes(reqs []*batchReq) int64 {
	var n int64
	var seen []map[*dsa.Page]bool
	for _, r := range reqs {
		n += r.s.charged + r.s.slabBytes()
		if seen == nil {
			seen = make([]map[*dsa.Page]bool, len(r.s.caches))
		}
		for l, c := range r.s.caches {
			if c == nil {
				continue
			}
			if seen[l] == nil {
				seen[l] = map[*dsa.Page]bool{}
			}
			n += c.AddPages(seen[l])
		}
	}
	return n
}

// keep makes the memory the Batcher keeps for its sequences (counted in
// the ledger's use, and which its passes grow into) what the active ones
// may still grow by, plus extra (a request being admitted). It returns
// that sum and whether it fits the budget beside the memory in use;
// when it does not, the promise stays as it was.
func (b *Batcher) keep(active []*batchReq, extra *batchReq) (int64, bool) {
	if b.m.mem.budget <= 0 {
		return 0, true
	}
	// On a GroupBatcher every rank keeps what its own sessions may grow
	// by (ranks hold shares of unequal size), rank 0 first; when one
	// cannot, those before it go back to what they kept.
	for k := range b.ranks() {
		bt := b.batchOn(k)
		n := int64(0)
		if extra != nil {
			n = b.worstGrowth(extra, k)
		}
		for _, a := range active {
			n += b.worstGrowth(a, k)
		}
		if !bt.m.mem.promise(bt.promised, n) {
			for j := range k {
				undo := b.batchOn(j)
				undo.m.mem.promise(undo.promised, b.kept[j])
				undo.promised = b.kept[j]
			}
			return n, false
		}
		b.kept[k], bt.promised = bt.promised, n
	}
	return b.batch.promised, true
}

// ranks is how many ranks the batcher's passes run on.
func (b *Batcher) ranks() int {
	if f := b.batch.fan; f != nil {
		return 1 + len(f.peers)
	}
	return 1
}

// batchOn returns the batch of rank k (0 but on a GroupBatcher).
func (b *Batcher) batchOn(k int) *Batch {
	if k == 0 {
		return b.batch
	}
	return b.batch.fan.peers[k-1]
}

// sessionOn returns r's session on rank k: r.s, or on a GroupBatcher the
// rank's session of its GroupSession.
func sessionOn(r *batchReq, k int) *Session {
	if k == 0 {
		return r.s
	}
	return r.s.group.ranks[k]
}

// fitsAlone refuses a request that could not run even alone: what its
// session may grow by, beside what the session holds, passes the budget
// (on a GroupBatcher, any rank's).
func (b *Batcher) fitsAlone(r *batchReq) error {
	for k := range b.ranks() {
		s := sessionOn(r, k)
		if worst := b.worstGrowth(r, k); worst+s.charged > s.m.mem.budget {
			on := ""
			if k > 0 {
				on = fmt.Sprintf(" on rank %d", k)
			}
			return fmt.Errorf("%w: the request may grow by %d bytes%s, past the budget of %d", ErrMemoryBudget, worst, on, s.m.mem.budget)
		}
	}
	return nil
}

// worstGrowth is what r's session on rank k may still grow by: its
// prompt's rest and every token it may still generate.
func (b *Batcher) worstGrowth(r *batchReq, k int) int64 {
	n := len(r.prompt) - r.fed
	if r.g != nil {
		n += r.g.o.maxTokens - r.g.n
	} else if o, err := b.m.genOptions(r.opts); err == nil {
		n += o.maxTokens
	}
	s := sessionOn(r, k)
	// A rollback of drafts (settle, between this promise and the next
	// pass) gives pages back and drops the snapshots taken past the kept
	// position (forgetAfter), which the next pass takes again: keep room
	// for a verify run's drafts and for those snapshots.
	var dropped int64
	if r.g != nil && r.g.spec != nil {
		n += r.g.spec.depth
		if s.m.prefix != nil && !s.uncached {
			dropped += s.KDAStateBytes()
		}
		if s.m.snapInterval > 0 {
			dropped += s.KDAStateBytes()
		}
	}
	return s.growth(max(0, min(n, s.limit-s.pos))) + dropped
}
