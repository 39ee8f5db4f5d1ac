package k3

import (
	"context"
	"fmt"
	"sync"

	"k3/compute"
	"k3/internal/sample"
)

// DraftModel is a drafter (specdec.Drafter) that proposes the greedy
// continuation of a second, smaller model with the target's vocabulary:
// speculative decoding's classic small-model drafter. It keeps one
// session of the draft model in step with the sequence it drafts for:
// each Draft cuts that session back to where the history departs from it
// (the drafts the target rejected) and feeds what is new, so the draft
// model computes each history token once. Load the draft model
// WithRollback(depth) or more, so that the cut is a cursor move rather
// than a new prefill.
//
// A DraftModel serves one sequence at a time well; it is safe for
// concurrent use, but sequences sharing one take turns and cut each
// other's history back. The adaptive depth adds the drafter's measured
// time per draft to a pass's cost (the first call, which catches up on
// the prompt, is not timed).
type DraftModel struct {
	mu    sync.Mutex
	draft *Model
	s     *Session
	// self: draft is an early exit of the target (NewSelfDraft), whose
	// session for the generation (target) holds the same layers' state.
	self    bool
	target  *Session
	adopted int      // times it took the target's state
	err     error    // the first failure; drafting stops (no drafts) after it
	one     [1]int32 // a one-token step
}

// NewDraftModel returns a drafter for m's sequences that runs draft, which
// must score the same vocabulary. Close it before closing draft.
func (m *Model) NewDraftModel(draft *Model) (*DraftModel, error) {
	if draft == nil {
		return nil, fmt.Errorf("%w: nil draft model", ErrInvalidOption)
	}
	if draft.VocabSize() != m.VocabSize() {
		return nil, fmt.Errorf("%w: the draft model scores %d tokens, the target %d", ErrInvalidOption, draft.VocabSize(), m.VocabSize())
	}
	s, err := draft.NewSession()
	if err != nil {
		return nil, err
	}
	return &DraftModel{draft: draft, s: s}, nil
}

// Close releases the draft model's session.
func (d *DraftModel) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.s.Close()
}

// Err returns the failure that stopped drafting, if any.
func (d *DraftModel) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// Draft proposes up to n greedy tokens of the draft model after history.
// It proposes none once the draft model has failed (Err says why) or has
// no room left in its context.
func (d *DraftModel) Draft(history []int32, n int, dst []int32) []int32 {
	return d.SampleDraft(history, n, dst, greedy)
}

// greedy picks the most likely token, ties as the sampler breaks them.
func greedy(logits []float32) int32 { return int32(sample.Argmax(logits)) }

// SampleDraft is Draft with each token chosen by pick from the draft
// model's logits (specdec.Sampler).
func (d *DraftModel) SampleDraft(history []int32, n int, dst []int32, pick func([]float32) int32) []int32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil || n <= 0 || len(history) == 0 {
		return dst
	}
	ctx := context.Background()
	s := d.s
	k := 0
	for k < len(s.tokens) && k < len(history) && s.tokens[k] == history[k] {
		k++
	}
	if t := d.target; d.self && t != nil && len(history)-1-k > catchUp && t.pos == len(history)-1 && !t.closed {
		// The target's session already ran these tokens through the
		// drafter's layers: take that state instead of recomputing it.
		if err := s.adoptPrefix(t); err != nil {
			d.err = fmt.Errorf("k3: draft model: %w", err)
			return dst
		}
		k = s.pos
		d.adopted++
	}
	if k < len(s.tokens) {
		if err := s.Truncate(ctx, k); err != nil {
			d.err = fmt.Errorf("k3: draft model: %w", err)
			return dst
		}
	}
	n = min(n, s.limit-len(history))
	if n <= 0 {
		return dst
	}
	if k < len(history) {
		if _, err := s.run(ctx, history[k:], false); err != nil {
			d.err = fmt.Errorf("k3: draft model: %w", err)
			return dst
		}
	}
	for i := range n {
		id := pick(s.last)
		if id < 0 || int(id) >= len(s.last) {
			break
		}
		dst = append(dst, id)
		if i == n-1 {
			break
		}
		d.one[0] = id
		if _, err := s.run(ctx, d.one[:], false); err != nil {
			d.err = fmt.Errorf("k3: draft model: %w", err)
			return dst
		}
	}
	return dst
}

// catchUp is how many tokens a self drafter's session may lag its target
// by before it takes the target's state instead of running them.
const catchUp = ExactTokens

// readsSession reports whether the drafter takes state from the session
// bound to it (a self drafter adopts the target's layers), not from the
// history alone.
func (d *DraftModel) readsSession() bool { return d.self }

// bind makes a self drafter follow s, the target's session for the
// generation that uses it.
func (d *DraftModel) bind(s *Session) {
	d.mu.Lock()
	d.target = s
	d.mu.Unlock()
}

// adoptPrefix makes s, a session of an early-exit view, hold what t, a
// session of the full model, holds in the view's layers: the KDA states
// copied, the attention caches sharing t's pages, the replay logs
// checkpointed there.
func (s *Session) adoptPrefix(t *Session) error {
	if err := s.Reset(); err != nil {
		return err
	}
	b := s.m.b
	for l := range s.kdaSt {
		if st := s.kdaSt[l]; st != nil {
			if err := b.Copy(st.Conv, t.kdaSt[l].Conv); err != nil {
				return err
			}
			if err := b.Copy(st.S, t.kdaSt[l].S); err != nil {
				return err
			}
		}
		if c := s.caches[l]; c != nil {
			c.Free()
			if err := c.Fork(t.caches[l]); err != nil {
				return err
			}
		}
	}
	s.pos, s.tokens = t.pos, append(s.tokens[:0], t.tokens...)
	for l, lg := range s.logs {
		if lg == nil {
			continue
		}
		st := s.kdaSt[l]
		if err := lg.Rebase(s.pos, func(state, conv []float32) error {
			if err := b.Read(&state, st.S); err != nil {
				return err
			}
			return b.Read(&conv, st.Conv)
		}); err != nil {
			return err
		}
	}
	s.charge()
	return nil
}

// NewSelfDraft returns a self-speculative drafter: m's own first n layers
// followed by its final norm and lm_head (an early exit), proposing that
// shortened model's greedy tokens. It shares m's weights and attention page
// pools, so it costs only its session's state (n layers' caches and KDA
// states, and replay logs as deep as ExactTokens). Close it before m.
func (m *Model) NewSelfDraft(n int) (*DraftModel, error) {
	if err := m.life.enter(); err != nil {
		return nil, err
	}
	defer m.life.exit()
	if n < 1 || n >= len(m.layers) {
		return nil, fmt.Errorf("%w: a self-speculative drafter of %d layers (the model has %d; want 1 to %d)", ErrInvalidOption, n, len(m.layers), len(m.layers)-1)
	}
	if m.par != nil {
		return nil, fmt.Errorf("%w: a self-speculative drafter on a rank of a Group", compute.ErrUnsupported)
	}
	d, err := m.NewDraftModel(m.earlyExit(n))
	if err != nil {
		return nil, err
	}
	d.self = true
	return d, nil
}

// earlyExit is a view of m's first n layers as a model of its own: the
// same tensors, its own scratch and sessions. It is made once per n and
// kept (a new drafter's first pass would otherwise allocate and clear a
// workspace, which costs more than many plain steps); it is never closed
// (m owns what it shares).
func (m *Model) earlyExit(n int) *Model {
	m.viewsMu.Lock()
	defer m.viewsMu.Unlock()
	if v, ok := m.views[n]; ok {
		return v
	}
	cfg := *m.Config
	cfg.NumLayers, cfg.Layers = n, cfg.Layers[:n:n]
	v := &Model{Config: &cfg, b: m.b, chunk: m.chunk, embed: m.embed, norm: m.norm, lmHead: m.lmHead,
		layers: m.layers[:n:n], outQuery: m.outQuery, act: m.act, tok: m.tok, dense: m.dense,
		rollback: max(m.rollback, ExactTokens)}
	if !m.resQueries.IsZero() {
		v.resQueries = m.resQueries.Rows(0, 2*n) // each layer's two sublayers' queries
	}
	if m.views == nil {
		m.views = map[int]*Model{}
	}
	m.views[n] = v
	return v
}
