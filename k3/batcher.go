package k3

import (
	"context"
	"errors"
	"fmt"
	"iter"
)

// ErrBatcherClosed is returned for requests a stopped Batcher cannot serve.
var ErrBatcherClosed = errors.New("k3: batcher stopped")

// Batcher serves Generate calls from many goroutines with continuous
// batching: requests join the running batch as they arrive (after their
// prompt is prefilled), leave when they finish, and every decode step runs
// all active sessions in one pass over the weights.
type Batcher struct {
	m     *Model
	batch *Batch
	reqs  chan *batchReq
	done  chan struct{}
}

type batchReq struct {
	ctx    context.Context
	s      *Session
	prompt []int32
	opts   []GenerateOption
	out    chan batchItem
	stop   chan struct{} // closed by the consumer to abandon the request
	g      *generation
}

type batchItem struct {
	tok Token
	err error
}

// NewBatcher makes a batcher for up to max concurrent generations; call
// Run to serve.
func (m *Model) NewBatcher(max int) (*Batcher, error) {
	bt, err := m.NewBatch(max)
	if err != nil {
		return nil, err
	}
	return &Batcher{m: m, batch: bt, reqs: make(chan *batchReq), done: make(chan struct{})}, nil
}

// Generate submits a generation for session s (which must not be used
// elsewhere until the sequence ends) and yields its tokens.
func (b *Batcher) Generate(ctx context.Context, s *Session, prompt string, opts ...GenerateOption) iter.Seq2[Token, error] {
	return func(yield func(Token, error) bool) {
		switch {
		case s == nil:
			yield(Token{}, errors.New("k3: batcher: nil session"))
			return
		case s.m != b.m:
			yield(Token{}, errors.New("k3: batcher: the session belongs to another model"))
			return
		}
		r := &batchReq{ctx: ctx, s: s, prompt: b.m.tok.Encode(prompt, true), opts: opts,
			out: make(chan batchItem, 64), stop: make(chan struct{})}
		defer close(r.stop)
		select {
		case b.reqs <- r:
		case <-b.done:
			yield(Token{}, ErrBatcherClosed)
			return
		case <-ctx.Done():
			yield(Token{}, ctx.Err())
			return
		}
		for it := range r.out {
			if !yield(it.tok, it.err) || it.err != nil {
				return
			}
		}
	}
}

// Run serves requests until ctx is cancelled (pending requests then fail
// with ErrBatcherClosed) or the model is closed (they fail with ErrClosed,
// and so does Run).
func (b *Batcher) Run(ctx context.Context) error {
	defer close(b.done)
	var active []*batchReq
	var sessions []*Session
	var tokens []int32
	var ending []*batchReq
	finish := func(r *batchReq, err error) {
		if err != nil {
			select {
			case r.out <- batchItem{err: err}:
			case <-r.stop:
			}
		}
		close(r.out)
	}
	join := func(r *batchReq) {
		g, err := r.s.startGeneration(r.ctx, r.prompt, r.opts)
		if err != nil {
			finish(r, err)
			return
		}
		r.g = g
		active = append(active, r)
	}
	for {
		// Wait for work when idle; otherwise take whoever is waiting.
		if len(active) == 0 {
			select {
			case r := <-b.reqs:
				join(r)
			case <-ctx.Done():
				return ctx.Err()
			case <-b.m.life.closing:
				return ErrClosed
			}
		}
	admit:
		for len(active) < b.batch.max {
			select {
			case r := <-b.reqs:
				join(r)
			default:
				break admit
			}
		}
		if err := ctx.Err(); err != nil {
			for _, r := range active {
				finish(r, ErrBatcherClosed)
			}
			return err
		}
		sessions, tokens = sessions[:0], tokens[:0]
		ending = ending[:0] // finished, but their last token is still to be fed
		kept := active[:0]
		for _, r := range active {
			st, err := r.g.advance(r.ctx)
			abandoned := false
			for _, tok := range st.ready {
				select {
				case r.out <- batchItem{tok: tok}:
				case <-r.stop:
					abandoned = true
				}
				if abandoned {
					break
				}
			}
			switch {
			case err != nil || abandoned:
				finish(r, err)
				continue
			case st.done:
				if st.feed {
					sessions, tokens = append(sessions, r.s), append(tokens, st.id)
					ending = append(ending, r)
				} else {
					finish(r, nil)
				}
				continue
			}
			if st.feed {
				sessions, tokens = append(sessions, r.s), append(tokens, st.id)
			}
			kept = append(kept, r)
		}
		active = kept
		if len(sessions) > 0 {
			if err := b.batch.Step(ctx, sessions, tokens); err != nil {
				err = fmt.Errorf("k3: batched step: %w", err)
				for _, r := range active {
					finish(r, err)
				}
				for _, r := range ending {
					finish(r, err)
				}
				active, ending = active[:0], ending[:0]
			}
		}
		// Only now do the finished sessions belong to their callers again.
		for _, r := range ending {
			finish(r, nil)
		}
	}
}
