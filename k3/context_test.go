package k3

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/comm"
)

// A sequence split over CP ranks (each CP slice alone or a TP group)
// gives the tokens of one model, with
// logits within 1e-4 of the logit scale and the same DSA selections, on
// every conformance checkpoint: a prompt split head and tail, a
// continuation split again, a run too short to split, then decode steps;
// each rank's attention caches hold only its share of the positions.
func TestGroupContextParallel(t *testing.T) {
	dirs := testModels(t)
	ctx := context.Background()
	layouts := []Layout{{CP: 2}, {CP: 3}, {CP: 4}, {CP: 2, TP: 2}, {CP: 2, TP: 4},
		{CP: 2, EP: 2}, {CP: 4, EP: 4}, {CP: 2, TP: 2, EP: 4}}
	if raceEnabled {
		layouts = []Layout{{CP: 3}, {CP: 2, TP: 2}, {CP: 2, TP: 2, EP: 4}}
	}
	feeds := []int{37, 11, 3} // then single tokens
	const steps = 8
	for _, cfgPath := range dirs {
		dir := filepath.Dir(cfgPath)
		one, err := Load(ctx, dir)
		require.NoError(t, err)
		v := one.Config.VocabSize
		tokens := make([]int32, 0, 64)
		for i := range 51 {
			tokens = append(tokens, int32((i*131+7)%v))
		}
		// One model: the feeds, then greedy steps, with a trace of the first.
		s, err := one.NewSession()
		require.NoError(t, err)
		var wantTr Trace
		var want []float32
		at := 0
		for i, n := range feeds {
			c := ctx
			if i == 0 {
				c = WithTrace(ctx, &wantTr)
			}
			row, err := s.Forward(c, tokens[at:at+n])
			require.NoError(t, err)
			want, at = append(want, row...), at+n
		}
		var wantToks []int32
		for range steps {
			tok := argmax(want[len(want)-v:])
			wantToks = append(wantToks, tok)
			row, err := s.Forward(ctx, []int32{tok})
			require.NoError(t, err)
			want = append(want, row...)
		}
		s.Close()
		gen, err := one.NewSession()
		require.NoError(t, err)
		var wantGen []int32
		for tok, err := range gen.GenerateTokens(ctx, tokens[:at], WithMaxTokens(steps), WithoutDefaultStops()) {
			require.NoError(t, err)
			wantGen = append(wantGen, tok.ID)
		}
		gen.Close()
		hasKDA, hasAttn, hasMoE := kinds(one.Config)
		cfg := one.Config
		one.Close()
		scale := maxAbsF(want)
		for _, l := range layouts {
			t.Run(fmt.Sprintf("%s/%v", filepath.Base(dir), l), func(t *testing.T) {
				g := loadGroupFitting(t, dir, cfg, l)
				defer g.Close()
				gs, err := g.NewSession()
				require.NoError(t, err)
				defer gs.Close()
				var tr Trace
				var got []float32
				at := 0
				for i, k := range feeds {
					c := ctx
					if i == 0 {
						c = WithTrace(ctx, &tr)
					}
					row, err := gs.Forward(c, tokens[at:at+k])
					require.NoError(t, err)
					got, at = append(got, row...), at+k
				}
				var toks []int32
				for range steps {
					tok := argmax(got[len(got)-v:])
					toks = append(toks, tok)
					row, err := gs.Forward(ctx, []int32{tok})
					require.NoError(t, err)
					got = append(got, row...)
				}
				require.Equal(t, wantToks, toks)
				require.Len(t, got, len(want))
				worst := 0.0
				for i := range want {
					worst = max(worst, math.Abs(float64(got[i]-want[i])))
				}
				assert.LessOrEqual(t, worst, 1e-4*scale, "largest logit difference, logit scale %.3g", scale)

				// The first feed's trace, merged from the ranks.
				require.Len(t, tr.HiddenAfterLayer, len(wantTr.HiddenAfterLayer))
				for l := range wantTr.HiddenAfterLayer {
					w, h := wantTr.HiddenAfterLayer[l], tr.HiddenAfterLayer[l]
					require.Len(t, h, len(w))
					sc := maxAbsF(w)
					for i := range w {
						require.InDelta(t, w[i], h[i], 1e-4*sc, "layer %d hidden %d", l, i)
					}
				}
				assert.Equal(t, wantTr.DSAIndices, tr.DSAIndices, "DSA selections")
				assert.Equal(t, wantTr.MoEIndices, tr.MoEIndices, "routed experts")

				// Every rank holds a share of the positions, not all.
				total := at + steps
				held := 0
				for r, q := range gs.cp {
					h := q.place.Held(r / max(l.TP, 1))
					if r%max(l.TP, 1) == 0 {
						held += h
					}
					assert.Less(t, h, total, "rank %d holds %d of %d positions", r, h, total)
					for l, c := range q.cache {
						if c != nil {
							assert.Equal(t, h, c.Len, "rank %d layer %d cache", r, l)
						}
					}
				}
				assert.Equal(t, total, held)
				st := g.Stats()
				if hasKDA {
					assert.Positive(t, st.Bytes[comm.OpSend], "KDA states travelled")
				}
				if hasAttn {
					assert.Positive(t, st.Bytes[comm.OpAllToAllV], "keys travelled")
				}
				if l.TP > 1 {
					assert.Positive(t, st.Bytes[comm.OpAllReduce], "each CP slice's TP group added its heads' sums")
				}
				if l.EP > 1 && hasMoE {
					// Every rank holds its share of the experts alone (a
					// count that does not divide leaves some one more), so
					// tokens travelled to them.
					for r, m := range g.Ranks() {
						for li, ly := range m.layers {
							if ly.moe != nil {
								e := m.Config.MoE.NumExperts
								assert.GreaterOrEqual(t, len(ly.moe.W1), e/l.EP, "rank %d layer %d's experts", r, li)
								assert.LessOrEqual(t, len(ly.moe.W1), (e+l.EP-1)/l.EP, "rank %d layer %d's experts", r, li)
							}
						}
					}
					assert.Positive(t, st.Calls[comm.OpAllToAllV], "slots dispatched")
				}

				// Generate on a fresh session: the tokens of one model.
				gs2, err := g.NewSession()
				require.NoError(t, err)
				defer gs2.Close()
				var gotGen []int32
				for tok, err := range gs2.GenerateTokens(ctx, tokens[:at], WithMaxTokens(steps), WithoutDefaultStops()) {
					require.NoError(t, err)
					gotGen = append(gotGen, tok.ID)
				}
				assert.Equal(t, wantGen, gotGen)
			})
		}
	}
}

func TestContextParallelLayoutErrors(t *testing.T) {
	ctx := context.Background()
	for _, l := range []Layout{{CP: 2, EP: 4}, {CP: 2, TP: 2, EP: 2}, {CP: 2, Dispatch: true}, {CP: 4, EP: 2}, {CP: 16, EP: 16}, {CP: -1}} {
		_, err := LoadGroup(ctx, "../testdata/model/tiny_k3", l)
		assert.ErrorIs(t, err, ErrInvalidOption, "%+v", l)
	}
	g, err := LoadGroup(ctx, "../testdata/model/tiny_k3", Layout{CP: 2})
	require.NoError(t, err)
	defer g.Close()
	gs, err := g.NewSession()
	require.NoError(t, err)
	_, err = gs.Forward(ctx, nil)
	assert.ErrorIs(t, err, ErrEmptyPrompt)
	_, err = gs.Forward(ctx, []int32{-1, 3})
	assert.ErrorIs(t, err, ErrBadToken)
	require.NoError(t, gs.Close())
	_, err = gs.Forward(ctx, []int32{1})
	assert.ErrorIs(t, err, ErrSessionClosed)
}
