package k3

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/jsonschema"
	"k3/specdec"
)

// constrainedCases are the grammars a generation can be held to.
func constrainedCases(t *testing.T) map[string][]GenerateOption {
	t.Helper()
	person, err := CompileJSONSchema([]byte(personSchema))
	require.NoError(t, err)
	args := map[string]*JSONSchema{"get_weather": weatherSchema(t)}
	return map[string][]GenerateOption{
		"JSON mode":           {WithJSONObject()},
		"a schema":            {WithJSONSchema(person)},
		"forced tool calls":   {WithToolCalls([]string{"get_weather", "get"}, true), WithToolArguments(args)},
		"optional tool calls": {WithOptionalToolCalls([]string{"get_weather"}, false), WithToolArguments(args)},
	}
}

// genTokensIn runs a generation on a new session of m.
func genTokensIn(t *testing.T, m *Model, prompt []int32, opts ...GenerateOption) []Token {
	t.Helper()
	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	var out []Token
	for tok, err := range s.GenerateTokens(context.Background(), prompt, opts...) {
		require.NoError(t, err)
		out = append(out, tok)
	}
	return out
}

func tokenIDs(toks []Token) []int32 {
	ids := make([]int32, len(toks))
	for i, tok := range toks {
		ids[i] = tok.ID
	}
	return ids
}

// TestConstrainedSpeculation: a generation held to a grammar speculates,
// and draws bitwise the tokens, texts and log-probabilities of the same
// generation without speculation, greedy and sampled, with drafters that
// are right, partly right, and n-gram; through the Batcher too, two
// generations sharing its passes. Drafts are accepted in every grammar.
func TestConstrainedSpeculation(t *testing.T) {
	if raceEnabled {
		t.Skip("one goroutine's grammar work, minutes of masks under the race detector; the serve tests run constrained speculating requests under it")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := LoadTiny(ctx, WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	prompt := m.Encode(m.ChatPrompt([]Message{{Role: "user", Content: "func main() {"}}))
	for name, con := range constrainedCases(t) {
		accepted := 0
		for _, sampling := range [][]GenerateOption{{WithTemperature(0)}, {WithTemperature(1), WithSeed(11)}, {WithTemperature(0.8), WithSeed(12), WithTopK(40)}} {
			opts := append(append([]GenerateOption{WithMaxTokens(80), WithLogprobs(2)}, sampling...), con...)
			want := genTokensIn(t, m, prompt, opts...)
			full := append(append([]int32(nil), prompt...), tokenIDs(want)...)
			for i, spec := range []GenerateOption{WithSpeculation(specdec.NGram{}, 4), WithSpeculation(oracle{full}, 3),
				WithAdaptiveSpeculation(perfect{full}, 6)} {
				what := fmt.Sprintf("%s, %d options, drafter %d", name, len(sampling), i)
				got := genTokensIn(t, m, prompt, append(opts, spec)...)
				sameGeneration(t, want, got, true, what)
				for j := range want {
					require.Equal(t, want[j].Text, got[j].Text, "%s: token %d's text", what, j)
					require.Equal(t, want[j].Top, got[j].Top, "%s: token %d's alternatives", what, j)
				}
				accepted += got[len(got)-1].Usage.AcceptedTokens
			}
			// The Batcher: two speculating generations in the same passes.
			var wg sync.WaitGroup
			outs := make([][]Token, 2)
			for k := range outs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s, err := m.NewSession()
					if err != nil {
						return
					}
					defer s.Close()
					for tok, err := range br.GenerateTokens(ctx, s, prompt, append(opts, WithSpeculation(oracle{full}, 2+k))...) {
						if err != nil {
							return
						}
						outs[k] = append(outs[k], tok)
					}
				}()
			}
			wg.Wait()
			for k, got := range outs {
				sameGeneration(t, want, got, true, fmt.Sprintf("%s, %d options, batcher sequence %d", name, len(sampling), k))
			}
		}
		assert.Positive(t, accepted, "%s: no draft accepted", name)
	}
}

// TestConstrainedRejectionSampling: with WithRejectionSampling and a
// drafter with distributions of its own (a draft model), the drafts are
// drawn without the grammar's mask and the verifying draws hold each
// position to it: every answer is held (JSON mode: a JSON object's
// prefix, whole when it stops), and drafts are accepted.
func TestConstrainedRejectionSampling(t *testing.T) {
	if raceEnabled {
		t.Skip("one goroutine's grammar work, minutes of masks under the race detector")
	}
	ctx := context.Background()
	m, err := LoadTiny(ctx, WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	same, err := LoadTiny(ctx)
	require.NoError(t, err)
	defer same.Close()
	d, err := m.NewDraftModel(same)
	require.NoError(t, err)
	defer d.Close()
	prompt := m.Encode(m.ChatPrompt([]Message{{Role: "user", Content: "func main() {"}}))
	accepted := 0
	for seed := range uint64(6) {
		toks := genTokensIn(t, m, prompt, WithJSONObject(), WithMaxTokens(60), WithTemperature(1), WithSeed(seed),
			WithSpeculation(d, 4), WithRejectionSampling())
		var text string
		for _, tok := range toks {
			text += tok.Text
		}
		st := jsonschema.Object().Start()
		require.True(t, st.Feed([]byte(text)), "seed %d: %q is not a JSON object's prefix", seed, text)
		if toks[len(toks)-1].Finish == FinishStop {
			assert.True(t, st.Done(), "seed %d: stopped before the object closed: %q", seed, text)
		}
		accepted += toks[len(toks)-1].Usage.AcceptedTokens
	}
	assert.Positive(t, accepted, "no draft accepted")
}

// constant drafts the same token every time.
type constant struct{ id int32 }

func (c constant) Draft(history []int32, n int, dst []int32) []int32 {
	for range n {
		dst = append(dst, c.id)
	}
	return dst
}

// TestConstrainedDraftsTruncated: drafts the grammar forbids are not
// verified (a schema's generation drafting only special tokens verifies
// none), and the answer stays plain decoding's.
func TestConstrainedDraftsTruncated(t *testing.T) {
	if raceEnabled {
		t.Skip("one goroutine's grammar work")
	}
	m, err := LoadTiny(context.Background(), WithRollback(4))
	require.NoError(t, err)
	defer m.Close()
	prompt := m.Encode(m.ChatPrompt([]Message{{Role: "user", Content: "func main() {"}}))
	special := int32(-1)
	for id := range int32(m.Config.VocabSize) {
		if m.tok.IsSpecial(id) {
			special = id
			break
		}
	}
	require.GreaterOrEqual(t, special, int32(0))
	opts := []GenerateOption{WithJSONObject(), WithMaxTokens(40), WithTemperature(0)}
	want := genTokensIn(t, m, prompt, opts...)
	got := genTokensIn(t, m, prompt, append(opts, WithSpeculation(constant{special}, 4))...)
	sameGeneration(t, want, got, true, "a drafter of special tokens")
	assert.Zero(t, got[len(got)-1].Usage.DraftTokens, "forbidden drafts were verified")
	// The n-gram drafter's drafts that the grammar takes are verified.
	got = genTokensIn(t, m, prompt, append(opts, WithSpeculation(specdec.NGram{}, 4))...)
	sameGeneration(t, want, got, true, "the n-gram drafter")
	assert.Positive(t, got[len(got)-1].Usage.AcceptedTokens)
}

// TestToolDraftsAdmitted: a tool-call grammar takes a section's tokens in
// a row (one call, then its end), stops at the first token it forbids,
// and leaves its own state where it was.
func TestToolDraftsAdmitted(t *testing.T) {
	m, err := LoadTiny(context.Background())
	require.NoError(t, err)
	defer m.Close()
	weather, err := CompileJSONSchema([]byte(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}`))
	require.NoError(t, err)
	obj, err := weather.s.Objects()
	require.NoError(t, err)
	section := m.Encode(`<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>`)
	bad := m.Encode(`{"town"`)
	for _, text := range []bool{false, true} {
		c := newToolConstraint(m, []string{"get_weather"}, []*jsonschema.Schema{obj}, false, text, nil)
		assert.Equal(t, len(section), c.admits(section), "text %v: the whole section", text)
		// Into the arguments: the first token of a wrong key is refused.
		args := 0
		for c.st.phase != pArgs {
			require.False(t, c.closed(section[args]))
			args++
		}
		before := c.st.phase
		drafts := append(slices.Clone(section[args:args+3]), bad...)
		got := c.admits(drafts)
		assert.Less(t, got, len(drafts), "text %v: %q taken", text, m.Decode(drafts))
		assert.Equal(t, before, c.st.phase, "admits moved the grammar")
		assert.Equal(t, len(section)-args, c.admits(section[args:]), "text %v: the rest, after the trial", text)
	}
}

// TestToolDraftsTrialIsolated: a trial that closes a container and opens
// another where it was leaves the grammar's own stack intact.
func TestToolDraftsTrialIsolated(t *testing.T) {
	m, err := LoadTiny(context.Background())
	require.NoError(t, err)
	defer m.Close()
	s, err := CompileJSONSchema([]byte(`{"type":"object","properties":{"a":{"type":"array"},"b":{"type":"object"}},"additionalProperties":false}`))
	require.NoError(t, err)
	obj, err := s.s.Objects()
	require.NoError(t, err)
	c := newToolConstraint(m, []string{"f"}, []*jsonschema.Schema{obj}, false, false, nil)
	for _, id := range m.Encode(`<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": [1`) {
		require.False(t, c.closed(id))
	}
	trial := m.Encode(`], "b": {"x": 2}`)
	require.Equal(t, len(trial), c.admits(trial))
	for _, id := range m.Encode(`, 2]}<|tool_call_end|><|tool_calls_section_end|>`) {
		c.closed(id)
	}
	assert.Equal(t, pDone, c.st.phase, "the arguments read on after the trial as before it")
}
