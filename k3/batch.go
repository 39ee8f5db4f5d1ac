package k3

import (
	"context"
	"errors"
	"fmt"

	"k3/attnres"
	"k3/dsa"
	"k3/internal/compute"
	"k3/internal/config"
	"k3/internal/moe"
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
	moeL   []*moe.Layer
	mlpL   []*moe.MLPRunner
	stream *attnres.Stream

	ids                           compute.Tensor
	x, h, normed, attnOut, mlpOut compute.Tensor
	fh, logits                    compute.Tensor
	states                        []*kda.State
	caches                        []*dsa.Cache
	toks                          []int32
}

// NewBatch prepares a batch of up to max sessions.
func (m *Model) NewBatch(max int) (*Batch, error) {
	if max <= 0 {
		return nil, fmt.Errorf("k3: batch size %d must be positive", max)
	}
	cfg, b := m.Config, m.b
	bt := &Batch{m: m, max: max}
	var err error
	alloc := func(dt compute.DType, dims ...int) compute.Tensor {
		if err != nil {
			return compute.Tensor{}
		}
		var t compute.Tensor
		t, err = b.Alloc(dt, dims...)
		return t
	}
	d := cfg.HiddenSize
	bt.ids = alloc(compute.I32, max)
	bt.x, bt.h, bt.normed = alloc(compute.F32, max, d), alloc(compute.F32, max, d), alloc(compute.F32, max, d)
	bt.attnOut, bt.mlpOut, bt.fh = alloc(compute.F32, max, d), alloc(compute.F32, max, d), alloc(compute.F32, max, d)
	bt.logits = alloc(compute.F32, max, cfg.VocabSize)
	if err != nil {
		return nil, err
	}
	for _, ly := range m.layers {
		var kl *kda.Layer
		var ml *dsa.Layer
		if ly.kind == config.KDA {
			kl, err = kda.NewLayer(b, ly.kdaCfg, ly.kda, 1)
		} else {
			ml, err = dsa.NewLayer(b, ly.mlaCfg, ly.mla, max)
		}
		if err != nil {
			return nil, err
		}
		bt.kdaL, bt.mlaL = append(bt.kdaL, kl), append(bt.mlaL, ml)
		var me *moe.Layer
		var mr *moe.MLPRunner
		if ly.moe != nil {
			me, err = moe.NewLayer(b, ly.moe, ly.router, max)
		} else {
			mr, err = moe.NewMLPRunner(b, ly.mlp, max)
		}
		if err != nil {
			return nil, err
		}
		bt.moeL, bt.mlpL = append(bt.moeL, me), append(bt.mlpL, mr)
	}
	if cfg.AttnResBlockSize > 0 {
		if bt.stream, err = attnres.NewStream(b, m.resQueries, m.outQuery, 2*cfg.AttnResBlockSize, max, float32(cfg.RMSNormEps)); err != nil {
			return nil, err
		}
	}
	return bt, nil
}

// Step feeds tokens[i] to sessions[i] for every i, in one pass. Each
// session's next-token logits are then available to its generation (and
// through Logits).
func (bt *Batch) Step(ctx context.Context, sessions []*Session, tokens []int32) error {
	n := len(sessions)
	if n == 0 || n != len(tokens) || n > bt.max {
		return fmt.Errorf("k3: batch step with %d sessions and %d tokens (batch size %d)", n, len(tokens), bt.max)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m, b := bt.m, bt.m.b
	cfg := m.Config
	for i, s := range sessions {
		if s.m != m {
			return errors.New("k3: batch step with a session of another model")
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
	if err := bt.forward(sessions, tokens); err != nil {
		for _, s := range sessions {
			s.broken = err
		}
		return err
	}
	v := cfg.VocabSize
	for i, s := range sessions {
		if s.last == nil {
			s.last = make([]float32, v)
		}
		if err := b.Read(s.last, bt.logits.Rows(i, i+1)); err != nil {
			return err
		}
		s.pos++
		s.tokens = append(s.tokens, tokens[i])
	}
	return nil
}

func (bt *Batch) forward(sessions []*Session, tokens []int32) error {
	m, b := bt.m, bt.m.b
	cfg := m.Config
	t := len(sessions)
	eps := float32(cfg.RMSNormEps)
	ids := bt.ids.Rows(0, t)
	if err := b.Write(ids, tokens); err != nil {
		return err
	}
	x, h, normed := bt.x.Rows(0, t), bt.h.Rows(0, t), bt.normed.Rows(0, t)
	attnOut, mlpOut := bt.attnOut.Rows(0, t), bt.mlpOut.Rows(0, t)
	if err := b.Embedding(x, m.embed, ids); err != nil {
		return err
	}
	useRes := bt.stream != nil
	if useRes {
		if err := bt.stream.Begin(x); err != nil {
			return err
		}
	}
	var prev compute.Tensor
	for l, ly := range m.layers {
		in := x
		if useRes {
			if err := bt.stream.Next(prev, h); err != nil {
				return err
			}
			in = h
		}
		if err := b.RMSNorm(normed, in, ly.attnNorm, eps); err != nil {
			return err
		}
		var err error
		if ly.kind == config.KDA {
			bt.states = bt.states[:0]
			for _, s := range sessions {
				bt.states = append(bt.states, s.kdaSt[l])
			}
			err = bt.kdaL[l].DecodeBatch(normed, bt.states, attnOut)
		} else {
			bt.caches = bt.caches[:0]
			for _, s := range sessions {
				bt.caches = append(bt.caches, s.caches[l])
			}
			err = bt.mlaL[l].ForwardBatch(normed, bt.caches, attnOut)
		}
		if err != nil {
			return fmt.Errorf("k3: layer %d attention: %w", l, err)
		}
		if useRes {
			if err := bt.stream.Next(attnOut, h); err != nil {
				return err
			}
			in = h
		} else if err := b.Binary(compute.Add, x, x, attnOut); err != nil {
			return err
		}
		if err := b.RMSNorm(normed, in, ly.mlpNorm, eps); err != nil {
			return err
		}
		if me := bt.moeL[l]; me != nil {
			err = me.Forward(normed, mlpOut, compute.Tensor{}, compute.Tensor{})
		} else {
			err = bt.mlpL[l].Forward(normed, mlpOut)
		}
		if err != nil {
			return fmt.Errorf("k3: layer %d feed-forward: %w", l, err)
		}
		if useRes {
			prev = mlpOut
		} else if err := b.Binary(compute.Add, x, x, mlpOut); err != nil {
			return err
		}
	}
	final := x
	if useRes {
		if err := bt.stream.Final(prev, h); err != nil {
			return err
		}
		final = h
	}
	fh := bt.fh.Rows(0, t)
	if err := b.RMSNorm(fh, final, m.norm, eps); err != nil {
		return err
	}
	return b.MatMul(bt.logits.Rows(0, t), fh, m.lmHead)
}
