package k3

import (
	"context"
	"errors"
	"fmt"

	"k3/compute"
	"k3/config"
	"k3/dsa"
	"k3/kda"
)

// Batch decodes one token for each of several sessions in one pass over
// the weights: every projection and expert reads its weights once for the
// whole batch, while each session keeps its own caches and states. Results
// equal decoding each session alone. Sessions may differ from one Step to
// the next (continuous batching). A Batch is not safe for concurrent use.
type Batch struct {
	m      *Model
	max    int
	kdaL   []*kda.Layer
	mlaL   []*dsa.Layer
	p      *pass
	mix    mixer
	cur    []*Session // the sessions of the running step
	states []*kda.State
	caches []*dsa.Cache
	rec    *recorder
}

// NewBatch prepares a batch of up to max sessions.
func (m *Model) NewBatch(max int) (*Batch, error) {
	if max <= 0 {
		return nil, fmt.Errorf("k3: batch size %d must be positive", max)
	}
	if err := m.life.enter(); err != nil {
		return nil, err
	}
	defer m.life.exit()
	bt := &Batch{m: m, max: max}
	var err error
	if bt.p, err = newPass(m, max); err != nil {
		return nil, err
	}
	bt.mix = bt.mixLayer
	if bt.rec, err = m.newRecorder(max); err != nil {
		return nil, err
	}
	var firstKDA *kda.Layer
	firstAttn := map[config.LayerKind]*dsa.Layer{}
	for _, ly := range m.layers {
		var kl *kda.Layer
		var ml *dsa.Layer
		switch {
		case ly.kind == config.KDA && firstKDA != nil:
			kl = firstKDA.Share(ly.kda)
		case ly.kind == config.KDA:
			kl, err = kda.NewLayer(m.b, ly.kdaCfg, ly.kda, 1)
			firstKDA = kl
		case firstAttn[ly.kind] != nil:
			ml = firstAttn[ly.kind].Share(ly.mla)
		default:
			ml, err = dsa.NewLayer(m.b, ly.mlaCfg, ly.mla, max)
			firstAttn[ly.kind] = ml
		}
		if err != nil {
			return nil, err
		}
		bt.kdaL, bt.mlaL = append(bt.kdaL, kl), append(bt.mlaL, ml)
	}
	return bt, nil
}

// Step feeds tokens[i] to sessions[i] for every i, in one pass. Each
// session's next-token logits are then available to its generation (and
// through Logits).
func (bt *Batch) Step(ctx context.Context, sessions []*Session, tokens []int32) error {
	n := len(sessions)
	switch {
	case n == 0:
		return errors.New("k3: batch step with no sessions")
	case n != len(tokens):
		return fmt.Errorf("k3: batch step with %d sessions but %d tokens (one token per session)", n, len(tokens))
	case n > bt.max:
		return fmt.Errorf("k3: batch step with %d sessions, more than the batch's limit of %d (NewBatch(%d))", n, bt.max, bt.max)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := bt.m.life.enter(); err != nil {
		return err
	}
	defer bt.m.life.exit()
	m, b := bt.m, bt.m.b
	cfg := m.Config
	for i, s := range sessions {
		if s == nil {
			return fmt.Errorf("k3: batch step: session %d is nil", i)
		}
		if s.m != m {
			return errors.New("k3: batch step with a session of another model")
		}
		if s.closed {
			return fmt.Errorf("k3: batch step: session %d: %w", i, ErrSessionClosed)
		}
		if s.broken != nil {
			return fmt.Errorf("k3: session %d unusable after an earlier failure: %w", i, s.broken)
		}
		if t := tokens[i]; t < 0 || int(t) >= cfg.VocabSize {
			return fmt.Errorf("%w: token %d for session %d", ErrBadToken, t, i)
		}
		if s.pos >= s.limit {
			return fmt.Errorf("%w: session %d holds %d tokens", ErrContextFull, i, s.pos)
		}
		for j := 0; j < i; j++ {
			if sessions[j] == s {
				return fmt.Errorf("k3: session %d appears twice in one batch step", i)
			}
		}
	}
	// A backend promises row-count-independent results only up to
	// compute.InvariantRows rows, so larger batches run in groups: each
	// session still gets exactly its solo logits, and the weights are read
	// once per group (by then the step is bound by arithmetic, not reads).
	for len(sessions) > 0 {
		g := min(len(sessions), compute.InvariantRows)
		if err := bt.forward(sessions[:g], tokens[:g]); err != nil {
			for _, s := range sessions {
				s.broken = err
			}
			return err
		}
		for i, s := range sessions[:g] {
			if s.last == nil {
				s.last = make([]float32, cfg.VocabSize)
			}
			if err := b.Read(&s.last, bt.p.logits.Rows(i, i+1)); err != nil { // by pointer: no allocation
				return err
			}
			s.pos++
			s.tokens = append(s.tokens, tokens[i])
			if err := s.commitLogs(1); err != nil {
				s.broken = err
				return err
			}
		}
		sessions, tokens = sessions[g:], tokens[g:]
	}
	return nil
}

func (bt *Batch) forward(sessions []*Session, tokens []int32) error {
	bt.cur = sessions
	err := bt.p.run(tokens, bt.mix, nil, true)
	bt.cur = nil
	return err
}

// mixLayer runs layer l's token mixer for one token of every session,
// each against its own state.
func (bt *Batch) mixLayer(l int, normed, out compute.Tensor) error {
	if kl := bt.kdaL[l]; kl != nil {
		bt.states = bt.states[:0]
		for _, s := range bt.cur {
			bt.states = append(bt.states, s.kdaSt[l])
		}
		n := len(bt.cur)
		if err := kl.DecodeBatch(normed, bt.states, bt.rec.rows(n), out); err != nil {
			return err
		}
		return bt.rec.appendEach(bt.m.b, bt.cur, l)
	}
	bt.caches = bt.caches[:0]
	for _, s := range bt.cur {
		bt.caches = append(bt.caches, s.caches[l])
	}
	return bt.mlaL[l].ForwardBatch(normed, bt.caches, out)
}
