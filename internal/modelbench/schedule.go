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
	BaseP50, BaseP99             time.Duration // inter-token latency, streams alone
	P50, P99                     time.Duration // while the prompt prefills
	TTFT, Alone                  time.Duration // the prompt's first token; Session.Forward of it alone
}

// Line formats the result as `k3 bench model` prints it.
func (r *ScheduleResult) Line() string {
	return fmt.Sprintf("  scheduler, %d streams and a %d-token prompt arriving (chunks of %d): inter-token latency p50 %.1f ms, p99 %.1f ms (%.1fx the streams' p50 of %.1f ms alone, p99 %.1f); the prompt's first token after %.2f s, %.2fx prefilling it alone (%.2f s)\n",
		r.Streams, r.PromptTokens, r.Chunk, ms(r.P50), ms(r.P99), float64(r.P99)/float64(r.BaseP50), ms(r.BaseP50), ms(r.BaseP99),
		r.TTFT.Seconds(), float64(r.TTFT)/float64(r.Alone), r.Alone.Seconds())
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// Schedule streams n generations through a Batcher whose passes carry
// prompt chunks of chunk tokens, measures their inter-token latency, then
// submits a prompt of promptLen tokens (the byte-level tokenizer: one
// byte a token) and measures the latency again while it prefills, and its
// time to first token against a lone Session.Forward of it.
func Schedule(ctx context.Context, m *k3.Model, n, promptLen, chunk int) (*ScheduleResult, error) {
	r := &ScheduleResult{Streams: n, PromptTokens: promptLen, Chunk: chunk}
	long := strings.Repeat("x", promptLen)
	if got := len(m.Encode(long)); got != promptLen {
		return nil, fmt.Errorf("modelbench: the prompt encodes to %d tokens, want %d", got, promptLen)
	}
	alone, err := m.NewSession()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if _, err := alone.Forward(ctx, m.Encode(long)); err != nil {
		return nil, err
	}
	r.Alone = time.Since(start)
	alone.Close()

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
	r.BaseP50, r.BaseP99 = pct(base, 0.5), pct(base, 0.99)
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
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		return nil, err
	}
	if len(base) == 0 || len(during) == 0 {
		return nil, fmt.Errorf("modelbench: no inter-token gaps measured (%d alone, %d during the prompt)", len(base), len(during))
	}
	return r, nil
}
