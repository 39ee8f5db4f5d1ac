package serve

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/k3"
	"k3/specdec"
)

// TestDSparkServer: a server whose generations each draft with a DSpark
// of their own answers what plain decoding answers, for whole and
// streamed requests at once, several choices each, and counts the drafts.
func TestDSparkServer(t *testing.T) {
	m, err := k3.LoadTiny(context.Background(), k3.WithRollback(4), k3.WithMemoryBudget(testBudget))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() }) // after the server's cleanup
	s, err := New(m, Config{NewDrafter: func() (specdec.Drafter, error) { return m.NewDSpark() }, DraftDepth: 4})
	require.NoError(t, err)
	hs := httptestServer(t, s)
	prompt := "func (b *Buffer) Write(p []byte) (n int, err error) {\n"
	want, _ := direct(t, m, m.Encode(prompt), k3.WithMaxTokens(40), k3.WithoutDefaultStops())
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := map[string]any{"prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": true, "n": 2}
			if i%2 == 0 {
				code, out := post(t, hs.URL+"/v1/completions", body)
				if assert.Equal(t, 200, code, "%v", out) {
					for _, c := range out["choices"].([]any) {
						assert.Equal(t, want, c.(map[string]any)["text"])
					}
				}
				return
			}
			body["stream"] = true
			resp := postStream(t, context.Background(), hs.URL+"/v1/completions", body)
			defer resp.Body.Close()
			events, done := sse(t, resp.Body)
			assert.True(t, done)
			var text [2]strings.Builder
			for _, ev := range events {
				c := ev["choices"].([]any)[0].(map[string]any)
				text[int(c["index"].(float64))].WriteString(c["text"].(string))
			}
			assert.Equal(t, want, text[0].String())
			assert.Equal(t, want, text[1].String())
		}()
	}
	wg.Wait()
	met := scrape(t, hs.URL)
	assert.Positive(t, met["vllm:spec_decode_num_draft_tokens_total"])
	assert.Positive(t, met["vllm:spec_decode_num_accepted_tokens_total"])
}

// closingNGram is an n-gram drafter that counts the ones made and closed.
type closingNGram struct {
	specdec.NGram
	closed *atomic.Int32
	once   sync.Once
}

func (c *closingNGram) Close() error {
	c.once.Do(func() { c.closed.Add(1) })
	return nil
}

// TestDraftersLent: with Config.NewDrafter each generation holds a
// drafter of its own while it runs, gives it back when it ends, later
// generations take those back first, and Close closes every one made.
func TestDraftersLent(t *testing.T) {
	m, err := k3.LoadTiny(context.Background(), k3.WithRollback(4), k3.WithMemoryBudget(testBudget))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() }) // after the server's cleanup
	var made, closed atomic.Int32
	var mu sync.Mutex
	inUse := map[specdec.Drafter]bool{}
	var shared atomic.Bool
	newDrafter := func() (specdec.Drafter, error) {
		made.Add(1)
		return &closingNGram{closed: &closed}, nil
	}
	s, err := New(m, Config{NewDrafter: newDrafter, DraftDepth: 3, AdaptiveDraft: true})
	require.NoError(t, err)
	assert.Equal(t, int32(1), made.Load(), "New makes the first drafter")
	// Each generation's drafter, seen as it starts and ends.
	s.drafters.watch = func(d specdec.Drafter, taken bool) {
		mu.Lock()
		defer mu.Unlock()
		if taken && inUse[d] {
			shared.Store(true)
		}
		inUse[d] = taken
	}
	hs := httptestServer(t, s)
	prompt := "\tcase 1:\n\t\treturn 1\n\tcase 2:\n\t\treturn 2\n\tcase 3:\n"
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, out := post(t, hs.URL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 12, "n": 2})
			assert.Equal(t, 200, code, "%v", out)
		}()
	}
	wg.Wait()
	burst := made.Load()
	assert.LessOrEqual(t, burst, int32(8), "at most one drafter a generation")
	assert.False(t, shared.Load(), "two generations drafted with one drafter at once")
	for range 3 {
		code, out := post(t, hs.URL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 6})
		require.Equal(t, 200, code, "%v", out)
	}
	assert.Equal(t, burst, made.Load(), "one request at a time takes a drafter given back")
	mu.Lock()
	for d, taken := range inUse {
		assert.False(t, taken, "drafter %p not given back", d)
	}
	mu.Unlock()
	hs.Close()
	require.NoError(t, s.Close())
	assert.Equal(t, made.Load(), closed.Load(), "Close closes every drafter made")
}

// TestDraftersBounded: the server makes at most MaxSequences drafters;
// generations past them decode plainly, with the same tokens.
func TestDraftersBounded(t *testing.T) {
	m, err := k3.LoadTiny(context.Background(), k3.WithRollback(4), k3.WithMemoryBudget(testBudget))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	var made, closed atomic.Int32
	s, err := New(m, Config{MaxSequences: 2, DraftDepth: 3, NewDrafter: func() (specdec.Drafter, error) {
		made.Add(1)
		return &closingNGram{closed: &closed}, nil
	}})
	require.NoError(t, err)
	hs := httptestServer(t, s)
	prompt := "\tcase 1:\n\t\treturn 1\n\tcase 2:\n\t\treturn 2\n\tcase 3:\n"
	want, _ := direct(t, m, m.Encode(prompt), k3.WithMaxTokens(24), k3.WithoutDefaultStops())
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, out := post(t, hs.URL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": true, "n": 2})
			if assert.Equal(t, 200, code, "%v", out) {
				for _, c := range out["choices"].([]any) {
					assert.Equal(t, want, c.(map[string]any)["text"])
				}
			}
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, made.Load(), int32(2), "eight generations, two sequences at a time")
	assert.Positive(t, scrape(t, hs.URL)["vllm:spec_decode_num_draft_tokens_total"])
}

// TestDrafterConfig: NewDrafter with Speculation, or without a depth, is
// refused, and so is a drafter the model cannot make.
func TestDrafterConfig(t *testing.T) {
	m, err := k3.Load(context.Background(), "../../testdata/model/tiny_k31pro")
	require.NoError(t, err)
	defer m.Close()
	ngram := func() (specdec.Drafter, error) { return specdec.NGram{}, nil }
	_, err = New(m, Config{NewDrafter: ngram, DraftDepth: 2, Speculation: k3.WithSpeculation(specdec.NGram{}, 2)})
	assert.ErrorContains(t, err, "both set")
	_, err = New(m, Config{NewDrafter: ngram})
	assert.ErrorContains(t, err, "DraftDepth = 0")
	_, err = New(m, Config{NewDrafter: ngram, DraftDepth: k3.ExactTokens})
	assert.ErrorContains(t, err, "DraftDepth")
	_, err = New(m, Config{NewDrafter: func() (specdec.Drafter, error) { return m.NewDSpark() }, DraftDepth: 2})
	assert.ErrorIs(t, err, k3.ErrInvalidOption, "this checkpoint has no draft module")
}

// httptestServer serves s for the test; the cleanup closes both.
func httptestServer(t *testing.T, s *Server) *httptest.Server {
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		hs.Close()
		require.NoError(t, s.Close())
	})
	return hs
}
