package modelbench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k3/k3"
)

// ScheduleResult is what a long prompt arriving beside running streams
// does to them: their inter-token latency without and with it, and the
// prompt's time to its first token against prefilling it alone.
type ScheduleResult struct {
	Streams, PromptTokens, Chunk int
	BaseP50, BaseP99             time.Duration // inter-token latency, streams alone (before and after the prompt)
	P50, P99                     time.Duration // while the prompt prefills
	TTFT                         time.Duration // the prompt's first token
	// Alone is the mean of two lone Session.Forward runs of the prompt,
	// AloneBefore the streams start and AloneAfter they end: a shared
	// host's speed drifts over the minute the measurement takes.
	Alone, AloneBefore, AloneAfter time.Duration
}

// Line formats the result as `k3 bench model` prints it.
func (r *ScheduleResult) Line() string {
	return fmt.Sprintf("  scheduler, %d streams and a %d-token prompt arriving (chunks of %d): inter-token latency p50 %.1f ms, p99 %.1f ms (%.1fx the streams' p50 of %.1f ms alone, p99 %.1f); the prompt's first token after %.2f s, %.2fx prefilling it alone (%.2f s, the mean of %.2f before and %.2f after)\n",
		r.Streams, r.PromptTokens, r.Chunk, ms(r.P50), ms(r.P99), float64(r.P99)/float64(r.BaseP50), ms(r.BaseP50), ms(r.BaseP99),
		r.TTFT.Seconds(), float64(r.TTFT)/float64(r.Alone), r.Alone.Seconds(), r.AloneBefore.Seconds(), r.AloneAfter.Seconds()) +
		r.windowLine()
}

// windowLine is Window in words, or nothing where the passes with the
// prompt were not slower than the streams alone.
func (r *ScheduleResult) windowLine() string {
	pTok, aloneTok, spread, fit := r.Window()
	if pTok <= 0 || aloneTok <= 0 {
		return ""
	}
	return fmt.Sprintf("    a prompt token cost %.3f ms in those passes against %.3f ms alone (%.2fx), their p99 %.2fx their p50: some chunk size meets both targets only if (2/%.2f - 1)(3/%.2f - 1) >= 1; here %.2f\n",
		ms(pTok), ms(aloneTok), float64(pTok)/float64(aloneTok), spread, float64(pTok)/float64(aloneTok), spread, fit)
}

// Window reads the run as the two targets' arithmetic: a pass carrying a
// chunk of C prompt tokens costs the streams' step D plus C·p' (pTok, from
// the passes' p50 over the streams' p50 alone), where the lone prefill
// costs p a token (aloneTok) and the passes' p99 is spread times their
// p50. The first token then comes at about (p'/p)(1 + D/(C·p')) the lone
// prefill's time and the p99 at spread·(1 + C·p'/D) the streams' p50, so
// some C meets both "within 2x" and "within 3x" only where
// fit = (2p/p' - 1)(3/spread - 1) >= 1.
func (r *ScheduleResult) Window() (pTok, aloneTok time.Duration, spread, fit float64) {
	pTok = (r.P50 - r.BaseP50) / time.Duration(max(r.Chunk, 1))
	aloneTok = r.Alone / time.Duration(max(r.PromptTokens, 1))
	spread = float64(r.P99) / float64(r.P50)
	fit = (2*float64(aloneTok)/float64(pTok) - 1) * (3/spread - 1)
	return pTok, aloneTok, spread, fit
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// Schedule streams n generations through a Batcher whose passes carry
// prompt chunks of chunk tokens, measures their inter-token latency, then
// submits a prompt of promptLen tokens (the byte-level tokenizer: one
// byte a token) and measures the latency again while it prefills, and its
// time to first token against a lone Session.Forward of it. The streams'
// baseline latency is taken on both sides of the prompt, and the lone
// prefill before and after the streams, so that a drift of the host's
// speed during the minute this takes moves both sides of each ratio.
func Schedule(ctx context.Context, m *k3.Model, n, promptLen, chunk int) (*ScheduleResult, error) {
	r := &ScheduleResult{Streams: n, PromptTokens: promptLen, Chunk: chunk}
	long := strings.Repeat("x", promptLen)
	if got := len(m.Encode(long)); got != promptLen {
		return nil, fmt.Errorf("modelbench: the prompt encodes to %d tokens, want %d", got, promptLen)
	}
	outer := ctx // the streams' context below is cancelled before the second lone prefill
	prefillAlone := func() (time.Duration, error) {
		alone, err := m.NewSession()
		if err != nil {
			return 0, err
		}
		defer alone.Close()
		start := time.Now()
		_, err = alone.Forward(outer, m.Encode(long))
		return time.Since(start), err
	}
	var err error
	if r.AloneBefore, err = prefillAlone(); err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	br, err := m.NewBatcher(n+1, k3.WithTokenBudget(n+1+chunk))
	if err != nil {
		return nil, err
	}
	if err := br.Start(ctx); err != nil {
		return nil, err
	}
	defer br.Wait()
	// Each stream records when every token arrived; a stream ends when
	// ctx is cancelled.
	var mu sync.Mutex
	arrivals := make([][]time.Time, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		s, err := m.NewSession()
		if err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.Close()
			for _, err := range br.Generate(ctx, s, fmt.Sprintf("stream %d says:", i), k3.WithMaxTokens(4000), k3.WithoutDefaultStops()) {
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				mu.Lock()
				arrivals[i] = append(arrivals[i], time.Now())
				mu.Unlock()
			}
		}()
	}
	gaps := func(from, to time.Time) []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		var g []time.Duration
		for _, a := range arrivals {
			for j := 1; j < len(a); j++ {
				if a[j-1].After(from) && a[j].Before(to) {
					g = append(g, a[j].Sub(a[j-1]))
				}
			}
		}
		slices.Sort(g)
		return g
	}
	pct := func(g []time.Duration, p float64) time.Duration {
		if len(g) == 0 {
			return 0
		}
		return g[min(len(g)-1, int(p*float64(len(g))))]
	}
	// Streams alone for two seconds (after a warm-up second).
	time.Sleep(time.Second)
	t0 := time.Now()
	time.Sleep(2 * time.Second)
	base := gaps(t0, time.Now())
	// The long prompt arrives.
	s, err := m.NewSession()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	t1 := time.Now()
	var t2 time.Time
	for _, err := range br.Generate(ctx, s, long, k3.WithMaxTokens(1), k3.WithoutDefaultStops()) {
		if err != nil {
			return nil, err
		}
		if t2.IsZero() {
			t2 = time.Now()
		}
	}
	r.TTFT = t2.Sub(t1)
	during := gaps(t1, t2)
	r.P50, r.P99 = pct(during, 0.5), pct(during, 0.99)
	// The streams alone again for two seconds: the baseline pools both
	// stretches, on either side of the prompt.
	time.Sleep(time.Second)
	t3 := time.Now()
	time.Sleep(2 * time.Second)
	base = append(base, gaps(t3, time.Now())...)
	slices.Sort(base)
	r.BaseP50, r.BaseP99 = pct(base, 0.5), pct(base, 0.99)
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		return nil, err
	}
	if r.AloneAfter, err = prefillAlone(); err != nil {
		return nil, err
	}
	r.Alone = (r.AloneBefore + r.AloneAfter) / 2
	if len(base) == 0 || len(during) == 0 {
		return nil, fmt.Errorf("modelbench: no inter-token gaps measured (%d alone, %d during the prompt)", len(base), len(during))
	}
	return r, nil
}

// ChatResult is a conversation's second turn against its first: the
// second prompt holds the first turn, its answer and a new question, and
// resumes from the prefix cache.
type ChatResult struct {
	History, Answer, Question int
	First, Second             time.Duration // time to first token
	Reused                    int
}

// Line formats the result as `k3 bench model` prints it.
func (r *ChatResult) Line() string {
	return fmt.Sprintf("  chat with the prefix cache: a %d-token first turn reaches its first token in %.0f ms; the second turn (%d tokens of history, %d new) in %.0f ms, %.3fx the first (%d tokens resumed from the cache)\n",
		r.History, ms(r.First), r.History+r.Answer, r.Question, ms(r.Second), float64(r.Second)/float64(r.First), r.Reused)
}

// Chat times the first token of two turns of a conversation on a model
// loaded from dir with a prefix cache: a history-token first prompt, an
// answer of answer tokens, then a second prompt of the whole conversation
// and question more tokens, each turn a new session as a server runs it.
func Chat(ctx context.Context, dir string, history, answer, question int, opts ...k3.Option) (*ChatResult, error) {
	m, err := k3.Load(ctx, dir, append(opts, k3.WithPrefixCache(1<<30))...)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	r := &ChatResult{History: history, Answer: answer, Question: question}
	turn := func(prompt []int32, max int) ([]int32, time.Duration, error) {
		s, err := m.NewSession()
		if err != nil {
			return nil, 0, err
		}
		defer s.Close()
		start := time.Now()
		var ttft time.Duration
		var out []int32
		for tok, err := range s.GenerateTokens(ctx, prompt, k3.WithMaxTokens(max), k3.WithoutDefaultStops()) {
			if err != nil {
				return nil, 0, err
			}
			if ttft == 0 {
				ttft = time.Since(start)
			}
			out = append(out, tok.ID)
		}
		return out, ttft, nil
	}
	// A first run of another text faults the weights in, so the first
	// turn's time is the warm one.
	if _, _, err := turn(m.Encode(strings.Repeat("warm ", 64)), 1); err != nil {
		return nil, err
	}
	first := m.Encode(strings.Repeat("The user asks about Go. ", history)[:history])
	ans, ttft1, err := turn(first, answer)
	if err != nil {
		return nil, err
	}
	r.First = ttft1
	second := append(append(first, ans...), m.Encode(strings.Repeat("?", question))...)
	before := m.PrefixCacheStats()
	if _, r.Second, err = turn(second, 1); err != nil {
		return nil, err
	}
	r.Reused = int(m.PrefixCacheStats().ReusedTokens - before.ReusedTokens)
	return r, nil
}
