package k3

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func tokensOf(t *testing.T, seq func(func(Token, error) bool)) []Token {
	t.Helper()
	var out []Token
	for tok, err := range seq {
		require.NoError(t, err)
		out = append(out, tok)
	}
	return out
}

func idsOf(toks []Token) []int32 {
	var ids []int32
	for _, t := range toks {
		ids = append(ids, t.ID)
	}
	return ids
}

// checkFinish: every item is a real token, only the last carries a reason,
// and the text adds up to the tokens' decoded text.
func checkFinish(t *testing.T, m *Model, toks []Token, want FinishReason) {
	t.Helper()
	require.NotEmpty(t, toks)
	var text strings.Builder
	for i, tok := range toks {
		assert.GreaterOrEqual(t, tok.ID, int32(0), "token %d", i)
		if i < len(toks)-1 {
			assert.Equal(t, FinishNone, tok.Finish, "token %d of %d", i, len(toks))
		}
		text.WriteString(tok.Text)
	}
	assert.Equal(t, want, toks[len(toks)-1].Finish)
	assert.Equal(t, m.Decode(idsOf(toks)), text.String(), "streamed text against Decode of the ids")
}

func TestFinishReasons(t *testing.T) {
	m := load(t)
	ctx := context.Background()
	prompt := m.Encode("func main() {")

	// Length: exactly max tokens, all fed to the session.
	s, err := m.NewSession()
	require.NoError(t, err)
	base := tokensOf(t, s.GenerateTokens(ctx, prompt, WithMaxTokens(40), WithoutDefaultStops()))
	require.Len(t, base, 40)
	checkFinish(t, m, base, FinishLength)
	assert.Equal(t, len(prompt)+40, s.Len())
	ids := idsOf(base)

	// A stop token at draw k: k tokens, the last marked; the session also
	// holds the stop token.
	k := 1
	for k < len(ids) && slices.Contains(ids[:k], ids[k]) {
		k++
	}
	require.Less(t, k, len(ids), "no token first drawn after the first draw")
	s, _ = m.NewSession()
	got := tokensOf(t, s.GenerateTokens(ctx, prompt, WithMaxTokens(40), WithoutDefaultStops(), WithStopTokens(ids[k])))
	require.Equal(t, ids[:k], idsOf(got))
	checkFinish(t, m, got, FinishStop)
	assert.Equal(t, len(prompt)+k+1, s.Len())

	// A stop token at the first draw: one item with ID -1 carrying the reason.
	s, _ = m.NewSession()
	got = tokensOf(t, s.GenerateTokens(ctx, prompt, WithoutDefaultStops(), WithStopTokens(ids[0])))
	assert.Equal(t, []Token{{ID: -1, Finish: FinishStop, Usage: &Usage{PromptTokens: len(prompt)}}}, got)

	// The context fills: with two positions left, two tokens are fed and a
	// third is drawn from the last logits, then the generation ends.
	s, _ = m.NewSession()
	long := make([]int32, m.Config.MaxPositionEmbeddings-2)
	for i := range long {
		long[i] = prompt[i%len(prompt)]
	}
	got = tokensOf(t, s.GenerateTokens(ctx, long, WithMaxTokens(10), WithoutDefaultStops()))
	require.Len(t, got, 3)
	checkFinish(t, m, got, FinishContext)
	assert.Equal(t, m.Config.MaxPositionEmbeddings, s.Len())

	// A stop string that never completes but whose start ends the text:
	// the held-back text arrives on the last token, not as an extra item.
	text := m.Decode(ids)
	tail := text[len(text)-1:] + "\x00never"
	s, _ = m.NewSession()
	got = tokensOf(t, s.GenerateTokens(ctx, prompt, WithMaxTokens(40), WithoutDefaultStops(), WithStopStrings(tail)))
	require.Equal(t, ids, idsOf(got))
	checkFinish(t, m, got, FinishLength)

	// A stop string that completes: cut before it, marked on the token
	// that completed it.
	found := false
	for cut := 3; cut < len(text) && !found; cut++ {
		stop := text[cut-2 : cut]
		if strings.Index(text, stop) != cut-2 || strings.ContainsRune(stop, '\uFFFD') {
			continue
		}
		s, _ = m.NewSession()
		got = tokensOf(t, s.GenerateTokens(ctx, prompt, WithMaxTokens(40), WithoutDefaultStops(), WithStopStrings(stop)))
		var out strings.Builder
		for _, tok := range got {
			out.WriteString(tok.Text)
		}
		assert.Equal(t, text[:cut-2], out.String())
		assert.Equal(t, FinishStopString, got[len(got)-1].Finish)
		assert.Equal(t, ids[:len(got)], idsOf(got))
		found = true
	}
	assert.True(t, found, "no two-byte stop string in %q", text)

	// The Batcher yields the same items, reasons included.
	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go br.Run(bctx)
	for _, opts := range [][]GenerateOption{
		{WithMaxTokens(40), WithoutDefaultStops()},
		{WithMaxTokens(40), WithoutDefaultStops(), WithStopTokens(ids[k])},
		{WithoutDefaultStops(), WithStopTokens(ids[0])},
	} {
		solo, _ := m.NewSession()
		want := tokensOf(t, solo.GenerateTokens(ctx, prompt, opts...))
		bs, _ := m.NewSession()
		got := tokensOf(t, br.Generate(ctx, bs, "func main() {", opts...))
		assert.Equal(t, want, got)
		assert.Equal(t, solo.Len(), bs.Len())
	}
}

// TestUsageAndLogprobs: the last token carries usage (prompt, cached and
// generated tokens); with WithLogprobs each token carries its log
// probability and the top alternatives, checked against a float64
// log-softmax of the logits Forward returns for the same positions.
func TestUsageAndLogprobs(t *testing.T) {
	m := load(t)
	ctx := context.Background()
	prompt := m.Encode("abc")
	s, err := m.NewSession()
	require.NoError(t, err)
	toks := tokensOf(t, s.GenerateTokens(ctx, prompt, WithMaxTokens(6), WithoutDefaultStops(), WithLogprobs(3)))
	require.Len(t, toks, 6)
	for _, tok := range toks[:5] {
		assert.Nil(t, tok.Usage)
	}
	assert.Equal(t, &Usage{PromptTokens: len(prompt), CachedTokens: 0, GeneratedTokens: 6}, toks[5].Usage)
	// A second turn on the same session reuses what it holds.
	more := tokensOf(t, s.GenerateTokens(ctx, m.Encode("d"), WithMaxTokens(2), WithoutDefaultStops()))
	assert.Equal(t, &Usage{PromptTokens: 1, CachedTokens: len(prompt) + 6, GeneratedTokens: 2}, more[len(more)-1].Usage)

	ref, err := m.NewSession()
	require.NoError(t, err)
	seq := append(append([]int32(nil), prompt...), idsOf(toks)...)
	logits, err := ref.Forward(ctx, seq)
	require.NoError(t, err)
	v := m.VocabSize()
	for i, tok := range toks {
		row := logits[(len(prompt)-1+i)*v : (len(prompt)+i)*v]
		mx := math.Inf(-1)
		for _, x := range row {
			mx = max(mx, float64(x))
		}
		var z float64
		for _, x := range row {
			z += math.Exp(float64(x) - mx)
		}
		lse := mx + math.Log(z)
		assert.InDelta(t, float64(row[tok.ID])-lse, float64(tok.Logprob), 1e-4, "token %d", i)
		require.Len(t, tok.Top, 3)
		assert.Equal(t, tok.ID, tok.Top[0].ID, "greedy: the token is the most likely")
		for j, alt := range tok.Top {
			assert.InDelta(t, float64(row[alt.ID])-lse, float64(alt.Logprob), 1e-4)
			if j > 0 {
				assert.GreaterOrEqual(t, tok.Top[j-1].Logprob, alt.Logprob)
			}
		}
	}
	for _, err := range s.Generate(ctx, "x", WithLogprobs(21)) {
		assert.ErrorIs(t, err, ErrInvalidOption)
	}
}
