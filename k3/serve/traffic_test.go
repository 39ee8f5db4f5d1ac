package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/goroutines"
	"k3/internal/tiny"
	"k3/k3"
	"k3/specdec"
)

// TestRandomTraffic runs random clients against servers of random
// configuration, of the embedded model or (a quarter) of a random-weight
// checkpoint of a preset, half of those split over two or four ranks
// (NewGroup, with no prefix cache and fixed-depth drafters that read no
// session): sequences, queue, token budget, memory budget (none, 64,
// 8 or 3 MiB), prefix cache, kept sessions (in memory or parked to a
// directory, few and soon idle) and speculation (none; one n-gram
// drafter, fixed or adaptive; or a drafter for each generation, the
// embedded model's DSpark module, a self-draft or a second load of the
// checkpoint as a draft model, Config.NewDrafter). Four to sixteen clients at once each send one to three
// requests: chat completions, completions (one prompt or two) and
// Responses (some continuing the client's last), whole or streamed,
// greedy or seeded, some with n > 1, stop strings, log-probabilities,
// JSON mode, a JSON schema, a forced tool call, echo or a kept session
// (three ids shared by all, so some collide); some streams are read
// slowly and some abandoned after a few lines, and some clients
// tokenize. It checks:
//   - every answer is 200, or 400 for more choices than the server holds,
//     409 for a kept session in use, 429 for a full queue, or 503 naming
//     the memory budget, with OpenAI's error object;
//   - a stream read to its end ends with [DONE] (chat, completions) or
//     response.completed or response.incomplete (Responses), with no
//     error in it;
//   - a whole answer has prompts × n choices, its usage adds up, and a
//     choice cut by max_tokens has that many tokens; a structured one
//     that ended by itself holds its format, or calls its tool with
//     arguments that hold its parameters;
//   - a whole response is kept as answered (GET), and gone once deleted;
//   - /detokenize gives back the text /tokenize read;
//   - greedy answers without a kept session, stop strings, JSON mode or
//     echo, from a server with the default token budget and no prefix
//     cache, are the text of the same generation run directly, every
//     choice;
//   - afterwards nothing runs, waits or is promised, once the kept
//     sessions are deleted the sessions' memory is what it was, no
//     session file lies outside the session directory, and once the
//     server and the model are closed no goroutine of theirs is left.
//
// A quarter of the servers close while their clients are at it; their
// answers may also be 503s, and streams may end with the shutdown's
// error. It found requests failing mid-stream under a memory budget (an
// adaptive depth's cost measurement that did not fit; sessions made for
// new requests taking the room a running request's next pass needed; a
// request's later choices waiting for its finished ones' memory), a
// shutdown just before a pass answered as an internal error, kept
// sessions written to the working directory at shutdown by a server
// without a session directory, and, after shutdown, a kept session's
// file written by two requests at once.
// K3_HTTP_TRAFFIC=N runs N configurations instead of the default 8 (of
// which seed 7 serves a split checkpoint; K3_HTTP_TRAFFIC_SEED the
// first).
func TestRandomTraffic(t *testing.T) {
	n, first := 8, 1
	if v, err := strconv.Atoi(os.Getenv("K3_HTTP_TRAFFIC")); err == nil && v > 0 {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("K3_HTTP_TRAFFIC_SEED")); err == nil {
		first = v
	}
	for seed := uint64(first); seed < uint64(first+n); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomTraffic(t, seed) })
	}
}

// greedyAnswer is a whole greedy answer to check against the generation
// run directly: its prompt's tokens, max_tokens, and the choices' texts.
type greedyAnswer struct {
	prompt    []int32
	maxTokens int
	texts     []string
	request   string
}

func randomTraffic(t *testing.T, seed uint64) {
	ctx := context.Background()
	own := []string{"serve.randomTraffic", "serve.TestRandomTraffic"}
	others := goroutines.Running(nil, own...) // what other tests left: not this server's
	r := rand.New(rand.NewPCG(seed, 77))
	var mu sync.Mutex // r is shared by the clients
	rnd := func(n int) int { mu.Lock(); defer mu.Unlock(); return r.IntN(n) }

	opts := []k3.Option{k3.WithRollback(4)}
	budget := []int64{0, 64 << 20, 8 << 20, 3 << 20}[rnd(4)]
	if budget > 0 {
		opts = append(opts, k3.WithMemoryBudget(budget))
	}
	cached := rnd(3) == 0
	if cached {
		opts = append(opts, k3.WithPrefixCache(8<<20))
	}
	// The embedded model, or a random-weight checkpoint of a preset (a
	// byte-level tokenizer, other shapes).
	model := "the embedded model"
	load := func(opts ...k3.Option) (*k3.Model, error) { return k3.LoadTiny(ctx, opts...) }
	var g *k3.Group // a checkpoint split over ranks (NewGroup)
	var m *k3.Model // the model, or the group's rank 0
	var err error
	if rnd(4) == 0 {
		preset := []string{"k31pro", "k3", "kimi_linear"}[rnd(3)]
		model = "a random " + preset
		dir := t.TempDir()
		require.NoError(t, tiny.Write(dir, preset, tiny.Options{Seed: seed, BF16: rnd(2) == 0}))
		load = func(opts ...k3.Option) (*k3.Model, error) { return k3.Load(ctx, dir, opts...) }
		if rnd(2) == 0 {
			// A group keeps no prefix cache.
			l := []k3.Layout{{TP: 2}, {EP: 2}, {TP: 2, EP: 2, Dispatch: true}}[rnd(3)]
			model += fmt.Sprintf(" split %v", l)
			cached = false
			opts = []k3.Option{k3.WithRollback(4)}
			if budget > 0 {
				opts = append(opts, k3.WithMemoryBudget(budget))
			}
			g, err = k3.LoadGroup(ctx, dir, l, opts...)
			require.NoError(t, err, model)
			m = g.Ranks()[0]
		}
	}
	if g == nil {
		m, err = load(opts...)
		require.NoError(t, err)
	}
	var draft *k3.Model // a draft model's second load of the checkpoint
	cfg := Config{MaxSequences: 1 + rnd(4), MaxQueue: 1 + rnd(16), MaxSessions: 1 + rnd(4),
		SessionIdle: time.Duration(20+rnd(500)) * time.Millisecond}
	if rnd(3) == 0 {
		cfg.TokenBudget = cfg.MaxSequences + 1 + rnd(40)
	}
	if rnd(2) == 0 {
		cfg.SessionDir = t.TempDir()
	}
	spec := []string{"none", "fixed", "adaptive", "a drafter each"}[rnd(4)]
	if g != nil && spec == "adaptive" {
		spec = "fixed" // a GroupBatcher drafts at a fixed depth
	}
	switch spec {
	case "fixed":
		cfg.Speculation = k3.WithSpeculation(specdec.NGram{}, 1+rnd(4))
	case "adaptive":
		cfg.Speculation = k3.WithAdaptiveSpeculation(specdec.NGram{}, 1+rnd(4))
	case "a drafter each":
		// The embedded model's DSpark module, a self-draft of the first
		// layer, or a second load of the checkpoint as a draft model
		// (k3 serve -speculate model:DIR); a fixed depth or an adaptive
		// one.
		cfg.DraftDepth, cfg.AdaptiveDraft = 1+rnd(4), rnd(2) == 0 && g == nil
		pick := rnd(3)
		if g != nil {
			pick = 1 // a GroupBatcher takes drafters that read no session
		}
		switch pick {
		case 0:
			spec += ", a self-draft"
			cfg.NewDrafter = func() (specdec.Drafter, error) { return m.NewSelfDraft(1) }
		case 1:
			spec += ", a draft model"
			draft, err = load(k3.WithRollback(cfg.DraftDepth))
			require.NoError(t, err)
			cfg.NewDrafter = func() (specdec.Drafter, error) { return m.NewDraftModel(draft) }
		default:
			spec += ", DSpark"
			cfg.NewDrafter = func() (specdec.Drafter, error) { return m.NewDSpark() }
			if model != "the embedded model" {
				spec = "a drafter each, a self-draft"
				cfg.NewDrafter = func() (specdec.Drafter, error) { return m.NewSelfDraft(1) }
			}
		}
		spec += fmt.Sprintf(" (depth %d, adaptive %v)", cfg.DraftDepth, cfg.AdaptiveDraft)
	}
	desc := fmt.Sprintf("%s, memory budget %d, prefix cache %v, speculation %s, sequences %d, queue %d, token budget %d, kept sessions %d (directory %v, idle %v)",
		model, budget, cached, spec, cfg.MaxSequences, cfg.MaxQueue, cfg.TokenBudget, cfg.MaxSessions, cfg.SessionDir != "", cfg.SessionIdle)
	var s *Server
	if g != nil {
		s, err = NewGroup(g, cfg)
	} else {
		s, err = New(m, cfg)
	}
	require.NoError(t, err, desc)
	hs := httptest.NewServer(s)
	defer func() {
		hs.Close()
		require.NoError(t, s.Close())
		if draft != nil {
			require.NoError(t, draft.Close())
		}
		if g != nil {
			require.NoError(t, g.Close())
		} else {
			require.NoError(t, m.Close())
		}
		// Closed, the server, its Batcher and the model leave nothing
		// of theirs running.
		var left []string
		if !assert.Eventually(t, func() bool { left = goroutines.Running(others, own...); return len(left) == 0 }, 10*time.Second, 5*time.Millisecond,
			"goroutines left running; %s", desc) {
			t.Log(strings.Join(left, "\n\n"))
		}
	}()
	base := held(m)
	exact := cfg.TokenBudget == 0 && !cached // the Batcher gives a lone run's tokens bitwise
	// Some servers close while their clients are still at it, as a
	// server being replaced does: then answers may also be 503s and
	// streams may end with the shutdown's error.
	var closing <-chan time.Time
	if rnd(4) == 0 {
		after := time.Duration(rnd(300)) * time.Millisecond
		desc += fmt.Sprintf(", closed after %v", after)
		closing = time.After(after)
	}
	shutdown := func(what string) bool { return closing != nil && strings.Contains(what, "shutting down") }

	words := []string{"func", "main", "type", "struct", "x", "the cat", "{", "}", "import", "fmt", "return", "if err != nil"}
	text := func() string {
		var b strings.Builder
		for range 1 + rnd(12) {
			b.WriteString(words[rnd(len(words))])
			b.WriteByte(' ')
		}
		return b.String()
	}
	var greedy []greedyAnswer
	var wg sync.WaitGroup
	for c := range 4 + rnd(12) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			session := ""
			if rnd(3) == 0 {
				session = fmt.Sprint("s", rnd(3))
			}
			var prev string // the client's last response, for previous_response_id
			if rnd(5) == 0 && closing == nil {
				checkTokenize(t, hs.URL, text(), fmt.Sprintf("client %d, %s", c, desc))
			}
			for turn := range 1 + rnd(3) {
				what := fmt.Sprintf("client %d, request %d, %s", c, turn, desc)
				g := clientRequest(rnd, text, session, prev)
				raw, err := json.Marshal(g.body)
				require.NoError(t, err)
				what += fmt.Sprintf(": %s %s", g.path, raw)
				rctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // a hang fails, it does not stall the run
				req, err := http.NewRequestWithContext(rctx, "POST", hs.URL+g.path, bytes.NewReader(raw))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				if session != "" {
					req.Header.Set(SessionHeader, session)
				}
				resp, err := http.DefaultClient.Do(req)
				if !assert.NoError(t, err, what) {
					cancel()
					return
				}
				if g.abandon {
					br := bufio.NewReader(resp.Body)
					for range 1 + rnd(4) {
						if _, err := br.ReadString('\n'); err != nil {
							break
						}
					}
					cancel()
					resp.Body.Close()
					continue
				}
				var out []byte
				if g.stream && rnd(4) == 0 {
					// A slow reader: the stream fills and its sequence
					// waits for it.
					out, err = slowRead(resp.Body, func() time.Duration { return time.Duration(rnd(3)) * time.Millisecond })
				} else {
					out, err = io.ReadAll(resp.Body)
				}
				resp.Body.Close()
				cancel()
				if !assert.NoError(t, err, what) {
					return
				}
				switch resp.StatusCode {
				case 200:
				case 400, 409, 429, 503:
					var e struct {
						Error struct{ Message, Type string }
					}
					assert.NoError(t, json.Unmarshal(out, &e), "%s: %s", what, out)
					switch resp.StatusCode {
					case 400:
						assert.Contains(t, e.Error.Message, "decodes and queues at most", what)
					case 503:
						if !shutdown(e.Error.Message) {
							assert.Contains(t, e.Error.Message, "memory budget", what)
						}
					}
					continue
				default:
					t.Errorf("status %d: %s; %s", resp.StatusCode, out, what)
					continue
				}
				if g.stream {
					failed := shutdown(string(out))
					if g.path == "/v1/responses" {
						if failed {
							assert.Contains(t, string(out), "event: error", what)
						} else if assert.NotContains(t, string(out), "event: error", what) &&
							assert.Regexp(t, "event: response.(completed|incomplete)", string(out), what) {
							prev = lastResponseID(out)
						}
					} else {
						if !failed {
							assert.NotContains(t, string(out), `data: {"error"`, what)
						}
						assert.True(t, bytes.HasSuffix(out, []byte("data: [DONE]\n\n")), "%s: ends %q", what, out[max(0, len(out)-200):])
					}
					continue
				}
				var v map[string]any
				if !assert.NoError(t, json.Unmarshal(out, &v), "%s: %s", what, out) {
					continue
				}
				if g.path == "/v1/responses" {
					prev, _ = v["id"].(string)
					if closing == nil && prev != "" {
						remove := rnd(4) == 0
						checkKeptResponse(t, hs.URL, prev, v, remove, what)
						if remove {
							prev = ""
						}
					}
					continue
				}
				choices, _ := v["choices"].([]any)
				assert.Len(t, choices, g.choices, "%s: %s", what, out)
				u := v["usage"].(map[string]any)
				assert.Equal(t, u["prompt_tokens"].(float64)+u["completion_tokens"].(float64), u["total_tokens"], what)
				var texts []string
				for _, ch := range choices {
					ch := ch.(map[string]any)
					if g.held != "" {
						if _, cut := g.body["stop"]; !cut { // a stop string may end the value anywhere
							checkHeld(t, g.held, ch, what)
						}
						continue
					}
					if g.choices == 1 && ch["finish_reason"] == "length" {
						assert.EqualValues(t, g.maxTokens, u["completion_tokens"], "%s: cut by max_tokens", what)
					}
					if msg, ok := ch["message"].(map[string]any); ok {
						texts = append(texts, msg["content"].(string))
					} else {
						texts = append(texts, ch["text"].(string))
					}
				}
				if exact && g.plain && len(choices) == g.choices {
					mu.Lock()
					greedy = append(greedy, greedyAnswer{prompt: g.tokens(m), maxTokens: g.maxTokens, texts: texts, request: what})
					mu.Unlock()
				}
			}
		}()
	}
	closed := make(chan struct{})
	if closing != nil {
		go func() {
			<-closing
			assert.NoError(t, s.Close(), desc)
			close(closed)
		}()
	}
	wg.Wait()
	if closing != nil {
		<-closed
	}

	require.Eventually(t, func() bool { return s.e.stats() == k3.BatcherStats{} }, 30*time.Second, 5*time.Millisecond, desc)
	for i := range 3 {
		req, err := http.NewRequest("DELETE", hs.URL+"/v1/sessions/s"+fmt.Sprint(i), nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
	}
	require.Eventually(t, func() bool { return held(m) <= base && m.MemoryUsage().Promised == 0 }, 30*time.Second, 5*time.Millisecond,
		"memory %+v, at the start %d; %s", m.MemoryUsage(), base, desc)
	stray, err := filepath.Glob("*.k3session")
	require.NoError(t, err)
	assert.Empty(t, stray, "session files outside the session directory; %s", desc)
	if closing != nil {
		return // the answers that came are checked; some may have been cut
	}
	for _, a := range greedy {
		var want string
		if g != nil {
			want = directGroup(t, g, a.prompt, k3.WithMaxTokens(a.maxTokens), k3.WithTemperature(0))
		} else {
			want, _ = direct(t, m, a.prompt, k3.WithMaxTokens(a.maxTokens), k3.WithTemperature(0))
		}
		for i, got := range a.texts {
			assert.Equal(t, want, got, "choice %d of %s", i, a.request)
		}
	}
}

// trafficRequest is one random request of TestRandomTraffic.
type trafficRequest struct {
	path      string
	body      map[string]any
	stream    bool
	abandon   bool // read a few lines of the stream, then leave
	choices   int  // prompts × n
	maxTokens int
	// plain: greedy, one prompt, no stop strings, JSON mode, echo or
	// kept session: its text is the generation's run directly.
	plain bool
	chat  string // the chat's message, or
	raw   string // the completion's prompt
	// held is what the answer is held to: "json_object", "json_schema"
	// (pairSchema), "tools" (a forced call of pair), or nothing.
	held string
}

// pairSchema is the schema TestRandomTraffic's structured requests hold
// answers and tool arguments to.
var pairSchema = map[string]any{"type": "object", "additionalProperties": false, "required": []string{"a", "b"},
	"properties": map[string]any{"a": map[string]any{"type": "integer", "minimum": 0, "maximum": 999}, "b": map[string]any{"type": "string", "maxLength": 8}}}

// checkHeld checks a whole chat choice against what its request held it
// to: finished by a stop, a JSON object (of pairSchema); finished by a
// tool call, calls of pair with its arguments.
func checkHeld(t *testing.T, held string, choice map[string]any, what string) {
	t.Helper()
	msg := choice["message"].(map[string]any)
	finish := choice["finish_reason"]
	pair := func(text string) {
		var v map[string]any
		if !assert.NoError(t, json.Unmarshal([]byte(text), &v), "%s: %q", what, text) {
			return
		}
		if held == "json_object" {
			return
		}
		assert.Len(t, v, 2, "%s: %q", what, text)
		a, ok := v["a"].(float64)
		assert.True(t, ok && a == float64(int64(a)) && a >= 0 && a <= 999, "%s: a in %q", what, text)
		b, ok := v["b"].(string)
		assert.True(t, ok && len([]rune(b)) <= 8, "%s: b in %q", what, text)
	}
	switch {
	case held == "tools":
		if finish == "length" {
			return
		}
		assert.Equal(t, "tool_calls", finish, what)
		calls, _ := msg["tool_calls"].([]any)
		if assert.NotEmpty(t, calls, what) {
			for _, c := range calls {
				f := c.(map[string]any)["function"].(map[string]any)
				assert.Equal(t, "pair", f["name"], what)
				pair(f["arguments"].(string))
			}
		}
	case finish == "stop":
		pair(msg["content"].(string))
	}
}

// tokens returns the prompt as the server tokenizes it.
func (g *trafficRequest) tokens(m *k3.Model) []int32 {
	if g.chat != "" {
		return chatPrompt(m, g.chat)
	}
	return m.Encode(g.raw)
}

func clientRequest(rnd func(int) int, text func() string, session, prev string) *trafficRequest {
	g := &trafficRequest{stream: rnd(2) == 0, maxTokens: 1 + rnd(20), choices: 1}
	g.abandon = g.stream && rnd(4) == 0
	body := map[string]any{"stream": g.stream}
	g.body = body
	greedy := rnd(3) > 0
	if greedy {
		body["temperature"] = 0
	} else {
		body["temperature"], body["seed"] = 0.8, rnd(100)
	}
	g.plain = greedy && session == ""
	n := 1
	if session == "" && rnd(3) == 0 {
		n = 1 + rnd(3)
		body["n"] = n
	}
	if rnd(4) == 0 {
		body["stop"] = []string{"\n", "}"}[rnd(2)]
		g.plain = false
	}
	switch rnd(3) {
	case 0:
		g.path = "/v1/chat/completions"
		g.chat = text()
		body["messages"] = []map[string]any{{"role": "user", "content": g.chat}}
		body["max_tokens"] = g.maxTokens
		if g.stream && rnd(2) == 0 {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		if rnd(3) == 0 {
			body["logprobs"], body["top_logprobs"] = true, rnd(3)
		}
		switch rnd(8) {
		case 0:
			body["response_format"] = map[string]any{"type": "json_object"}
			g.held, g.plain = "json_object", false
		case 1:
			body["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "pair", "schema": pairSchema}}
			g.held, g.plain = "json_schema", false
		case 2:
			// A forced call, its arguments held to the parameters.
			body["tools"] = []map[string]any{{"type": "function", "function": map[string]any{"name": "pair", "parameters": pairSchema}}}
			body["tool_choice"] = []any{"required", map[string]any{"type": "function", "function": map[string]any{"name": "pair"}}}[rnd(2)]
			g.held, g.plain = "tools", false
		}
		if g.held != "" {
			// Room to close the value.
			g.maxTokens = 40 + rnd(60)
			body["max_tokens"] = g.maxTokens
		}
		g.choices = n
	case 1:
		g.path = "/v1/completions"
		g.raw = text()
		body["prompt"] = g.raw
		body["max_tokens"] = g.maxTokens
		g.choices = n
		if session == "" && n == 1 && rnd(3) == 0 {
			body["prompt"] = []string{g.raw, text()}
			g.choices, g.plain = 2, false
		}
		if rnd(3) == 0 {
			body["logprobs"] = rnd(3)
		}
		if session == "" && !g.stream && rnd(4) == 0 {
			body["echo"] = true
			g.plain = false
		}
	default:
		g.path = "/v1/responses"
		delete(body, "stop")
		delete(body, "n")
		body["input"] = text()
		body["max_output_tokens"] = g.maxTokens
		if prev != "" && rnd(2) == 0 {
			body["previous_response_id"] = prev
		}
		g.plain = false
	}
	return g
}

// lastResponseID returns the id of the response a Responses stream
// describes.
func lastResponseID(stream []byte) string {
	i := bytes.LastIndex(stream, []byte(`"id":"resp_`))
	if i < 0 {
		return ""
	}
	id := stream[i+len(`"id":"`):]
	return string(id[:bytes.IndexByte(id, '"')])
}

// slowRead reads r a line at a time, pausing between lines.
func slowRead(r io.Reader, pause func() time.Duration) ([]byte, error) {
	var out []byte
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		out = append(out, line...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		time.Sleep(pause())
	}
}

// checkKeptResponse requires GET /v1/responses/ID to answer the response
// v as it was answered; with remove, it deletes it, and a GET then
// answers 404.
func checkKeptResponse(t *testing.T, url, id string, v map[string]any, remove bool, what string) {
	t.Helper()
	get := func() (int, map[string]any) {
		resp, err := http.Get(url + "/v1/responses/" + id)
		require.NoError(t, err)
		defer resp.Body.Close()
		var kept map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&kept), what)
		return resp.StatusCode, kept
	}
	code, kept := get()
	if assert.Equal(t, 200, code, "%s: GET %s: %v", what, id, kept) {
		assert.Equal(t, v, kept, "%s: the kept response", what)
	}
	if !remove {
		return
	}
	req, err := http.NewRequest("DELETE", url+"/v1/responses/"+id, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode, "%s: DELETE %s", what, id)
	code, _ = get()
	assert.Equal(t, 404, code, "%s: GET %s after its DELETE", what, id)
}

// checkTokenize requires /detokenize to give back the text /tokenize
// read.
func checkTokenize(t *testing.T, url, text, what string) {
	t.Helper()
	code, out := post(t, url+"/tokenize", map[string]any{"prompt": text})
	if !assert.Equal(t, 200, code, "%s: %v", what, out) {
		return
	}
	ids := out["tokens"].([]any)
	assert.EqualValues(t, len(ids), out["count"], what)
	code, out = post(t, url+"/detokenize", map[string]any{"tokens": ids})
	if assert.Equal(t, 200, code, "%s: %v", what, out) {
		assert.Equal(t, text, out["prompt"], what)
	}
}
