package k3

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"

	"k3/compute"
)

// GroupBatcher is a Batcher on a Group: generations of many GroupSessions
// share each pass, which every rank runs in lockstep. Its scheduling,
// streams, budget and stop are the Batcher's (a request is admitted when
// every rank's budget holds what it may grow by); see ARCHITECTURE,
// "Parallel inference".
//
// It speculates at a fixed depth (WithSpeculation) with a drafter that
// reads no session (specdec.NGram, a DraftModel of a model outside the
// group): rank 0 drafts, once for every rank. The adaptive depth, DSpark
// and self-drafts are refused, and so is a group under context
// parallelism.
type GroupBatcher struct {
	g *Group
	b *Batcher
}

// NewBatcher makes a GroupBatcher for up to max concurrent generations
// (NewBatcher of Model: the options are the same); call Start (or Run)
// to serve.
func (g *Group) NewBatcher(max int, opts ...BatcherOption) (*GroupBatcher, error) {
	if g.layout.CP > 1 {
		return nil, fmt.Errorf("%w: a GroupBatcher under context parallelism", compute.ErrUnsupported)
	}
	b, err := g.ranks[0].NewBatcher(max, opts...)
	if err != nil {
		return nil, err
	}
	n := len(g.ranks)
	f := &batchFan{g: g, errs: make([]error, n), sessions: make([][]*Session, n), rows: make([][][]float32, n), bufs: make([][][]float32, n)}
	for r := range n {
		f.work = append(f.work, func() { f.runRank(r) })
	}
	for _, m := range g.ranks[1:] {
		bt, err := m.NewBatch(b.batch.max)
		if err != nil {
			return nil, err
		}
		f.peers = append(f.peers, bt)
	}
	b.batch.fan = f
	b.kept = make([]int64, n)
	return &GroupBatcher{g: g, b: b}, nil
}

// Start runs the batcher's loop in a goroutine of its own (Batcher.Start).
func (gb *GroupBatcher) Start(ctx context.Context) error { return gb.b.Start(ctx) }

// Run serves requests until ctx is cancelled or the group is closed
// (Batcher.Run).
func (gb *GroupBatcher) Run(ctx context.Context) error { return gb.b.Run(ctx) }

// Wait blocks until the batcher stops and returns why (Batcher.Wait).
func (gb *GroupBatcher) Wait() error { return gb.b.Wait() }

// Stats reports the batcher's running and waiting requests.
func (gb *GroupBatcher) Stats() BatcherStats { return gb.b.Stats() }

// Generate is GenerateTokens with a text prompt, which the model's
// tokenizer encodes as Session.Generate's.
func (gb *GroupBatcher) Generate(ctx context.Context, gs *GroupSession, prompt string, opts ...GenerateOption) iter.Seq2[Token, error] {
	return gb.GenerateTokens(ctx, gs, gb.g.ranks[0].tok.Encode(prompt, true), opts...)
}

// GenerateTokens submits a generation for gs and yields its tokens, as
// Batcher.GenerateTokens does for a session: gs belongs to the batcher
// until the iteration returns. The tokens are those of
// GroupSession.GenerateTokens with the same options.
func (gb *GroupBatcher) GenerateTokens(ctx context.Context, gs *GroupSession, prompt []int32, opts ...GenerateOption) iter.Seq2[Token, error] {
	return func(yield func(Token, error) bool) {
		if err := groupSpeculation(opts, false, "a GroupBatcher (its costs would be measured on rank 0 alone, whose passes need every rank)"); err != nil {
			yield(Token{}, err)
			return
		}
		s, err := gb.lead(gs)
		if err != nil {
			yield(Token{}, err)
			return
		}
		defer gs.letGo()
		for tok, err := range gb.b.submit(ctx, s, prompt, false, opts) {
			if !yield(tok, err) {
				return
			}
		}
	}
}

// Prefill feeds prompt to gs in the batcher's passes and generates
// nothing (Batcher.Prefill).
func (gb *GroupBatcher) Prefill(ctx context.Context, gs *GroupSession, prompt []int32) (cached int, err error) {
	s, err := gb.lead(gs)
	if err != nil {
		return 0, err
	}
	defer gs.letGo()
	return gb.b.Prefill(ctx, s, prompt)
}

// Warm runs one throwaway request through the batcher's passes
// (Batcher.Warm), on a GroupSession of its own.
func (gb *GroupBatcher) Warm(ctx context.Context) error {
	gs, err := gb.g.NewSession()
	if err != nil {
		return err
	}
	defer gs.Close()
	s, err := gb.lead(gs)
	if err != nil {
		return err
	}
	defer gs.letGo()
	return gb.b.warm(ctx, s)
}

// lead returns gs's rank-0 session, pointed at gs for the batcher's
// passes and rollbacks until letGo.
func (gb *GroupBatcher) lead(gs *GroupSession) (*Session, error) {
	switch {
	case gs == nil:
		return nil, errors.New("k3: group batcher: nil session")
	case gs.g != gb.g:
		return nil, errors.New("k3: group batcher: the session belongs to another group")
	case len(gs.ranks) == 0:
		return nil, ErrSessionClosed
	}
	s := gs.ranks[0]
	s.group = gs
	return s, nil
}

// letGo ends a GroupBatcher's hold on gs. Every rank's session then
// holds what rank 0's does, its next-token logits too: a pass leaves the
// same rows on every rank, and a generation that confirmed drafts
// without a pass ends by dropping the rest (rollbackTo), which gives
// every rank rank 0's logits; the last draft confirmed is the pass's
// last row, which every rank holds.
func (gs *GroupSession) letGo() { gs.ranks[0].group = nil }

// rollbackTo drops the tokens past keep on every rank, for a generation
// of a GroupBatcher whose drafts were rejected (generation.settle): from
// the replay logs, which every rank holds alike, or by Truncate's passes
// when they do not reach. The logits every rank keeps are those rank 0
// kept, the row its last draw read.
func (gs *GroupSession) rollbackTo(keep int) error {
	last := gs.ranks[0].last
	for r, s := range gs.ranks {
		buf := s.last
		ok, err := s.rollback(keep)
		switch {
		case err != nil:
			s.broken = err
			return err
		case !ok && r == 0:
			// Rank 0 stands for all: none rolled back, every rank runs
			// the kept tokens again.
			return gs.Truncate(context.Background(), keep)
		case !ok:
			s.broken = fmt.Errorf("k3: rank %d's replay logs do not reach position %d, rank 0's do", r, keep)
			return s.broken
		}
		s.last = append(buf[:0], last...)
		s.charge()
	}
	return nil
}

// batchFan runs a GroupBatcher's passes: rank 0's batch, and a batch of
// the same size on every other rank with that rank's sessions.
type batchFan struct {
	g        *Group
	peers    []*Batch      // ranks 1..W-1
	sessions [][]*Session  // by rank: the pass's sessions (reused)
	rows     [][][]float32 // by rank: a verify pass's rows per session (reused)
	bufs     [][][]float32 // by rank: the rows' scratch, by place in the pass
	errs     []error       // by rank: the pass's result (reused)

	// The pass being run, which each rank's goroutine reads: rank r runs
	// work[r] (made once, so that starting it allocates nothing).
	lead    *Batch
	cu, ids []int32
	out     []float32
	work    []func()
	wg      sync.WaitGroup
}

// runRank runs the current pass on rank r and, on a failure other than
// an agreed refusal, aborts the group's collectives.
func (f *batchFan) runRank(r int) {
	defer f.wg.Done()
	if r == 0 {
		f.errs[0] = f.lead.reserveAndExecute(f.sessions[0], f.cu, f.ids, f.out, f.rows[0])
	} else {
		f.errs[r] = f.peers[r-1].runPeer(f.sessions[r], f.cu, f.ids, f.rows[r])
	}
	if f.errs[r] != nil && !groupRefused(f.errs[r]) {
		f.g.abort(fmt.Errorf("rank %d: %w", r, f.errs[r]))
	}
}

// run runs a checked pass of lead, rank 0's batch, on every rank under
// the group's pass lock. The ranks' sessions hold the same tokens and
// their batches the same size, so every rank cuts the same passes and
// meets the others in the same collectives.
func (f *batchFan) run(lead *Batch, sessions []*Session, cu, ids []int32, out []float32, rows [][]float32) error {
	for i, s := range sessions {
		if s.group == nil || s.group.g != f.g {
			return fmt.Errorf("k3: group batch: session %d is not a session of the group", i)
		}
	}
	v := lead.m.Config.VocabSize
	for r := 1; r < len(f.g.ranks); r++ {
		f.sessions[r] = f.sessions[r][:0]
		for _, s := range sessions {
			f.sessions[r] = append(f.sessions[r], s.group.ranks[r])
		}
		// A verify run's rows: every rank computes all of them (the
		// vocabulary-split head gathers them), rank 0's generation takes
		// them, the others' land in scratch.
		f.rows[r] = f.rows[r][:0]
		if rows == nil {
			continue
		}
		for len(f.bufs[r]) < len(sessions) {
			f.bufs[r] = append(f.bufs[r], nil)
		}
		for i := range sessions {
			var b []float32
			if rows[i] != nil {
				b = growF32(f.bufs[r][i], int(cu[i+1]-cu[i])*v)
				f.bufs[r][i] = b
			}
			f.rows[r] = append(f.rows[r], b)
		}
	}
	f.g.pass.Lock()
	defer f.g.pass.Unlock()
	f.lead, f.sessions[0], f.cu, f.ids, f.out, f.rows[0] = lead, sessions, cu, ids, out, rows
	defer func() { f.lead, f.sessions[0], f.out, f.rows[0] = nil, nil, nil, nil }()
	f.wg.Add(len(f.work))
	for _, w := range f.work[1:] {
		go w()
	}
	f.work[0]() // rank 0 on the caller's goroutine
	f.wg.Wait()
	return firstCause(f.errs)
}

// runPeer runs a pass on another rank than 0: its sessions hold what rank
// 0's do, which check has passed.
func (bt *Batch) runPeer(sessions []*Session, cu, ids []int32, rows [][]float32) error {
	if err := bt.m.life.enter(); err != nil {
		return err
	}
	defer bt.m.life.exit()
	if len(rows) == 0 {
		rows = nil
	}
	return bt.reserveAndExecute(sessions, cu, ids, nil, rows)
}
