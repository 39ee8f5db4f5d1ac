package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"k3/k3"
)

// generation returns the handler of a generating route: it decodes a
// request body of type R, makes its job (an error answers the request,
// counted as rejected) and completes it.
func generation[R any](s *Server, makeJob func(*R) (*job, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req R
		if !s.decode(w, r, &req) {
			return
		}
		j, err := makeJob(&req)
		if err != nil {
			s.met.failed("rejected")
			writeError(w, err)
			return
		}
		s.complete(w, r, j)
	}
}

// event is one step of one choice: a token or the error that ended it.
type event struct {
	choice int
	tok    k3.Token
	err    error
}

// complete runs a validated request: it takes room in the queue, starts
// the choices' generations in the batcher and answers as one JSON object
// or as a stream of events.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, j *job) {
	start := time.Now()
	total := j.choices()
	if !s.sem.TryAcquire(int64(total)) {
		s.met.failed("rejected")
		writeError(w, &apiError{status: 429, typ: "rate_limit_error",
			msg: fmt.Sprintf("server busy: %d sequences decode at once and %d may wait; try again", s.cfg.MaxSequences, s.cfg.MaxQueue)})
		return
	}
	defer s.sem.Release(int64(total))
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()

	var sessions []seq
	defer func() {
		for _, ss := range sessions {
			ss.Close()
		}
	}()
	newSession := func() (seq, error) {
		ss, err := s.e.newSeq()
		if err == nil {
			sessions = append(sessions, ss)
		}
		return ss, err
	}
	seqs := make([]iter.Seq2[k3.Token, error], total)
	// own[k] is the session choice k generates in, when the request made
	// it: it closes as soon as the choice ends (below).
	own := make([]seq, total)
	// fork starts choice k on a fork of base (false: failed, answered).
	fork := func(base seq, k int) bool {
		f, err := base.fork()
		if err != nil {
			s.fail(w, err)
			return false
		}
		sessions = append(sessions, f)
		seqs[k], own[k] = s.generate(ctx, f, nil, j.choiceOpts(k)), f
		return true
	}
	cached := make([]int, len(j.prompts)) // per prompt; -1: its first choice's usage says
	echoes := make([]*echoed, len(j.prompts))
	var failed atomic.Bool // a generation failed: a kept session may be unusable
	if id := r.Header.Get(SessionHeader); id != "" {
		if j.echo {
			s.met.failed("rejected")
			writeError(w, badParam("echo", "echo with %s: a kept session's prompt is not scored", SessionHeader))
			return
		}
		if total > 1 {
			s.met.failed("rejected")
			param, what := "n", fmt.Sprintf("n = %d", j.n)
			if len(j.prompts) > 1 {
				param, what = "prompt", fmt.Sprintf("%d prompts", len(j.prompts))
			}
			writeError(w, badParam(param, "%s with %s: a kept session holds one conversation, so a request on it has one prompt and n = 1", what, SessionHeader))
			return
		}
		cached[0] = -1
		ss, err := s.store.take(id)
		if err != nil {
			s.fail(w, err)
			return
		}
		// Given back once the generation has let go of it (deferred
		// before the wait below, so it runs after).
		defer func() { s.store.put(id, ss, !failed.Load()) }()
		feed, err := continueFrom(ctx, ss, j.prompts[0])
		if err != nil {
			failed.Store(true)
			s.fail(w, err)
			return
		}
		seqs[0] = s.generate(ctx, ss, feed, j.choiceOpts(0))
	} else {
		for p, prompt := range j.prompts {
			k := p * j.n // the prompt's first choice
			if j.echo {
				// The prompt is scored first (every position's logits, a
				// chunk at a time), then the choices go on from it.
				base, err := newSession()
				if err != nil {
					s.fail(w, err)
					return
				}
				if echoes[p], err = s.scorePrompt(ctx, base, prompt, j.logprobs, j.top); err != nil {
					s.fail(w, err)
					return
				}
				for i := range j.n {
					switch {
					case j.maxTokens[p] == 0:
						seqs[k+i] = finished(len(prompt))
					case i == j.n-1:
						seqs[k+i], own[k+i] = s.generate(ctx, base, nil, j.choiceOpts(k+i)), base
					default:
						if !fork(base, k+i) {
							return
						}
					}
				}
				continue
			}
			if j.n == 1 {
				ss, err := newSession()
				if err != nil {
					s.fail(w, err)
					return
				}
				cached[p] = -1
				seqs[k], own[k] = s.generate(ctx, ss, prompt, j.choiceOpts(k)), ss
				continue
			}
			// The prompt prefills once; its choices fork its state.
			base, err := newSession()
			if err != nil {
				s.fail(w, err)
				return
			}
			if cached[p], err = s.e.prefill(ctx, base, prompt); err != nil {
				s.fail(w, err)
				return
			}
			// The last choice goes on in the prompt's own session: a
			// session left idle beside its forks would hold memory they
			// may wait for under the budget.
			for i := range j.n - 1 {
				if !fork(base, k+i) {
					return
				}
			}
			seqs[k+j.n-1], own[k+j.n-1] = s.generate(ctx, base, nil, j.choiceOpts(k+j.n-1)), base
		}
	}

	events := make(chan event, 4*total)
	var wg sync.WaitGroup
	for i, seq := range seqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ss := own[i]; ss != nil {
				// A choice that ended gives its memory back at once (the
				// batcher has let go of the session when seq returns):
				// the request's other choices may be waiting for it
				// under the memory budget.
				defer ss.Close()
			}
			for tok, err := range seq {
				// A generation the client or the server's stop cut short
				// (the batcher ends requests between passes) leaves its
				// session whole; any other error may not.
				if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, k3.ErrBatcherClosed) {
					failed.Store(true)
				}
				select {
				case events <- event{choice: i, tok: tok, err: err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	go func() {
		wg.Wait()
		close(events)
	}()
	// The sessions close (deferred above) only once every generation has
	// let go of them: cancel, then wait.
	defer wg.Wait()
	defer cancel()

	prefix := "cmpl-"
	switch {
	case j.resp != nil:
		prefix = "resp_"
	case j.chat:
		prefix = "chatcmpl-"
	}
	a := &answer{j: j, s: s, id: newID(prefix), created: time.Now().Unix(), start: start,
		choices: make([]choice, total), cached: cached, echoes: echoes}
	for k := range a.choices {
		if e := echoes[k/j.n]; e != nil {
			a.choices[k].offsets = e.chars // text_offset counts the echoed prompt
		}
	}
	switch {
	case j.resp != nil && j.stream:
		a.responseStream(ctx, w, events)
	case j.resp != nil:
		a.responseWhole(w, events)
	case j.stream:
		a.stream(ctx, w, events)
	default:
		a.whole(w, events)
	}
}

func (s *Server) fail(w http.ResponseWriter, err error) {
	s.abandoned(err)
	writeError(w, err)
}

func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// answer gathers a request's choices as their tokens arrive.
type answer struct {
	j       *job
	s       *Server
	id      string
	created int64
	start   time.Time
	choices []choice
	cached  []int     // per prompt: tokens resumed from the prefix cache (-1: its first choice's usage says)
	echoes  []*echoed // per prompt, with echo: the prompt as the answer repeats it
	first   bool      // a token has arrived
	done    int       // choices finished
}

type choice struct {
	text      []byte
	finish    string
	generated int
	cached    int
	last      time.Time
	lps       []tokenLogprob // chat
	tools     toolStream     // chat with tools, streamed
	reason    reasoningStream
	thinking  reasoningStream // counts the reasoning tokens, whole answers too
	reasoned  int             // tokens generated before the reasoning ended
	offsets   int             // completions: text_offset of the next token (tokenChars of those before)
	legacy    legacyLogprobs  // completions
}

// tokenLogprob is one entry of a chat choice's logprobs.content.
type tokenLogprob struct {
	Token       string         `json:"token"`
	Logprob     float32        `json:"logprob"`
	Bytes       []int          `json:"bytes"`
	TopLogprobs []topLogprobEn `json:"top_logprobs"`
}

type topLogprobEn struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// legacyLogprobs is a completion choice's logprobs.
type legacyLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float32           `json:"token_logprobs"` // nil: an echoed prompt's first token
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// echoOf is choice k's echoed prompt (nil without echo).
func (a *answer) echoOf(k int) *echoed {
	if a.echoes == nil {
		return nil
	}
	return a.echoes[k/a.j.n]
}

func (a *answer) tokenBytes(id int32) []byte { return a.s.m.Tokenizer().TokenBytes(id) }

func byteList(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

// take records ev's token in its choice and returns the pieces a stream
// chunk carries: the text and, with logprobs, the token's entries.
func (a *answer) take(ev event) (text string, lp []tokenLogprob, legacy *legacyLogprobs) {
	c := &a.choices[ev.choice]
	tok := ev.tok
	now := time.Now()
	if tok.ID >= 0 {
		if !a.first {
			a.first = true
			a.s.met.ttft.observe(now.Sub(a.start).Seconds())
		}
		if !c.last.IsZero() {
			a.s.met.itl.observe(now.Sub(c.last).Seconds())
		}
		c.last = now
		if a.j.logprobs {
			b := a.tokenBytes(tok.ID)
			if a.j.chat {
				e := tokenLogprob{Token: string(b), Logprob: tok.Logprob, Bytes: byteList(b), TopLogprobs: []topLogprobEn{}}
				for _, t := range tok.Top {
					tb := a.tokenBytes(t.ID)
					e.TopLogprobs = append(e.TopLogprobs, topLogprobEn{Token: string(tb), Logprob: t.Logprob, Bytes: byteList(tb)})
				}
				c.lps = append(c.lps, e)
				lp = []tokenLogprob{e}
			} else {
				top := make(map[string]float32, len(tok.Top))
				for _, t := range tok.Top {
					top[string(a.tokenBytes(t.ID))] = t.Logprob
				}
				l := &c.legacy
				l.Tokens = append(l.Tokens, string(b))
				lp := tok.Logprob
				l.TokenLogprobs = append(l.TokenLogprobs, &lp)
				l.TopLogprobs = append(l.TopLogprobs, top)
				l.TextOffset = append(l.TextOffset, c.offsets)
				legacy = &legacyLogprobs{Tokens: []string{string(b)}, TokenLogprobs: []*float32{&lp},
					TopLogprobs: []map[string]float32{top}, TextOffset: []int{c.offsets}}
				c.offsets += tokenChars(b)
			}
		}
	}
	c.text = append(c.text, tok.Text...)
	if a.j.reasoning && tok.ID >= 0 {
		// A token drawn while the reasoning is open is reasoning, the one
		// that closes it included.
		if c.thinking.phase != 2 {
			c.reasoned++
		}
		c.thinking.next(tok.Text)
	}
	if tok.Finish != k3.FinishNone {
		c.finish = finishReason(tok.Finish)
		a.done++
		if u := tok.Usage; u != nil {
			c.generated, c.cached = u.GeneratedTokens, u.CachedTokens
			a.s.met.generated.Add(int64(u.GeneratedTokens))
			a.s.met.drafts.Add(int64(u.DraftTokens))
			a.s.met.accepted.Add(int64(u.AcceptedTokens))
		}
		a.s.met.finished(c.finish)
		a.s.met.e2e.observe(now.Sub(a.start).Seconds())
	}
	return tok.Text, lp, legacy
}

func finishReason(f k3.FinishReason) string {
	switch f {
	case k3.FinishLength, k3.FinishContext:
		return "length"
	}
	return "stop"
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	Details          struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	// With a thinking model's reasoning split off: the tokens of it.
	Completion *struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details,omitempty"`
}

// usage counts each prompt once, whatever its n.
func (a *answer) usage() *usage {
	u := &usage{}
	for p, prompt := range a.j.prompts {
		u.PromptTokens += len(prompt)
		if c := a.cached[p]; c >= 0 {
			u.Details.CachedTokens += c
		} else {
			u.Details.CachedTokens += a.choices[p*a.j.n].cached
		}
	}
	for _, c := range a.choices {
		u.CompletionTokens += c.generated
	}
	if a.j.reasoning {
		u.Completion = &struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		}{}
		for _, c := range a.choices {
			u.Completion.ReasoningTokens += c.reasoned
		}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	a.s.met.promptTokens(u.PromptTokens, u.Details.CachedTokens)
	return u
}

// collect takes every event; false when one was an error (answered) or
// the client went away.
func (a *answer) collect(w http.ResponseWriter, events <-chan event) bool {
	for ev := range events {
		if ev.err != nil {
			a.s.abandoned(ev.err)
			writeError(w, ev.err)
			return false
		}
		a.take(ev)
	}
	if a.done < len(a.choices) {
		a.s.met.failed("abort")
		return false
	}
	return true
}

// whole answers once every choice has finished.
func (a *answer) whole(w http.ResponseWriter, events <-chan event) {
	if !a.collect(w, events) {
		return
	}
	u := a.usage()
	choices := make([]map[string]any, len(a.choices))
	for i, c := range a.choices {
		ch := map[string]any{"index": i, "finish_reason": c.finish, "logprobs": nil}
		if a.j.chat {
			text := string(c.text)
			msg := map[string]any{"role": "assistant"}
			if a.j.reasoning {
				var r string
				r, text = splitReasoning(text, c.finish == "length")
				msg["reasoning_content"] = nullIfEmpty(r)
			}
			msg["content"] = text
			if a.j.tools {
				if content, calls, ok := parseToolCalls(text, c.finish == "length"); ok {
					msg["content"] = nullIfEmpty(content)
					if len(calls) > 0 {
						msg["tool_calls"] = calls
					}
					ch["finish_reason"] = toolFinish(c.finish)
				}
			}
			ch["message"] = msg
			if a.j.logprobs {
				if c.lps == nil {
					c.lps = []tokenLogprob{}
				}
				ch["logprobs"] = map[string]any{"content": c.lps}
			}
		} else {
			ch["text"] = string(c.text)
			if a.j.logprobs {
				ch["logprobs"] = c.legacy
			}
			if e := a.echoOf(i); e != nil {
				ch["text"] = e.text + string(c.text)
				if a.j.logprobs {
					ch["logprobs"] = e.legacy.then(&c.legacy)
				}
			}
		}
		choices[i] = ch
	}
	obj := "text_completion"
	if a.j.chat {
		obj = "chat.completion"
	}
	writeJSON(w, 200, map[string]any{"id": a.id, "object": obj, "created": a.created, "model": a.s.cfg.Name,
		"choices": choices, "usage": u})
}

// abandoned counts a request that ended with err before it finished.
func (s *Server) abandoned(err error) {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		s.met.failed("abort")
	} else {
		s.met.failed("error")
	}
}

// stream answers with server-sent events. The status line waits for the
// first event, so a request that fails before its first token still gets
// an HTTP error.
func (a *answer) stream(ctx context.Context, w http.ResponseWriter, events <-chan event) {
	flusher, _ := w.(http.Flusher)
	started := false
	send := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	end := func() {
		fmt.Fprint(w, "data: [DONE]\n\n")
		if flusher != nil {
			flusher.Flush()
		}
	}
	begin := func() bool {
		if started {
			return true
		}
		started = true
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		w.WriteHeader(200)
		for i := range a.choices {
			switch e := a.echoOf(i); {
			case a.j.chat:
				if !send(a.chunk(i, map[string]any{"role": "assistant", "content": ""}, nil, nil, "", "")) {
					return false
				}
			case e != nil:
				var lp *legacyLogprobs
				if a.j.logprobs {
					lp = &e.legacy
				}
				if !send(a.chunk(i, nil, nil, lp, e.text, "")) {
					return false
				}
			}
		}
		return true
	}
	for ev := range events {
		if ev.err != nil {
			a.s.abandoned(ev.err)
			if ctx.Err() != nil {
				return // the client went away
			}
			if !started {
				writeError(w, ev.err)
				return
			}
			// The error object as a chunk, then [DONE], as vLLM ends a
			// stream that fails: OpenAI's clients raise the error, and a
			// client that reads to [DONE] still finds it.
			if send(asAPIError(ev.err).body()) {
				end()
			}
			return
		}
		if !begin() {
			a.s.met.failed("abort")
			return
		}
		text, lp, legacy := a.take(ev)
		c := a.choices[ev.choice]
		if text == "" && lp == nil && legacy == nil && c.finish == "" {
			continue
		}
		if a.j.tools || a.j.reasoning {
			if !a.streamParsed(send, ev.choice, text, lp) {
				a.s.met.failed("abort")
				return
			}
			continue
		}
		var delta any
		if a.j.chat {
			d := map[string]any{}
			if text != "" || c.finish == "" {
				d["content"] = text
			}
			delta = d
		}
		if !send(a.chunk(ev.choice, delta, lp, legacy, text, c.finish)) {
			a.s.met.failed("abort")
			return
		}
	}
	if a.done < len(a.choices) {
		a.s.met.failed("abort")
		return
	}
	if !begin() {
		return
	}
	if a.j.includeUsage {
		obj := "text_completion"
		if a.j.chat {
			obj = "chat.completion.chunk"
		}
		if !send(map[string]any{"id": a.id, "object": obj, "created": a.created, "model": a.s.cfg.Name,
			"choices": []any{}, "usage": a.usage()}) {
			return
		}
	} else {
		a.usage() // the counters
	}
	end()
}

// streamParsed sends a chat choice's piece of text when the request
// splits it: reasoning and content as reasoningStream and toolStream
// release them, and at the end the calls and the finish reason, each in
// a chunk of its own.
func (a *answer) streamParsed(send func(any) bool, i int, text string, lp []tokenLogprob) bool {
	c := &a.choices[i]
	reasoning, content, calls := a.split(c, text)
	delta := map[string]any{}
	if reasoning != "" {
		delta["reasoning_content"] = reasoning
	}
	if content != "" {
		delta["content"] = content
	}
	if (len(delta) > 0 || lp != nil) && !send(a.chunk(i, delta, lp, nil, "", "")) {
		return false
	}
	if c.finish == "" {
		return true
	}
	finish := c.finish
	if len(calls) > 0 {
		deltas := make([]map[string]any, len(calls))
		for k, call := range calls {
			deltas[k] = map[string]any{"index": k, "id": call.ID, "type": call.Type, "function": call.Function}
		}
		if !send(a.chunk(i, map[string]any{"tool_calls": deltas}, nil, nil, "", "")) {
			return false
		}
		finish = toolFinish(finish)
	}
	return send(a.chunk(i, map[string]any{}, nil, nil, "", finish))
}

// split divides a choice's next piece of text into reasoning, content and
// (once the choice has finished) tool calls, as the request asks; text
// that may begin a marker is held back until it is known.
func (a *answer) split(c *choice, text string) (reasoning, content string, calls []toolCall) {
	content = text
	if a.j.reasoning {
		reasoning, content = c.reason.next(text)
		if c.finish != "" {
			r, s := c.reason.end(c.finish == "length")
			reasoning, content = reasoning+r, content+s
		}
	}
	if a.j.tools {
		content = c.tools.next(content)
		if c.finish != "" {
			var rest string
			rest, calls = c.tools.end(c.finish == "length")
			content += rest
		}
	}
	return reasoning, content, calls
}

// toolFinish is the finish reason of a choice that ended with tool calls:
// tool_calls, unless max_tokens or the context cut it.
func toolFinish(finish string) string {
	if finish == "stop" {
		return "tool_calls"
	}
	return finish
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// chunk is one streamed event of choice i; finish is its finish reason,
// "" for none.
func (a *answer) chunk(i int, delta any, lp []tokenLogprob, legacy *legacyLogprobs, text, finish string) map[string]any {
	var fr any
	if finish != "" {
		fr = finish
	}
	ch := map[string]any{"index": i, "finish_reason": fr, "logprobs": nil}
	obj := "text_completion"
	if a.j.chat {
		obj = "chat.completion.chunk"
		ch["delta"] = delta
		if lp != nil {
			ch["logprobs"] = map[string]any{"content": lp}
		}
	} else {
		ch["text"] = text
		if legacy != nil {
			ch["logprobs"] = legacy
		}
	}
	out := map[string]any{"id": a.id, "object": obj, "created": a.created, "model": a.s.cfg.Name, "choices": []any{ch}}
	if a.j.includeUsage {
		out["usage"] = nil
	}
	return out
}
