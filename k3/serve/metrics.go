package serve

import (
	"bufio"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// metrics are the server's counters and histograms; gauges are read from
// the model and the batcher when scraped.
type metrics struct {
	model                string
	generated            atomic.Int64
	drafts, accepted     atomic.Int64 // speculative decoding's draft tokens, and those accepted
	prompt, promptCached atomic.Int64
	mu                   sync.Mutex
	finishes             map[string]int64 // finished_reason -> choices (a request for n counts n, as vLLM's child requests do)
	failures             map[string]int64 // rejected, abort, error -> requests
	ttft, itl, e2e       *histogram
}

func newMetrics(model string) *metrics {
	return &metrics{model: model, finishes: map[string]int64{}, failures: map[string]int64{},
		ttft: newHistogram(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80),
		itl:  newHistogram(0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 10),
		e2e:  newHistogram(0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960)}
}

func (m *metrics) finished(reason string) {
	m.mu.Lock()
	m.finishes[reason]++
	m.mu.Unlock()
}

func (m *metrics) failed(reason string) {
	m.mu.Lock()
	m.failures[reason]++
	m.mu.Unlock()
}

func (m *metrics) promptTokens(n, cached int) {
	m.prompt.Add(int64(n))
	m.promptCached.Add(int64(cached))
}

// histogram is a Prometheus histogram with fixed upper bounds.
type histogram struct {
	mu     sync.Mutex
	bounds []float64
	counts []int64 // counts[i]: observations <= bounds[i] and > bounds[i-1]; the last is +Inf
	sum    float64
	n      int64
}

func newHistogram(bounds ...float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]int64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v) // the first bound >= v
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.n++
	h.mu.Unlock()
}

// promWriter writes the Prometheus text exposition format (version 0.0.4).
type promWriter struct {
	w     *bufio.Writer
	model string
}

func (p *promWriter) head(name, typ, help string) {
	fmt.Fprintf(p.w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// sample writes one line; labels alternate names and values.
func (p *promWriter) sample(name string, v float64, labels ...string) {
	p.w.WriteString(name)
	p.w.WriteString(`{model_name="`)
	p.w.WriteString(escapeLabel(p.model))
	p.w.WriteByte('"')
	for i := 0; i+1 < len(labels); i += 2 {
		fmt.Fprintf(p.w, `,%s="%s"`, labels[i], escapeLabel(labels[i+1]))
	}
	p.w.WriteString("} ")
	p.w.WriteString(formatFloat(v))
	p.w.WriteByte('\n')
}

func (p *promWriter) gauge(name, help string, v float64, labels ...string) {
	p.head(name, "gauge", help)
	p.sample(name, v, labels...)
}

func (p *promWriter) counter(name, help string, v float64) {
	p.head(name, "counter", help)
	p.sample(name, v)
}

func (p *promWriter) histogram(name, help string, h *histogram) {
	h.mu.Lock()
	counts := append([]int64(nil), h.counts...)
	sum, n := h.sum, h.n
	h.mu.Unlock()
	p.head(name, "histogram", help)
	var cum int64
	for i, b := range h.bounds {
		cum += counts[i]
		p.sample(name+"_bucket", float64(cum), "le", formatFloat(b))
	}
	p.sample(name+"_bucket", float64(n), "le", "+Inf")
	p.sample(name+"_sum", sum)
	p.sample(name+"_count", float64(n))
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func escapeLabel(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			out = append(out, '\\', '\\')
		case '"':
			out = append(out, '\\', '"')
		case '\n':
			out = append(out, '\\', 'n')
		default:
			out = append(out, c)
		}
	}
	return string(out)
}

// metrics answers a Prometheus scrape. The names an inference gateway's
// endpoint picker reads by default are vLLM's; the rest follow them.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	p := &promWriter{w: bufio.NewWriter(w), model: s.cfg.Name}
	defer p.w.Flush()
	st := s.e.stats()
	mem := s.e.memory()
	p.gauge("vllm:num_requests_running", "Sequences in the scheduler's passes.", float64(st.Running))
	p.gauge("vllm:num_requests_waiting", "Sequences submitted and waiting for a place in the passes.", float64(st.Waiting))
	// As vLLM's, the fraction excludes what the prefix cache alone holds,
	// which yields to requests: the endpoint picker reads it as load (its
	// saturation threshold, 0.8 by default, and its KV-cache scorer).
	usage := 0.0
	if mem.Budget > 0 {
		usage = float64(mem.Used-mem.Promised-mem.FreePages-mem.FreeStates-mem.PrefixAlone) / float64(mem.Budget)
	}
	p.gauge("vllm:kv_cache_usage_perc", "Fraction of the sequence-state budget requests hold (attention pages, KDA states and snapshots; not what only the prefix cache holds); 0 without a budget.", usage)
	// num_gpu_blocks sizes the endpoint picker's index of each server's
	// cached blocks, so it is the prefix cache's capacity: in vLLM freed
	// pages stay cached and the pool is the cache, here the cache has a
	// budget of its own and KDA snapshots besides pages.
	p.gauge("vllm:cache_config_info", "The prefix cache's layout: block_size is the attention page in tokens, num_gpu_blocks the pages' worth of tokens the prefix cache holds at most.", 1,
		"block_size", strconv.Itoa(mem.PageTokens), "num_gpu_blocks", strconv.FormatInt(mem.PrefixPages, 10))
	// The endpoint picker's default mapping reads this too, and logs its
	// absence: k3 serves no LoRA adapters, so none can be loaded (max_lora
	// 0), which its LoRA scorer reads as it reads a server without the
	// series. The value is the time of the reading, as vLLM's.
	p.gauge("vllm:lora_requests_info", "LoRA adapters: k3 serves none.", float64(time.Now().Unix()),
		"max_lora", "0", "running_lora_adapters", "", "waiting_lora_adapters", "")
	p.gauge("k3:memory_used_bytes", "Bytes of sequence state held, and kept for running requests' growth.", float64(mem.Used))
	p.gauge("k3:memory_promised_bytes", "Of k3:memory_used_bytes, what is kept for what running requests may still grow by.", float64(mem.Promised))
	p.gauge("k3:memory_budget_bytes", "The sequence-state budget in bytes (0: none).", float64(mem.Budget))
	p.counter("vllm:prompt_tokens_total", "Prompt tokens of finished requests.", float64(s.met.prompt.Load()))
	p.counter("vllm:generation_tokens_total", "Tokens generated by finished requests.", float64(s.met.generated.Load()))
	p.counter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", float64(s.met.prompt.Load()))
	p.counter("vllm:prefix_cache_hits_total", "Prompt tokens resumed from the prefix cache rather than computed.", float64(s.met.promptCached.Load()))
	ps := s.m.PrefixCacheStats()
	p.counter("k3:prefix_cache_lookups_total", "Prompts looked up in the prefix cache.", float64(ps.Lookups))
	p.counter("k3:prefix_cache_hit_lookups_total", "Prompt lookups that resumed from a cached KDA snapshot.", float64(ps.Hits))
	p.gauge("k3:prefix_cache_bytes", "Bytes the prefix cache holds.", float64(ps.Bytes))

	if s.cfg.Speculation != nil || s.drafters != nil {
		p.counter("vllm:spec_decode_num_draft_tokens_total", "Draft tokens proposed by speculative decoding.", float64(s.met.drafts.Load()))
		p.counter("vllm:spec_decode_num_accepted_tokens_total", "Draft tokens accepted (each a token decoded without a pass of its own).", float64(s.met.accepted.Load()))
	}
	if s.kv != nil {
		st := s.kv.Stats()
		p.gauge("k3:kv_events_subscribers", "KV-event subscribers connected and subscribed.", float64(st.Subscribers))
		p.counter("k3:kv_events_messages_total", "KV-event messages sent, over all subscribers.", float64(st.Sent))
		p.counter("k3:kv_events_laggards_total", "KV-event subscribers disconnected for falling 1,024 messages behind.", float64(st.Laggards))
	}
	if s.kept.enabled() {
		n, bytes := s.kept.stats()
		p.gauge("k3:responses_kept", "Finished /v1/responses kept for previous_response_id and GET.", float64(n))
		p.gauge("k3:responses_kept_bytes", "Bytes those responses hold (objects and conversations, as JSON).", float64(bytes))
	}
	live, parked := s.store.counts()
	p.gauge("k3:sessions_live", "Sessions kept in memory for requests that name one (K3-Session).", float64(live))
	p.counter("k3:sessions_parked_total", "Idle kept sessions saved to the session directory.", float64(parked))
	s.met.mu.Lock()
	finishes := copyCounts(s.met.finishes)
	failures := copyCounts(s.met.failures)
	s.met.mu.Unlock()
	p.head("vllm:request_success_total", "counter", "Choices that finished, by finish reason (a request for n choices counts n).")
	for _, reason := range []string{"stop", "length"} {
		p.sample("vllm:request_success_total", float64(finishes[reason]), "finished_reason", reason)
	}
	p.head("k3:request_failures_total", "counter", "Requests that did not finish: rejected (bad or over the queue), abort (the client left), error.")
	for _, reason := range []string{"abort", "error", "rejected"} {
		p.sample("k3:request_failures_total", float64(failures[reason]), "reason", reason)
	}
	p.histogram("vllm:time_to_first_token_seconds", "Time from a request's arrival to its first token.", s.met.ttft)
	p.histogram("vllm:inter_token_latency_seconds", "Time between a choice's consecutive tokens.", s.met.itl)
	p.histogram("vllm:e2e_request_latency_seconds", "Time from a request's arrival to each choice's last token.", s.met.e2e)
}

func copyCounts(m map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
