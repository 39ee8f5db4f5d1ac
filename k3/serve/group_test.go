package serve

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/k3"
	"k3/specdec"
)

const groupDir = "../../testdata/model/tiny_k31pro"

// groupServer serves g with cfg.
func groupServer(t *testing.T, g *k3.Group, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	s, err := NewGroup(g, cfg)
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		hs.Close()
		require.NoError(t, s.Close())
	})
	return s, hs
}

// directGroup generates what a group's server should: the same prompt and
// options on a session of the group, outside the server.
func directGroup(t *testing.T, g *k3.Group, prompt []int32, opts ...k3.GenerateOption) string {
	t.Helper()
	gs, err := g.NewSession()
	require.NoError(t, err)
	defer gs.Close()
	var text string
	for tok, err := range gs.GenerateTokens(context.Background(), prompt, opts...) {
		require.NoError(t, err)
		text += tok.Text
	}
	return text
}

// TestServeGroup: a server on a model split over ranks answers what the
// group's own sessions generate, for one choice, n choices (the prompt
// prefilled once and forked), an echoed prompt and concurrent requests
// sharing passes; a kept session parked by one server resumes on the
// next.
func TestServeGroup(t *testing.T) {
	ctx := context.Background()
	g, err := k3.LoadGroup(ctx, groupDir, k3.Layout{TP: 2, EP: 2}, k3.WithMemoryBudget(testBudget), k3.WithRollback(3))
	require.NoError(t, err)
	t.Cleanup(func() { g.Close() }) // after the servers
	_, hs := groupServer(t, g, Config{MaxSequences: 4})
	url := hs.URL + "/v1/completions"
	prompt := []int32{5, 9, 14, 200, 3, 77, 41}

	code, out := post(t, url, map[string]any{"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true})
	require.Equal(t, 200, code, "%v", out)
	assert.Equal(t, directGroup(t, g, prompt, k3.WithMaxTokens(12), k3.WithTemperature(0), k3.WithoutDefaultStops()), text(out))

	code, out = post(t, url, map[string]any{"prompt": prompt, "max_tokens": 8, "temperature": 0.8, "seed": 5, "n": 3, "ignore_eos": true})
	require.Equal(t, 200, code, "%v", out)
	choices := out["choices"].([]any)
	require.Len(t, choices, 3)
	for i, c := range choices {
		want := directGroup(t, g, prompt, k3.WithMaxTokens(8), k3.WithTemperature(0.8), k3.WithSeed(5+uint64(i)), k3.WithoutDefaultStops())
		assert.Equal(t, want, c.(map[string]any)["text"], "choice %d", i)
	}

	code, out = post(t, url, map[string]any{"prompt": prompt, "max_tokens": 4, "temperature": 0, "echo": true, "logprobs": 1, "ignore_eos": true})
	require.Equal(t, 200, code, "%v", out)
	lp := out["choices"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)
	assert.Len(t, lp["tokens"], len(prompt)+4, "the prompt scored, then the answer")

	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := append([]int32{int32(10 + i)}, prompt[:2+i]...)
			code, out := post(t, url, map[string]any{"prompt": p, "max_tokens": 6 + i, "temperature": 0, "ignore_eos": true})
			if assert.Equal(t, 200, code, "%v", out) {
				assert.Equal(t, directGroup(t, g, p, k3.WithMaxTokens(6+i), k3.WithTemperature(0), k3.WithoutDefaultStops()), text(out), "request %d", i)
			}
		}()
	}
	wg.Wait()

	// A kept session: a server parks it as it closes, the next resumes it,
	// and its second turn answers what the same turns on a server that
	// kept it in memory answer.
	dir := t.TempDir()
	turn := func(url string, p []int32) map[string]any {
		code, out := postSession(t, url, "conv", map[string]any{"prompt": p, "max_tokens": 6, "temperature": 0, "ignore_eos": true})
		require.Equal(t, 200, code, "%v", out)
		return out
	}
	first, err := NewGroup(g, Config{SessionDir: dir})
	require.NoError(t, err)
	hf := httptest.NewServer(first)
	turn(hf.URL+"/v1/completions", prompt)
	hf.Close()
	require.NoError(t, first.Close())
	_, hn := groupServer(t, g, Config{SessionDir: dir})
	p2 := append(append([]int32(nil), prompt...), 8, 8, 8)
	resumed := turn(hn.URL+"/v1/completions", p2)
	_, hm := groupServer(t, g, Config{})
	turn(hm.URL+"/v1/completions", prompt)
	kept := turn(hm.URL+"/v1/completions", p2)
	assert.Equal(t, text(kept), text(resumed))
	assert.Equal(t, cachedTokens(kept), cachedTokens(resumed))
	assert.Positive(t, cachedTokens(resumed), "the parked session's tokens")

	m := scrape(t, hs.URL)
	assert.Contains(t, m, "vllm:num_requests_running")

	// Speculating with the n-gram drafter (a prompt holding nearly every
	// token, so that whatever the model draws was seen and the drafter
	// proposes what followed it): the answers of plain decoding.
	_, hsp := groupServer(t, g, Config{Speculation: k3.WithSpeculation(specdec.NGram{}, 3)})
	var rep []int32
	for id := int32(3); id < 512; id++ {
		rep = append(rep, id*37%509+3)
	}
	code, out = post(t, hsp.URL+"/v1/completions", map[string]any{"prompt": rep, "max_tokens": 10, "temperature": 0, "ignore_eos": true})
	require.Equal(t, 200, code, "%v", out)
	assert.Equal(t, directGroup(t, g, rep, k3.WithMaxTokens(10), k3.WithTemperature(0), k3.WithoutDefaultStops()), text(out))
	assert.Positive(t, scrape(t, hsp.URL)["vllm:spec_decode_num_draft_tokens_total"], "the n-gram drafter drafted")
}

// TestServeGroupRefusals: what a group's server cannot do fails at New.
func TestServeGroupRefusals(t *testing.T) {
	ctx := context.Background()
	g, err := k3.LoadGroup(ctx, groupDir, k3.Layout{TP: 2})
	require.NoError(t, err)
	defer g.Close()
	_, err = NewGroup(g, Config{NewDrafter: func() (specdec.Drafter, error) { return specdec.NGram{}, nil }, DraftDepth: 2, AdaptiveDraft: true})
	assert.ErrorIs(t, err, k3.ErrInvalidOption)
	_, err = NewGroup(g, Config{KVEvents: "tcp://127.0.0.1:1"})
	assert.ErrorIs(t, err, k3.ErrInvalidOption)
	_, err = NewGroup(nil, Config{})
	assert.Error(t, err)
	cp, err := k3.LoadGroup(ctx, groupDir, k3.Layout{CP: 2})
	require.NoError(t, err)
	defer cp.Close()
	_, err = NewGroup(cp, Config{})
	assert.ErrorContains(t, err, "context parallelism")
}

// TestServeGroupMemory: a group's memory gauges report the rank nearest
// its budget. Under TP 3 over four KDA heads one rank holds two heads'
// states and the others one, so with a kept session held that rank's
// usage is the largest.
func TestServeGroupMemory(t *testing.T) {
	ctx := context.Background()
	g, err := k3.LoadGroup(ctx, groupDir, k3.Layout{TP: 3}, k3.WithMemoryBudget(testBudget))
	require.NoError(t, err)
	t.Cleanup(func() { g.Close() })
	_, hs := groupServer(t, g, Config{})
	code, out := postSession(t, hs.URL+"/v1/completions", "kept", map[string]any{"prompt": []int32{5, 9, 14}, "max_tokens": 4, "temperature": 0, "ignore_eos": true})
	require.Equal(t, 200, code, "%v", out)
	var most int64
	for _, m := range g.Ranks() {
		most = max(most, m.MemoryUsage().Used)
	}
	require.Greater(t, most, g.Ranks()[0].MemoryUsage().Used, "a rank holds more than rank 0")
	got := scrape(t, hs.URL)
	assert.Equal(t, float64(most), got["k3:memory_used_bytes"])
	assert.Equal(t, float64(testBudget), got["k3:memory_budget_bytes"])
}
