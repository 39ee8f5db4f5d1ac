package k3

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/dsa"
)

// livePages is the attention-cache pages the model's sessions hold.
func livePages(m *Model) int {
	n := 0
	for _, ly := range m.layers {
		if ly.pages != nil {
			live, _ := ly.pages.Pages()
			n += live
		}
	}
	return n
}

// attnLayers is the model's attention layers.
func attnLayers(m *Model) int {
	n := 0
	for _, ly := range m.layers {
		if ly.pages != nil {
			n++
		}
	}
	return n
}

// TestForkSharesPages: a fork shares its parent's full pages and copies
// only the partial last one; parent and fork then diverge exactly as two
// sessions built independently would, bitwise, also when the parent
// truncates into a shared page and writes it again.
func TestForkSharesPages(t *testing.T) {
	dirs := testModels(t)
	ctx := context.Background()
	for _, cfg := range dirs {
		dir := filepath.Dir(cfg)
		m, err := Load(ctx, dir, WithRollback(4))
		require.NoError(t, err)
		if attnLayers(m) == 0 {
			m.Close()
			continue
		}
		r := rand.New(rand.NewPCG(17, 1))
		v := int32(m.VocabSize())
		tokens := func(n int) []int32 {
			ts := make([]int32, n)
			for i := range ts {
				ts[i] = r.Int32N(v)
			}
			return ts
		}
		prompt := tokens(3*dsa.PageSize + 10)
		a, err := m.NewSession()
		require.NoError(t, err)
		_, err = a.Forward(ctx, prompt)
		require.NoError(t, err)
		before := livePages(m)
		f, err := a.Fork()
		require.NoError(t, err)
		assert.Equal(t, before+attnLayers(m), livePages(m), "%s: a fork copies one page a layer", filepath.Base(dir))

		// Independent twins of both, built from scratch.
		twinA, err := m.NewSession()
		require.NoError(t, err)
		_, err = twinA.Forward(ctx, prompt)
		require.NoError(t, err)
		twinF, err := twinA.Clone()
		require.NoError(t, err)
		// The deep copy would have been bitwise the same: compare logits.
		contA, contF := tokens(40), tokens(70)
		for _, step := range []struct {
			s, twin *Session
			toks    []int32
		}{{a, twinA, contA}, {f, twinF, contF}} {
			for _, tok := range step.toks {
				_, err := step.s.Forward(ctx, []int32{tok})
				require.NoError(t, err)
				_, err = step.twin.Forward(ctx, []int32{tok})
				require.NoError(t, err)
				require.Equal(t, step.twin.Logits(), step.s.Logits(), "%s: diverged sessions", filepath.Base(dir))
			}
		}
		// The parent goes back into a page the fork still shares and
		// writes it again (a rollback within the replay logs' reach, from
		// just past a page's end): the fork must not see it.
		for f.Len()%dsa.PageSize != 2 {
			tok := tokens(1)
			_, err := f.Forward(ctx, tok)
			require.NoError(t, err)
			_, err = twinF.Forward(ctx, tok)
			require.NoError(t, err)
		}
		g, err := f.Clone()
		require.NoError(t, err)
		shared := livePages(m)
		require.NoError(t, f.Truncate(ctx, f.Len()-4))
		for _, tok := range tokens(30) {
			_, err := f.Forward(ctx, []int32{tok})
			require.NoError(t, err)
		}
		assert.Greater(t, livePages(m), shared, "%s: the rewritten page was copied", filepath.Base(dir))
		next := tokens(1)
		_, err = g.Forward(ctx, next)
		require.NoError(t, err)
		_, err = twinF.Forward(ctx, next)
		require.NoError(t, err)
		require.Equal(t, twinF.Logits(), g.Logits(), "%s: a fork after its parent rewrote a shared page", filepath.Base(dir))

		for _, s := range []*Session{a, f, g, twinA, twinF} {
			require.NoError(t, s.Close())
		}
		assert.Zero(t, livePages(m), "%s: pages held after every session closed", filepath.Base(dir))
		m.Close()
	}
}
