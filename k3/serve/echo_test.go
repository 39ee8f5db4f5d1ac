package serve

import (
	"context"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/k3"
)

// promptLogprobs computes, on a session of m fed the whole prompt in one
// Forward, each token's log-probability after the ones before it (the
// first has none), and the most likely token at each position.
func promptLogprobs(t *testing.T, m *k3.Model, prompt []int32) (lps []float64, best []int32) {
	t.Helper()
	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	logits, err := s.Forward(context.Background(), prompt)
	require.NoError(t, err)
	v := m.Config.VocabSize
	for i := 1; i < len(prompt); i++ {
		row := logits[(i-1)*v : i*v]
		mx, arg := math.Inf(-1), 0
		for j, x := range row {
			if float64(x) > mx {
				mx, arg = float64(x), j
			}
		}
		var z float64
		for _, x := range row {
			z += math.Exp(float64(x) - mx)
		}
		lps = append(lps, float64(row[prompt[i]])-mx-math.Log(z))
		best = append(best, int32(arg))
	}
	return lps, best
}

// TestEcho: an echoing completion repeats its prompt before the text,
// with each prompt token's log-probability (the first null) as the model
// gives it, across the scoring passes' chunks; the generated part is the
// plain request's, its text offsets counting on from the prompt's; with
// max_tokens 0 only the prompt is scored, for several prompts at once as
// evaluation harnesses send them.
func TestEcho(t *testing.T) {
	_, hs, m := newTestServer(t, Config{Name: "tiny"})
	text := strings.Repeat("func main() { fmt.Println(\"hi\") }\n", 12) // past one scoring chunk
	prompt := m.Encode(text)
	require.Greater(t, len(prompt), echoChunk)
	wantLPs, best := promptLogprobs(t, m, prompt)

	code, plain := post(t, hs.URL+"/v1/completions", map[string]any{"prompt": text, "max_tokens": 3, "temperature": 0, "logprobs": 1})
	require.Equal(t, 200, code, "%v", plain)
	code, out := post(t, hs.URL+"/v1/completions", map[string]any{"prompt": text, "max_tokens": 3, "temperature": 0, "logprobs": 1, "echo": true})
	require.Equal(t, 200, code, "%v", out)
	pc := plain["choices"].([]any)[0].(map[string]any)
	c := out["choices"].([]any)[0].(map[string]any)
	assert.Equal(t, text+pc["text"].(string), c["text"])
	lp := c["logprobs"].(map[string]any)
	toks, tlps, tops, offs := lp["tokens"].([]any), lp["token_logprobs"].([]any), lp["top_logprobs"].([]any), lp["text_offset"].([]any)
	require.Len(t, toks, len(prompt)+3)
	assert.Nil(t, tlps[0])
	assert.Nil(t, tops[0])
	off := 0
	for i, id := range prompt {
		b := string(m.Tokenizer().TokenBytes(id))
		assert.Equal(t, b, toks[i], "token %d", i)
		assert.EqualValues(t, off, offs[i], "token %d's offset", i)
		off += utf8.RuneCountInString(b)
		if i == 0 {
			continue
		}
		assert.InDelta(t, wantLPs[i-1], tlps[i].(float64), 1e-4, "token %d's log-probability", i)
		top := tops[i].(map[string]any)
		require.Len(t, top, 1)
		_, ok := top[string(m.Tokenizer().TokenBytes(best[i-1]))]
		assert.True(t, ok, "token %d's top alternative is the most likely token: %v", i, top)
	}
	gen := pc["logprobs"].(map[string]any)
	for i := range 3 {
		assert.Equal(t, gen["tokens"].([]any)[i], toks[len(prompt)+i])
		// The prompt ran in other chunks than the plain request's prefill:
		// equal within the conformance tolerance, not bitwise.
		assert.InDelta(t, gen["token_logprobs"].([]any)[i], tlps[len(prompt)+i], 1e-4)
		assert.EqualValues(t, off+int(gen["text_offset"].([]any)[i].(float64)), offs[len(prompt)+i])
	}

	// Streamed: the prompt first, then the text.
	r := postStream(t, context.Background(), hs.URL+"/v1/completions", map[string]any{"prompt": text, "max_tokens": 3, "temperature": 0, "echo": true, "stream": true})
	defer r.Body.Close()
	events, done := sse(t, r.Body)
	require.True(t, done)
	assert.Equal(t, text, events[0]["choices"].([]any)[0].(map[string]any)["text"])
	var streamed strings.Builder
	for _, ev := range events {
		streamed.WriteString(ev["choices"].([]any)[0].(map[string]any)["text"].(string))
	}
	assert.Equal(t, c["text"], streamed.String())

	// Scoring only, two token prompts in one request.
	a, b := prompt[:10], prompt[5:40]
	code, out = post(t, hs.URL+"/v1/completions", map[string]any{"prompt": [][]int32{a, b}, "max_tokens": 0, "echo": true, "logprobs": 1, "temperature": 0})
	require.Equal(t, 200, code, "%v", out)
	u := out["usage"].(map[string]any)
	assert.EqualValues(t, len(a)+len(b), u["prompt_tokens"])
	assert.EqualValues(t, 0, u["completion_tokens"])
	for k, p := range [][]int32{a, b} {
		c := out["choices"].([]any)[k].(map[string]any)
		assert.Equal(t, "length", c["finish_reason"])
		assert.Equal(t, m.Decode(p), c["text"])
		got := c["logprobs"].(map[string]any)["token_logprobs"].([]any)
		require.Len(t, got, len(p))
		want, _ := promptLogprobs(t, m, p)
		for i := 1; i < len(p); i++ {
			assert.InDelta(t, want[i-1], got[i].(float64), 1e-4, "prompt %d, token %d", k, i)
		}
	}

	// What stays refused.
	for _, tc := range []struct {
		body  map[string]any
		param string
	}{
		{map[string]any{"prompt": "x", "max_tokens": 0}, "max_tokens"},
		{map[string]any{"prompt": "x", "max_tokens": 0, "echo": false}, "max_tokens"},
	} {
		code, out := post(t, hs.URL+"/v1/completions", tc.body)
		assert.Equal(t, 400, code, "%v", tc.body)
		assert.Equal(t, tc.param, out["error"].(map[string]any)["param"], "%v", tc.body)
	}
	code, out = postSession(t, hs.URL+"/v1/completions", "s1", map[string]any{"prompt": "x", "echo": true, "max_tokens": 1})
	assert.Equal(t, 400, code)
	assert.Equal(t, "echo", out["error"].(map[string]any)["param"])
}

// TestTextOffsetCharacters: text_offset counts characters, not bytes: a
// token's offset is the length in code points of the tokens before it as
// the answer renders them (a byte of a split character as one U+FFFD),
// echoed prompt and generated tokens alike.
func TestTextOffsetCharacters(t *testing.T) {
	_, hs, m := newTestServer(t, Config{Name: "tiny"})
	text := "naïve café — ッ 😊 “quoted” مم\n" // the tiny tokenizer holds م whole
	prompt := m.Encode(text)
	bytes, chars := 0, 0
	for _, id := range prompt {
		b := m.Tokenizer().TokenBytes(id)
		bytes, chars = bytes+len(b), chars+utf8.RuneCount(b)
	}
	require.NotEqual(t, bytes, chars, "the prompt's tokens hold multi-byte characters")
	code, out := post(t, hs.URL+"/v1/completions", map[string]any{"prompt": text, "max_tokens": 6, "temperature": 0, "logprobs": 1, "echo": true})
	require.Equal(t, 200, code, "%v", out)
	lp := out["choices"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)
	toks, offs := lp["tokens"].([]any), lp["text_offset"].([]any)
	require.Len(t, toks, len(prompt)+6)
	joined := ""
	for i, tok := range toks {
		assert.EqualValues(t, utf8.RuneCountInString(joined), offs[i], "token %d's offset", i)
		joined += tok.(string)
	}
	assert.EqualValues(t, chars, offs[len(prompt)], "the first generated token's offset")
}
