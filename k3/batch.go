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
// the weights (Step), or a short run of tokens for each (Forward): every
// projection and expert reads its weights once for the whole batch, while
// each session keeps its own caches and states. Results equal decoding
// each session alone, bitwise. Sessions may differ from one Step to
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
	caches []*dsa.Cache // one per row
	rec    *recorder
	cu     []int32 // the running group's row offsets per session
	cuAll  []int32 // Step's offsets: one row per session
}

// NewBatch prepares a batch of up to max rows per pass: max sessions a
// Step, or max tokens in all a Forward.
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
	if n != len(tokens) {
		return fmt.Errorf("k3: batch step with %d sessions but %d tokens (one token per session)", n, len(tokens))
	}
	bt.cuAll = bt.cuAll[:0]
	for i := range n + 1 {
		bt.cuAll = append(bt.cuAll, int32(i))
	}
	return bt.run(ctx, sessions, bt.cuAll, tokens, nil)
}

// Forward feeds tokens[i] (at least one, at most ExactTokens) to
// sessions[i] for every i in one ragged pass and returns the logits of
// every new position, session after session ([Σ len(tokens[i])][vocab]).
// Each session's rows are computed with the single-step arithmetic, so
// the logits and states are bitwise those of each session's tokens fed one
// by one alone; this is how drafted tokens of many sequences are verified
// together. The rows of one call must fit the batch (NewBatch's limit).
func (bt *Batch) Forward(ctx context.Context, sessions []*Session, tokens [][]int32) ([]float32, error) {
	if len(sessions) != len(tokens) {
		return nil, fmt.Errorf("k3: batch forward with %d sessions but %d token lists", len(sessions), len(tokens))
	}
	cu := []int32{0}
	var flat []int32
	for i, ts := range tokens {
		if len(ts) == 0 || len(ts) > ExactTokens {
			return nil, fmt.Errorf("k3: batch forward: session %d has %d tokens, want 1..%d", i, len(ts), ExactTokens)
		}
		flat = append(flat, ts...)
		cu = append(cu, int32(len(flat)))
	}
	out := make([]float32, len(flat)*bt.m.Config.VocabSize)
	if err := bt.run(ctx, sessions, cu, flat, out); err != nil {
		return nil, err
	}
	return out, nil
}

// run feeds sessions[i] the tokens ids[cu[i]:cu[i+1]], and writes every
// row's logits to out when it is not nil.
func (bt *Batch) run(ctx context.Context, sessions []*Session, cu, ids []int32, out []float32) error {
	n := len(sessions)
	rows := len(ids)
	switch {
	case n == 0:
		return errors.New("k3: batch step with no sessions")
	case rows > bt.max:
		return fmt.Errorf("k3: batch step with %d rows, more than the batch's limit of %d (NewBatch(%d))", rows, bt.max, bt.max)
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
		for _, t := range ids[cu[i]:cu[i+1]] {
			if t < 0 || int(t) >= cfg.VocabSize {
				return fmt.Errorf("%w: token %d for session %d", ErrBadToken, t, i)
			}
		}
		if k := int(cu[i+1] - cu[i]); s.pos+k > s.limit {
			return fmt.Errorf("%w: session %d holds %d tokens, %d more exceed %d", ErrContextFull, i, s.pos, k, s.limit)
		}
		for j := 0; j < i; j++ {
			if sessions[j] == s {
				return fmt.Errorf("k3: session %d appears twice in one batch step", i)
			}
		}
	}
	// A backend promises row-count-independent results only up to
	// compute.InvariantRows rows, so larger batches run in groups of
	// sessions: each session still gets exactly its solo logits, and the
	// weights are read once per group (by then the step is bound by
	// arithmetic, not reads).
	for first := 0; first < n; {
		last := first + 1
		for last < n && cu[last+1]-cu[first] <= compute.InvariantRows {
			last++
		}
		r0, r1 := int(cu[first]), int(cu[last])
		bt.cu = bt.cu[:0]
		for i := first; i <= last; i++ {
			bt.cu = append(bt.cu, cu[i]-cu[first])
		}
		if err := bt.forward(sessions[first:last], ids[r0:r1]); err != nil {
			for _, s := range sessions {
				s.broken = err
			}
			return err
		}
		v := cfg.VocabSize
		if out != nil {
			if err := b.Read(out[r0*v:r1*v], bt.p.logits.Rows(0, r1-r0)); err != nil {
				return err
			}
		}
		for i, s := range sessions[first:last] {
			end := int(bt.cu[i+1])
			if s.last == nil {
				s.last = make([]float32, v)
			}
			if err := b.Read(&s.last, bt.p.logits.Rows(end-1, end)); err != nil { // by pointer: no allocation
				return err
			}
			k := int(bt.cu[i+1] - bt.cu[i])
			s.pos += k
			s.tokens = append(s.tokens, ids[r0+int(bt.cu[i]):r0+end]...)
			if err := s.commitLogs(k); err != nil {
				s.broken = err
				return err
			}
			if err := s.takeSnapshot(); err != nil {
				s.broken = err
				return err
			}
		}
		first = last
	}
	return nil
}

func (bt *Batch) forward(sessions []*Session, tokens []int32) error {
	bt.cur = sessions
	err := bt.p.run(tokens, bt.mix, nil, true)
	bt.cur = nil
	return err
}

// mixLayer runs layer l's token mixer for the rows of every session, each
// against its own state.
func (bt *Batch) mixLayer(l int, normed, out compute.Tensor) error {
	rows := int(bt.cu[len(bt.cu)-1])
	if kl := bt.kdaL[l]; kl != nil {
		bt.states = bt.states[:0]
		for _, s := range bt.cur {
			bt.states = append(bt.states, s.kdaSt[l])
		}
		if err := kl.DecodeBatch(normed, bt.states, bt.cu, bt.rec.rows(rows), out); err != nil {
			return err
		}
		return bt.rec.appendRuns(bt.m.b, bt.cur, bt.cu, l)
	}
	bt.caches = bt.caches[:0]
	for i, s := range bt.cur {
		for range bt.cu[i+1] - bt.cu[i] {
			bt.caches = append(bt.caches, s.caches[l])
		}
	}
	return bt.mlaL[l].ForwardBatch(normed, bt.caches, out)
}
