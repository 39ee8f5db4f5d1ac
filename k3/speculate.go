package k3

import (
	"context"
	"fmt"

	"k3/specdec"
)

// WithSpeculation makes Session.Generate speculate: after each drawn
// token, d proposes up to depth more, the session runs the token and its
// drafts in one exact pass, and the generation draws from that pass's
// logits in order, keeping each draft its own draw confirms and rolling the
// session back past the first that differs. The tokens are exactly those
// of plain decoding (greedy token for token; with sampling, the same
// tokens for the same seed), in fewer passes when drafts are accepted.
// The rollback uses the sessions' replay logs, so the model must be
// loaded WithRollback(n) with n >= depth; depth is at most ExactTokens-1.
// The Batcher does not speculate yet and refuses the option.
func WithSpeculation(d specdec.Drafter, depth int) GenerateOption {
	return func(o *genOptions) {
		switch {
		case d == nil:
			o.fail("speculation without a drafter")
		case depth < 1 || depth > ExactTokens-1:
			o.fail("speculation depth %d, want 1..%d", depth, ExactTokens-1)
		}
		o.drafter, o.depth = d, depth
	}
}

// speculation is a generation's drafts in flight: tokens the session
// already holds past the last token drawn, with the logits after each.
type speculation struct {
	drafter specdec.Drafter
	depth   int
	drafts  []int32   // fed, not yet confirmed by a draw
	rows    []float32 // rows[i*vocab:]: the logits after drafts[i]
	next    int       // drafts[:next] are confirmed
	hist    []int32   // scratch: the history handed to the drafter
	pass    []int32   // scratch: the verify pass's tokens
	out     []float32 // scratch: the verify pass's logits
}

// checkSpeculation reports whether the model can run o's speculation.
func (m *Model) checkSpeculation(o *genOptions) error {
	if o.drafter == nil {
		return nil
	}
	if m.rollback < o.depth {
		return fmt.Errorf("%w: speculation %d deep rolls back through the replay logs: load the model WithRollback(%d) or more (it has %d)", ErrInvalidOption, o.depth, o.depth, m.rollback)
	}
	return nil
}

// feed gives the session the token just drawn (done: the generation's
// last). Without speculation it is one decode step. With it, a draw equal
// to the next draft is already in the session: its row becomes the next
// logits. Otherwise the drafts still in flight are dropped, and the token
// goes in with new drafts in one exact pass whose first row becomes the
// next logits.
func (g *generation) feed(ctx context.Context, id int32, done bool) error {
	s, sp := g.s, g.spec
	if sp == nil {
		_, err := s.run(ctx, []int32{id}, false)
		return err
	}
	v := s.m.Config.VocabSize
	if sp.next < len(sp.drafts) {
		if sp.drafts[sp.next] == id {
			copy(s.last, sp.rows[sp.next*v:(sp.next+1)*v])
			sp.next++
			g.usage.AcceptedTokens++
			if done {
				return g.settle()
			}
			if sp.next == len(sp.drafts) {
				sp.drafts, sp.next = sp.drafts[:0], 0 // the next draw is the bonus token
			}
			return nil
		}
		if err := g.settle(); err != nil {
			return err
		}
	}
	if done {
		_, err := s.run(ctx, []int32{id}, false)
		return err
	}
	return g.verify(ctx, id)
}

// verify feeds id, the token just drawn, with up to depth drafts after it
// in one exact pass (one decode step when the drafter proposes none); the
// pass's first row becomes the session's logits and the others wait in
// sp.rows for the draws that may confirm their drafts.
func (g *generation) verify(ctx context.Context, id int32) error {
	s, sp := g.s, g.spec
	v := s.m.Config.VocabSize
	n := min(sp.depth, s.limit-s.pos-1, g.o.maxTokens-g.n)
	sp.drafts, sp.next = sp.drafts[:0], 0
	if n > 0 {
		sp.hist = append(append(sp.hist[:0], s.tokens...), id)
		sp.drafts = sp.drafter.Draft(sp.hist, n, sp.drafts)
		sp.drafts = sp.drafts[:min(len(sp.drafts), n)]
	}
	if len(sp.drafts) == 0 {
		_, err := s.run(ctx, []int32{id}, false)
		return err
	}
	for _, d := range sp.drafts {
		if d < 0 || int(d) >= v {
			sp.drafts = sp.drafts[:0]
			return fmt.Errorf("k3: the drafter proposed token %d outside the vocabulary (%d)", d, v)
		}
	}
	g.usage.DraftTokens += len(sp.drafts)
	sp.pass = append(append(sp.pass[:0], id), sp.drafts...)
	sp.out = growLogits(sp.out, len(sp.pass)*v)
	if err := s.runInto(ctx, sp.pass, sp.out); err != nil {
		sp.drafts = sp.drafts[:0]
		return err
	}
	copy(s.last, sp.out[:v])
	sp.rows = sp.out[v:]
	return nil
}

// settle drops the drafts the generation has not confirmed, so that the
// session holds exactly the tokens drawn and fed: the KDA states come back
// from the replay logs and the caches truncate in place; the logits the
// session keeps are the row the last draw read.
func (g *generation) settle() error {
	s, sp := g.s, g.spec
	if sp == nil || sp.next >= len(sp.drafts) {
		if sp != nil {
			sp.drafts, sp.next = sp.drafts[:0], 0
		}
		return nil
	}
	keep := s.pos - (len(sp.drafts) - sp.next)
	sp.drafts, sp.next = sp.drafts[:0], 0
	last := s.last
	ok, err := s.rollback(keep)
	if err != nil {
		s.broken = err
		return err
	}
	if !ok {
		// The logs always reach a pass back (checkSpeculation); Truncate
		// is the slow, still exact, way if they ever do not.
		return s.Truncate(context.Background(), keep)
	}
	s.last = last
	s.charge()
	return nil
}

func growLogits(v []float32, n int) []float32 {
	if cap(v) < n {
		return make([]float32, n)
	}
	return v[:n]
}
