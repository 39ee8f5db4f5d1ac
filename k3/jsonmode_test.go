package k3

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/jsonschema"
	"k3/specdec"
)

// TestJSONObject: the embedded model, which writes Go, held to JSON: a
// generation that stops is one JSON object, one cut by max_tokens a
// prefix of one; without stop tokens it ends where the object closes.
func TestJSONObject(t *testing.T) {
	if raceEnabled {
		t.Skip("one goroutine's grammar work, minutes of masks under the race detector; the serve tests run constrained requests under it")
	}
	ctx := context.Background()
	m, err := LoadTiny(ctx, WithRollback(4))
	require.NoError(t, err)
	defer m.Close()
	prompt := m.Encode(m.ChatPrompt([]Message{{Role: "user", Content: "func main() {"}}))
	stopped := 0
	for i, opts := range [][]GenerateOption{
		{WithTemperature(0)},
		{WithTemperature(1), WithSeed(1)},
		{WithTemperature(1.5), WithSeed(2)},
		{WithTemperature(1), WithSeed(3), WithoutDefaultStops()},
		{WithTemperature(2), WithSeed(4), WithTopK(50)},
		{WithTemperature(1), WithSeed(5), WithSpeculation(specdec.NGram{}, 4)}, // held while speculating
	} {
		out, finish, special := heldGeneration(t, m, prompt, append(opts, WithJSONObject(), WithMaxTokens(160))...)
		assert.Zero(t, special, "case %d: special tokens drawn", i)
		st := jsonschema.Object().Start()
		require.True(t, st.Feed([]byte(out)), "case %d: %q is not a JSON object's prefix", i, out)
		switch finish {
		case FinishStop:
			stopped++
			var v map[string]any
			require.NoError(t, json.Unmarshal([]byte(out), &v), "case %d: %q", i, out)
		case FinishLength:
			assert.False(t, st.Done(), "case %d: cut by length after the object closed: %q", i, out)
		default:
			t.Fatalf("case %d: finish %v", i, finish)
		}
		t.Logf("case %d (%v): %q", i, finish, out)
	}
	assert.Positive(t, stopped, "no generation closed its object within 160 tokens")
}

// heldGeneration runs one generation in a new session and returns its
// text, how it finished and how many special tokens it drew.
func heldGeneration(t *testing.T, m *Model, prompt []int32, opts ...GenerateOption) (string, FinishReason, int) {
	t.Helper()
	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	var text strings.Builder
	var finish FinishReason
	special := 0
	for tok, err := range s.GenerateTokens(context.Background(), prompt, opts...) {
		require.NoError(t, err)
		if tok.ID >= 0 && m.tok.IsSpecial(tok.ID) {
			special++
		}
		text.WriteString(tok.Text)
		finish = tok.Finish
	}
	return text.String(), finish, special
}

func TestSamplerRefusesGrammars(t *testing.T) {
	m, err := LoadTiny(context.Background())
	require.NoError(t, err)
	defer m.Close()
	for _, o := range []GenerateOption{WithJSONObject(), WithToolCalls([]string{"f"}, false)} {
		_, err := m.NewSampler(o)
		assert.ErrorIs(t, err, ErrInvalidOption)
	}
}
