// Package servebench is the harness behind `k3 bench serve`: streaming
// clients on loopback against a k3/serve server at several concurrency
// levels, each level beside a peer run of the same generations straight
// through a k3.Batcher in the same process, so the HTTP path's cost is a
// ratio to the engine's own throughput measured minutes apart at most.
package servebench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"k3/k3"
	"k3/k3/serve"
)

// Options bound a run; every level is bounded in requests and in time.
type Options struct {
	Clients      []int         // concurrency levels
	PerClient    int           // requests each client sends per level
	PromptTokens int           // random prompt tokens per request
	MaxTokens    int           // tokens generated per request (ignore_eos)
	LevelTimeout time.Duration // a level that runs longer stops and counts the rest as errors
}

// Level is one concurrency level's figures.
type Level struct {
	Clients, Requests, Errors int
	Seconds                   float64
	RequestsPerSec, TokensPerSec,
	DirectTokensPerSec float64 // the same generations through a Batcher, no HTTP
	TTFT, ITL      [2]time.Duration // p50, p99 as the clients see them
	GoroutinesLeft int              // over the count before the level, after it settles
}

// Chat is a two-turn conversation's first-token times over HTTP: the
// second turn's prompt holds the first turn and its answer, which the
// prefix cache has kept.
type Chat struct {
	HistoryTokens      int
	First, Second      time.Duration // time to the first streamed token
	CachedTokens       int           // of the second turn's prompt, as usage reports
	SecondPromptTokens int
}

// Run serves m on a loopback port and measures each level of o.Clients,
// then a two-turn chat (m should have a prefix cache).
func Run(ctx context.Context, m *k3.Model, o Options, log func(string)) ([]Level, *Chat, error) {
	maxClients := slices.Max(o.Clients)
	srv, err := serve.New(m, serve.Config{Name: "bench", MaxSequences: maxClients, MaxQueue: maxClients, MaxTokens: max(o.MaxTokens, 32)})
	if err != nil {
		return nil, nil, err
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	hs := &http.Server{Handler: srv}
	go hs.Serve(ln)
	defer hs.Close()
	url := "http://" + ln.Addr().String()

	direct, err := m.NewBatcher(maxClients)
	if err != nil {
		return nil, nil, err
	}
	dctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := direct.Start(dctx); err != nil {
		return nil, nil, err
	}

	rng := rand.New(rand.NewPCG(1, 2))
	// One request first, so that no level pays for faulting the weights in.
	warm := make([]int32, o.PromptTokens)
	for j := range warm {
		warm[j] = int32(rng.IntN(m.VocabSize()))
	}
	if _, err := stream(ctx, http.DefaultClient, url, warm, o.MaxTokens); err != nil {
		return nil, nil, fmt.Errorf("servebench: warm-up request: %w", err)
	}
	var out []Level
	for _, c := range o.Clients {
		prompts := make([][]int32, c*o.PerClient)
		for i := range prompts {
			prompts[i] = make([]int32, o.PromptTokens)
			for j := range prompts[i] {
				prompts[i][j] = int32(rng.IntN(m.VocabSize()))
			}
		}
		before := runtime.NumGoroutine()
		log(fmt.Sprintf("%d clients: %d streaming requests of %d+%d tokens...", c, len(prompts), o.PromptTokens, o.MaxTokens))
		lv, err := level(ctx, url, c, prompts, o)
		if err != nil {
			return nil, nil, err
		}
		lv.GoroutinesLeft = settle(before)
		log(fmt.Sprintf("%d clients: the same generations through the Batcher in process...", c))
		// Prompts of their own: the server's are in the prefix cache now.
		for i := range prompts {
			for j := range prompts[i] {
				prompts[i][j] = int32(rng.IntN(m.VocabSize()))
			}
		}
		if lv.DirectTokensPerSec, err = peer(ctx, m, direct, c, prompts, o.MaxTokens); err != nil {
			return nil, nil, err
		}
		out = append(out, lv)
	}
	log("a two-turn chat with a 1,000-token first prompt...")
	chat, err := twoTurns(ctx, url, m, 1000)
	if err != nil {
		return nil, nil, err
	}
	return out, chat, nil
}

// settle waits briefly for goroutines to return to before and returns how
// many are still over it.
func settle(before int) int {
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return max(0, runtime.NumGoroutine()-before)
}

func level(ctx context.Context, url string, c int, prompts [][]int32, o Options) (Level, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: c, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	lctx, cancel := context.WithTimeout(ctx, o.LevelTimeout)
	defer cancel()
	var mu sync.Mutex
	var ttft, itl []time.Duration
	lv := Level{Clients: c, Requests: len(prompts)}
	tokens := 0
	next := make(chan []int32, len(prompts))
	for _, p := range prompts {
		next <- p
	}
	close(next)
	start := time.Now()
	var wg sync.WaitGroup
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range next {
				r, err := stream(lctx, client, url, p, o.MaxTokens)
				mu.Lock()
				if err != nil {
					lv.Errors++
				} else {
					ttft = append(ttft, r.ttft)
					itl = append(itl, r.gaps...)
					tokens += r.tokens
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return lv, err
	}
	lv.Seconds = time.Since(start).Seconds()
	lv.RequestsPerSec = float64(lv.Requests-lv.Errors) / lv.Seconds
	lv.TokensPerSec = float64(tokens) / lv.Seconds
	lv.TTFT = percentiles(ttft)
	lv.ITL = percentiles(itl)
	return lv, nil
}

func percentiles(d []time.Duration) [2]time.Duration {
	if len(d) == 0 {
		return [2]time.Duration{}
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return [2]time.Duration{at(0.5), at(0.99)}
}

type streamed struct {
	ttft   time.Duration
	gaps   []time.Duration
	tokens int
	cached int // prompt tokens the usage reports as taken from the prefix cache
}

// stream sends one streaming completion and times its chunks; a request
// that does not end with its usage and [DONE] is an error.
func stream(ctx context.Context, client *http.Client, url string, prompt []int32, maxTokens int) (streamed, error) {
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true,
		"stream": true, "stream_options": map[string]any{"include_usage": true}})
	req, err := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return streamed{}, err
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return streamed{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return streamed{}, fmt.Errorf("status %d", resp.StatusCode)
	}
	var r streamed
	var last time.Time
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		now := time.Now()
		if line == "[DONE]" {
			done = true
			break
		}
		var ev struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
				Details          struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			return r, err
		}
		if ev.Usage != nil {
			r.tokens, r.cached = ev.Usage.CompletionTokens, ev.Usage.Details.Cached
			continue
		}
		if len(ev.Choices) == 0 {
			continue
		}
		if last.IsZero() {
			r.ttft = now.Sub(start)
		} else {
			r.gaps = append(r.gaps, now.Sub(last))
		}
		last = now
	}
	if err := sc.Err(); err != nil {
		return r, err
	}
	if !done || r.tokens != maxTokens {
		return r, errors.New("stream ended early")
	}
	return r, nil
}

// peer runs the same generations, c at a time, through a Batcher in
// process and returns their tokens per second.
func peer(ctx context.Context, m *k3.Model, b *k3.Batcher, c int, prompts [][]int32, maxTokens int) (float64, error) {
	next := make(chan []int32, len(prompts))
	for _, p := range prompts {
		next <- p
	}
	close(next)
	var mu sync.Mutex
	var firstErr error
	tokens := 0
	start := time.Now()
	var wg sync.WaitGroup
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range next {
				s, err := m.NewSession()
				if err != nil {
					mu.Lock()
					firstErr = cmp(firstErr, err)
					mu.Unlock()
					return
				}
				n := 0
				for _, err := range b.GenerateTokens(ctx, s, p, k3.WithMaxTokens(maxTokens), k3.WithoutDefaultStops()) {
					if err != nil {
						mu.Lock()
						firstErr = cmp(firstErr, err)
						mu.Unlock()
						break
					}
					n++
				}
				s.Close()
				mu.Lock()
				tokens += n
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(tokens) / time.Since(start).Seconds(), nil
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// twoTurns times a conversation's two turns over HTTP: a first prompt of
// n random tokens (its time is the cold prefill's), a 32-token answer,
// then the whole exchange and 24 new tokens.
func twoTurns(ctx context.Context, url string, m *k3.Model, n int) (*Chat, error) {
	rng := rand.New(rand.NewPCG(7, 8))
	prompt := make([]int32, n)
	for i := range prompt {
		prompt[i] = int32(rng.IntN(m.VocabSize()))
	}
	turn := func(p []int32) (time.Duration, int, error) {
		r, err := stream(ctx, http.DefaultClient, url, p, 32)
		return r.ttft, r.cached, err
	}
	// A warm-up turn on other tokens, so that the first turn is a cold
	// prefill and not the first pass after Load.
	warm := make([]int32, 64)
	for i := range warm {
		warm[i] = int32(rng.IntN(m.VocabSize()))
	}
	if _, _, err := turn(warm); err != nil {
		return nil, err
	}
	first, _, err := turn(prompt)
	if err != nil {
		return nil, err
	}
	// The second turn: the first prompt, its greedy answer (computed here
	// as the server computed it: the Batcher's tokens are Session's), then
	// new tokens.
	s, err := m.NewSession()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var answer []int32
	for tok, err := range s.GenerateTokens(ctx, prompt, k3.WithMaxTokens(32), k3.WithoutDefaultStops()) {
		if err != nil {
			return nil, err
		}
		answer = append(answer, tok.ID)
	}
	second := append(append(slices.Clone(prompt), answer...), prompt[:24]...)
	secondT, cached, err := turn(second)
	if err != nil {
		return nil, err
	}
	return &Chat{HistoryTokens: n, First: first, Second: secondT, CachedTokens: cached, SecondPromptTokens: len(second)}, nil
}
