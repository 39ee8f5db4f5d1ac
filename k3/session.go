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

// ErrContextFull is returned when a session has no room for more tokens.
var ErrContextFull = errors.New("k3: context length exceeded")

// ErrBadToken is wrapped when a token id lies outside the vocabulary.
var ErrBadToken = errors.New("k3: token id outside the vocabulary")

// Session holds one sequence's state: KDA conv and recurrent states, the
// latent KV and index-key caches of the MLA/DSA layers, and the scratch of
// one forward pass. A Session is not safe for concurrent use; run many
// sessions for many conversations.
type Session struct {
	m      *Model
	kdaSt  []*kda.State
	caches []*dsa.Cache
	kdaL   []*kda.Layer
	mlaL   []*dsa.Layer
	moeL   []*moe.Layer
	mlpL   []*moe.MLPRunner
	stream *attnres.Stream

	ids                               compute.Tensor // [chunk] I32
	x, h, normed, attnOut, mlpOut, fh compute.Tensor // [chunk, D]
	logits                            compute.Tensor // [chunk, V]
	pos                               int
	limit                             int

	tokens []int32   // every token fed so far
	last   []float32 // logits after the last token (nil before any)
	broken error     // set when a forward pass failed halfway
}

// NewSession starts an empty sequence.
func (m *Model) NewSession() (*Session, error) {
	cfg := m.Config
	s := &Session{m: m, limit: cfg.MaxPositionEmbeddings}
	if s.limit <= 0 {
		s.limit = 1 << 20
	}
	n, b, d := m.chunk, m.b, cfg.HiddenSize
	var err error
	alloc := func(dt compute.DType, dims ...int) compute.Tensor {
		if err != nil {
			return compute.Tensor{}
		}
		var t compute.Tensor
		t, err = b.Alloc(dt, dims...)
		return t
	}
	s.ids = alloc(compute.I32, n)
	s.x, s.h, s.normed = alloc(compute.F32, n, d), alloc(compute.F32, n, d), alloc(compute.F32, n, d)
	s.attnOut, s.mlpOut, s.fh = alloc(compute.F32, n, d), alloc(compute.F32, n, d), alloc(compute.F32, n, d)
	s.logits = alloc(compute.F32, n, cfg.VocabSize)
	if err != nil {
		return nil, err
	}
	for l, ly := range m.layers {
		var ks *kda.State
		var kl *kda.Layer
		var c *dsa.Cache
		var ml *dsa.Layer
		switch ly.kind {
		case config.KDA:
			if ks, err = kda.NewState(b, ly.kdaCfg, 1); err != nil {
				return nil, err
			}
			if kl, err = kda.NewLayer(b, ly.kdaCfg, ly.kda, n); err != nil {
				return nil, err
			}
		default:
			if c, err = dsa.NewCache(b, ly.mlaCfg, min(s.limit, max(n, 64)), s.limit); err != nil {
				return nil, err
			}
			if ml, err = dsa.NewLayer(b, ly.mlaCfg, ly.mla, n); err != nil {
				return nil, err
			}
		}
		s.kdaSt, s.kdaL = append(s.kdaSt, ks), append(s.kdaL, kl)
		s.caches, s.mlaL = append(s.caches, c), append(s.mlaL, ml)
		var me *moe.Layer
		var mr *moe.MLPRunner
		if ly.moe != nil {
			if me, err = moe.NewLayer(b, ly.moe, ly.router, n); err != nil {
				return nil, fmt.Errorf("k3: layer %d: %w", l, err)
			}
		} else if mr, err = moe.NewMLPRunner(b, ly.mlp, n); err != nil {
			return nil, fmt.Errorf("k3: layer %d: %w", l, err)
		}
		s.moeL, s.mlpL = append(s.moeL, me), append(s.mlpL, mr)
	}
	if cfg.AttnResBlockSize > 0 {
		if s.stream, err = attnres.NewStream(b, m.resQueries, m.outQuery, 2*cfg.AttnResBlockSize, n, float32(cfg.RMSNormEps)); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Len returns the number of tokens in the session.
func (s *Session) Len() int { return s.pos }

// Trace collects per-layer intermediate tensors of a forward pass (host
// copies, row-major over the pass's tokens) for debugging and conformance.
// Slices are indexed by layer, or by DSA/MoE layer in layer order.
type Trace struct {
	HiddenAfterLayer      [][]float32
	AttnInput, MLPInput   [][]float32
	AttnOutput, MLPOutput [][]float32
	FinalHidden           []float32
	DSAIndices            [][]int32
	MoEIndices            [][]int32
	MoEWeights            [][]float32
}

// Forward appends tokens to the sequence and returns the logits of every
// new position ([len(tokens)][vocab], row-major). Long inputs run in chunks;
// ctx is checked between chunks. tr, when not nil, receives intermediates.
func (s *Session) Forward(ctx context.Context, tokens []int32, tr *Trace) ([]float32, error) {
	return s.run(ctx, tokens, true, tr)
}

// Tokens returns the tokens the session holds.
func (s *Session) Tokens() []int32 { return append([]int32(nil), s.tokens...) }

// run feeds tokens and keeps the last position's logits; with all it also
// returns every position's logits. Inputs are checked before any state
// changes, so bad input leaves the session as it was.
func (s *Session) run(ctx context.Context, tokens []int32, all bool, tr ...*Trace) ([]float32, error) {
	if s.broken != nil {
		return nil, fmt.Errorf("k3: session unusable after an earlier failure (Reset or Truncate it): %w", s.broken)
	}
	v := s.m.Config.VocabSize
	if len(tokens) == 0 {
		return nil, ErrEmptyPrompt
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= v {
			return nil, fmt.Errorf("%w: token %d at index %d (vocabulary %d)", ErrBadToken, t, i, v)
		}
	}
	if s.pos+len(tokens) > s.limit {
		return nil, fmt.Errorf("%w: %d tokens after %d exceed %d", ErrContextFull, len(tokens), s.pos, s.limit)
	}
	var trace *Trace
	if len(tr) > 0 {
		trace = tr[0]
	}
	var out []float32
	if all {
		out = make([]float32, len(tokens)*v)
	}
	if s.last == nil {
		s.last = make([]float32, v)
	}
	for c0 := 0; c0 < len(tokens); c0 += s.m.chunk {
		if err := ctx.Err(); err != nil {
			// Between chunks the state is consistent: it holds c0 tokens.
			return nil, err
		}
		c1 := min(c0+s.m.chunk, len(tokens))
		if err := s.step(tokens[c0:c1], trace, all); err != nil {
			s.broken = err
			return nil, err
		}
		s.tokens = append(s.tokens, tokens[c0:c1]...)
		rows := 1
		if all {
			rows = c1 - c0
			if err := s.m.b.Read(out[c0*v:c1*v], s.logits.Rows(0, rows)); err != nil {
				return nil, err
			}
			copy(s.last, out[(c1-1)*v:c1*v])
		} else if err := s.m.b.Read(s.last, s.logits.Rows(0, 1)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Reset empties the session.
func (s *Session) Reset() error {
	for _, st := range s.kdaSt {
		if st == nil {
			continue
		}
		if err := s.m.b.Write(st.Conv, make([]float32, st.Conv.Len())); err != nil {
			return err
		}
		if err := s.m.b.Write(st.S, make([]float32, st.S.Len())); err != nil {
			return err
		}
	}
	for _, c := range s.caches {
		if c != nil {
			c.Truncate(0)
		}
	}
	s.pos, s.tokens, s.last, s.broken = 0, s.tokens[:0], nil, nil
	return nil
}

// Truncate keeps the first n tokens. Attention caches truncate in place;
// the KDA recurrent state cannot be rewound without checkpoints, so the
// session is rebuilt by running the kept tokens again (cost: a prefill of
// n tokens).
func (s *Session) Truncate(ctx context.Context, n int) error {
	if n < 0 || n > len(s.tokens) {
		return fmt.Errorf("k3: truncate to %d of %d tokens", n, len(s.tokens))
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

// Clone returns an independent copy of the session (fork a conversation).
func (s *Session) Clone() (*Session, error) {
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
			if err := c.caches[l].CopyFrom(src); err != nil {
				return nil, err
			}
		}
	}
	c.pos, c.tokens = s.pos, append([]int32(nil), s.tokens...)
	if s.last != nil {
		c.last = append([]float32(nil), s.last...)
	}
	return c, nil
}

// StateBytes returns the memory the session's per-sequence state holds:
// KDA states and conv caches, attention caches and scratch.
func (s *Session) StateBytes() int64 {
	var n int64
	for l := range s.kdaSt {
		if st := s.kdaSt[l]; st != nil {
			n += 4 * int64(st.Conv.Len()+st.S.Len())
		}
		if c := s.caches[l]; c != nil {
			n += c.Bytes()
		}
	}
	return n
}

func (s *Session) readF32(t compute.Tensor) []float32 {
	v := make([]float32, t.Len())
	s.m.b.Read(v, t)
	return v
}

func (s *Session) readI32(t compute.Tensor) []int32 {
	v := make([]int32, t.Len())
	s.m.b.Read(v, t)
	return v
}

// step runs one forward pass over at most chunk tokens.
func (s *Session) step(tokens []int32, tr *Trace, allLogits bool) error {
	if s.pos+len(tokens) > s.limit {
		return fmt.Errorf("%w: %d tokens after %d exceed %d", ErrContextFull, len(tokens), s.pos, s.limit)
	}
	m, b := s.m, s.m.b
	cfg := m.Config
	t := len(tokens)
	eps := float32(cfg.RMSNormEps)
	ids := s.ids.Rows(0, t)
	if err := b.Write(ids, tokens); err != nil {
		return err
	}
	x, h, normed := s.x.Rows(0, t), s.h.Rows(0, t), s.normed.Rows(0, t)
	attnOut, mlpOut := s.attnOut.Rows(0, t), s.mlpOut.Rows(0, t)
	if err := b.Embedding(x, m.embed, ids); err != nil {
		return err
	}
	useRes := s.stream != nil
	if useRes {
		if err := s.stream.Begin(x); err != nil {
			return err
		}
	}
	var prev compute.Tensor // the previous sublayer's output (AttnRes)
	for l, ly := range m.layers {
		// Attention sublayer.
		in := x
		if useRes {
			if err := s.stream.Next(prev, h); err != nil {
				return fmt.Errorf("k3: layer %d attnres: %w", l, err)
			}
			in = h
		}
		if tr != nil && useRes {
			tr.AttnInput = append(tr.AttnInput, s.readF32(in))
		}
		if err := b.RMSNorm(normed, in, ly.attnNorm, eps); err != nil {
			return err
		}
		var err error
		switch ly.kind {
		case config.KDA:
			if t == 1 {
				err = s.kdaL[l].Decode(normed, s.kdaSt[l], attnOut)
			} else {
				err = s.kdaL[l].Prefill(normed, nil, s.kdaSt[l], attnOut)
			}
		default:
			err = s.mlaL[l].Forward(normed, s.caches[l], attnOut)
			if err == nil && tr != nil && ly.kind == config.DSA {
				tr.DSAIndices = append(tr.DSAIndices, s.readI32(s.mlaL[l].Indices(t)))
			}
		}
		if err != nil {
			return fmt.Errorf("k3: layer %d attention: %w", l, err)
		}
		if tr != nil {
			tr.AttnOutput = append(tr.AttnOutput, s.readF32(attnOut))
		}
		// MLP sublayer.
		if useRes {
			if err := s.stream.Next(attnOut, h); err != nil {
				return fmt.Errorf("k3: layer %d attnres: %w", l, err)
			}
			in = h
			if tr != nil {
				tr.MLPInput = append(tr.MLPInput, s.readF32(in))
			}
		} else {
			if err := b.Binary(compute.Add, x, x, attnOut); err != nil {
				return err
			}
		}
		if err := b.RMSNorm(normed, in, ly.mlpNorm, eps); err != nil {
			return err
		}
		if me := s.moeL[l]; me != nil {
			err = me.Forward(normed, mlpOut, compute.Tensor{}, compute.Tensor{})
			if err == nil && tr != nil {
				idx, wts := me.Routing(t)
				tr.MoEIndices = append(tr.MoEIndices, s.readI32(idx))
				tr.MoEWeights = append(tr.MoEWeights, s.readF32(wts))
			}
		} else {
			err = s.mlpL[l].Forward(normed, mlpOut)
		}
		if err != nil {
			return fmt.Errorf("k3: layer %d feed-forward: %w", l, err)
		}
		if tr != nil {
			tr.MLPOutput = append(tr.MLPOutput, s.readF32(mlpOut))
		}
		if useRes {
			prev = mlpOut
			if tr != nil {
				p, _ := s.stream.Partial()
				after := s.readF32(p)
				for i, v := range s.readF32(mlpOut) {
					after[i] += v
				}
				tr.HiddenAfterLayer = append(tr.HiddenAfterLayer, after)
			}
		} else {
			if err := b.Binary(compute.Add, x, x, mlpOut); err != nil {
				return err
			}
			if tr != nil {
				tr.HiddenAfterLayer = append(tr.HiddenAfterLayer, s.readF32(x))
			}
		}
	}
	final := x
	if useRes {
		if err := s.stream.Final(prev, h); err != nil {
			return err
		}
		final = h
	}
	fh := s.fh.Rows(0, t)
	if err := b.RMSNorm(fh, final, m.norm, eps); err != nil {
		return err
	}
	if tr != nil {
		tr.FinalHidden = append(tr.FinalHidden, s.readF32(fh)...)
	}
	rows := fh
	if !allLogits {
		rows = fh.Rows(t-1, t)
	}
	if err := b.MatMul(s.logits.Rows(0, rows.Dim(0)), rows, m.lmHead); err != nil {
		return err
	}
	s.pos += t
	return nil
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
