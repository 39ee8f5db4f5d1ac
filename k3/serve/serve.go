// Package serve is an OpenAI-compatible HTTP front end for a k3 model: an
// http.Handler that an application mounts on its own mux, and what the
// `k3 serve` command runs.
//
// Routes: POST /v1/chat/completions, /v1/completions and /v1/responses
// (streaming as server-sent events), GET and DELETE /v1/responses/{id}
// (finished responses kept in memory, Config.ResponseStoreBytes, for
// previous_response_id), GET /v1/models, POST /tokenize and
// /detokenize, GET /health and GET /metrics (Prometheus text format, under
// the names an inference gateway's endpoint picker reads); with
// Config.KVEvents, the prefix cache's KV-cache events over ZeroMQ. Every generation goes
// through one k3.Batcher (a k3.GroupBatcher for a model split over ranks,
// NewGroup), so concurrent requests share forward passes (and speculate,
// with Config.Speculation). A client that disconnects ends
// its generation at the next pass. A request with the K3-Session header
// keeps its session between requests, parked on disk when idle
// (Config.SessionDir).
//
// Prompts are tokenized with special tokens honoured, so a message that
// contains "<|im_end|>" ends its turn; a server facing untrusted users
// should filter such strings before they reach it.
package serve

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"k3/internal/zmtp"
	"k3/k3"
	"k3/specdec"
)

// Config sets a Server's limits. The zero value of each field selects its
// default.
type Config struct {
	// Name is the model id that requests name in "model" and /v1/models
	// lists (default "k3"). A request naming another model gets 404; one
	// naming none is served.
	Name string
	// MaxSequences is how many sequences decode together (the Batcher's
	// size; default 16).
	MaxSequences int
	// MaxQueue is how many more sequences may wait for a place; a request
	// past it is answered 429 at once (default 4 x MaxSequences).
	MaxQueue int
	// TokenBudget bounds the rows of a pass (k3.WithTokenBudget; default
	// the Batcher's).
	TokenBudget int
	// MaxTokens caps a request's max_tokens, and is what a request that
	// sets none gets, within the context (default 2048).
	MaxTokens int
	// MaxN caps n, the choices per request (default 8).
	MaxN int
	// MaxBodyBytes caps a request body; a larger one gets 413 (default 4 MiB).
	MaxBodyBytes int64
	// APIKey, when set, is the bearer token every request to /v1/*,
	// /tokenize and /detokenize must carry (Authorization: Bearer KEY).
	// /health and /metrics stay open for probes and scrapers.
	APIKey string
	// A request with the K3-Session header keeps its session on the
	// server. SessionIdle is how long an unused one stays in memory
	// (default 5 minutes); then, and when more than MaxSessions are live
	// (default 64), it is parked in SessionDir (Session.Save) or, without
	// a directory, dropped. Parked sessions come back on their next
	// request, after a restart too; Close parks the live ones (one
	// still answering, when its request ends).
	SessionDir  string
	SessionIdle time.Duration
	MaxSessions int
	// Speculation, when set, is added to every generation's options:
	// k3.WithSpeculation or k3.WithAdaptiveSpeculation (the model loaded
	// WithRollback deep enough). Outputs are those of plain decoding. Its
	// drafter serves every generation at once, as specdec.NGram can.
	Speculation k3.GenerateOption
	// NewDrafter, instead of Speculation, gives each generation a drafter
	// of its own, for drafters that follow one sequence at a time
	// (k3.DSpark, a self-draft, a draft model): it speculates at
	// DraftDepth tokens a verify pass (k3.WithSpeculation), or with
	// AdaptiveDraft up to DraftDepth (k3.WithAdaptiveSpeculation). A
	// generation takes a drafter an earlier one gave back, else one
	// NewDrafter makes, up to MaxSequences of them (past that it decodes
	// plainly, with the same tokens); the server closes them (io.Closer)
	// on Close.
	NewDrafter    func() (specdec.Drafter, error)
	DraftDepth    int
	AdaptiveDraft bool
	// Reasoning, for a thinking model (Kimi K2 Thinking, K3), splits a
	// chat answer's reasoning (<think>…</think>) from its content into
	// reasoning_content; a request's chat_template_kwargs {"thinking":
	// false} then pre-fills an empty reasoning instead (docs/SERVING.md).
	Reasoning bool
	// ResponseStoreBytes bounds the finished responses kept in memory for
	// previous_response_id and GET /v1/responses/{id}, the least recently
	// used dropped past it (default 64 MiB; negative: none in memory).
	ResponseStoreBytes int64
	// ResponseDir, when set, also keeps every finished response there as
	// a file, read when memory misses: responses outlive the process,
	// and servers that mount one directory continue each other's chains.
	// ResponseTTL is how long a file lasts (default 30 days).
	ResponseDir string
	ResponseTTL time.Duration
	// KVEvents, when set, publishes the prefix cache's KV-cache events
	// for llm-d's precise prefix routing, as vLLM's ZMQ publisher does:
	// "tcp://*:PORT" listens for subscribers, "tcp://HOST:PORT" connects
	// to one (docs/SERVING.md). The model needs a prefix cache.
	KVEvents string
	// KVEventsTopic is the messages' topic (default "kv@HOSTNAME@Name",
	// the form llm-d reads the pod and model from).
	KVEventsTopic string
	// Logf, when set, reports what happens outside requests (KV-event
	// subscribers).
	Logf func(format string, args ...any)
}

func (c *Config) defaults() {
	if c.Name == "" {
		c.Name = "k3"
	}
	if c.MaxSequences <= 0 {
		c.MaxSequences = 16
	}
	if c.MaxQueue <= 0 {
		c.MaxQueue = 4 * c.MaxSequences
	}
	if c.MaxTokens <= 0 {
		c.MaxTokens = 2048
	}
	if c.MaxN <= 0 {
		c.MaxN = 8
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 4 << 20
	}
	if c.SessionIdle <= 0 {
		c.SessionIdle = 5 * time.Minute
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = 64
	}
	if c.ResponseStoreBytes == 0 {
		c.ResponseStoreBytes = 64 << 20
	}
	if c.ResponseTTL <= 0 {
		c.ResponseTTL = 30 * 24 * time.Hour
	}
	if c.KVEventsTopic == "" {
		host, _ := os.Hostname()
		c.KVEventsTopic = "kv@" + host + "@" + c.Name
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// Server serves one model over HTTP. Create it with New (or NewGroup, a
// model split over ranks); Close it after the http.Server that carries it
// has shut down.
type Server struct {
	m       *k3.Model // the model, or a group's rank 0: its tokenizer, vocabulary, context and memory
	cfg     Config
	e       engine
	stop    context.CancelFunc
	sem     *semaphore.Weighted // sequences running or queued
	mux     *http.ServeMux
	met     *metrics
	store   *sessionStore
	kept    *responseStore // finished responses (store.go)
	schemas *schemaCache   // compiled JSON Schemas by document (schemas.go)
	closed  atomic.Bool
	created int64
	kv      *zmtp.Publisher // nil without Config.KVEvents
	// drafters lends each generation a drafter (Config.NewDrafter; nil
	// without).
	drafters *drafters
}

// New starts serving m: it starts the scheduler (a k3.Batcher), which
// runs until Close. m stays the caller's; close it after the Server.
func New(m *k3.Model, cfg Config) (*Server, error) {
	if m == nil {
		return nil, errors.New("serve: nil model")
	}
	cfg.defaults()
	pool, err := cfg.drafterPool()
	if err != nil {
		return nil, err
	}
	b, err := m.NewBatcher(cfg.MaxSequences, cfg.batcherOptions()...)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	return newServer(m, loneEngine{m, b}, cfg, pool)
}

// NewGroup starts serving a model split over the ranks of g
// (k3.LoadGroup): every generation runs on all of them in lockstep,
// batched by a k3.GroupBatcher. It speculates as the GroupBatcher does:
// at a fixed depth (Config.Speculation must be k3.WithSpeculation; an
// adaptive one fails each request with k3's ErrUnsupported) with a
// drafter that reads no session (specdec.NGram, or through
// Config.NewDrafter a DraftModel of a model outside the group, without
// AdaptiveDraft). A group keeps no prefix cache (NewGroup refuses
// Config.KVEvents), and does not run under context parallelism. g stays
// the caller's; close it after the Server.
func NewGroup(g *k3.Group, cfg Config) (*Server, error) {
	if g == nil {
		return nil, errors.New("serve: nil group")
	}
	cfg.defaults()
	switch {
	case cfg.NewDrafter != nil && cfg.AdaptiveDraft:
		return nil, fmt.Errorf("serve: Config.AdaptiveDraft on a group (a GroupBatcher drafts at a fixed depth): %w", k3.ErrInvalidOption)
	case cfg.KVEvents != "":
		return nil, fmt.Errorf("serve: KV events on a group, which keeps no prefix cache: %w", k3.ErrInvalidOption)
	}
	pool, err := cfg.drafterPool()
	if err != nil {
		return nil, err
	}
	b, err := g.NewBatcher(cfg.MaxSequences, cfg.batcherOptions()...)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	return newServer(g.Ranks()[0], groupEngine{g, b}, cfg, pool)
}

// drafterPool is the pool of per-generation drafters cfg asks for, or nil.
func (cfg *Config) drafterPool() (*drafters, error) {
	if cfg.NewDrafter == nil {
		return nil, nil
	}
	switch {
	case cfg.Speculation != nil:
		return nil, errors.New("serve: Config.Speculation and Config.NewDrafter both set: one drafter for all generations, or one each")
	case cfg.DraftDepth < 1 || cfg.DraftDepth >= k3.ExactTokens:
		return nil, fmt.Errorf("serve: Config.DraftDepth = %d, want 1..%d with NewDrafter", cfg.DraftDepth, k3.ExactTokens-1)
	}
	return &drafters{make: cfg.NewDrafter, depth: cfg.DraftDepth, adaptive: cfg.AdaptiveDraft, limit: cfg.MaxSequences}, nil
}

// batcherOptions are the batcher's options that cfg sets.
func (cfg *Config) batcherOptions() []k3.BatcherOption {
	if cfg.TokenBudget > 0 {
		return []k3.BatcherOption{k3.WithTokenBudget(cfg.TokenBudget)}
	}
	return nil
}

// newServer serves e, whose tokenizer and limits are m's, with cfg (its
// defaults set).
func newServer(m *k3.Model, e engine, cfg Config, pool *drafters) (*Server, error) {
	kept, err := newResponseStore(max(cfg.ResponseStoreBytes, 0), cfg.ResponseDir, cfg.ResponseTTL, cfg.Logf)
	if err != nil {
		return nil, err
	}
	store, err := newSessionStore(e, cfg.SessionDir, cfg.SessionIdle, cfg.MaxSessions, func() bool {
		// Nothing runs while requests wait: only memory holds them back.
		st := e.stats()
		return st.Running == 0 && st.Waiting > 0
	})
	if err != nil {
		kept.close()
		return nil, err
	}
	var kv *zmtp.Publisher
	if cfg.KVEvents != "" {
		if kv, err = startKVEvents(m, cfg.KVEvents, cfg.KVEventsTopic, cfg.Name, cfg.Logf); err != nil {
			store.close()
			kept.close()
			return nil, err
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	if err := e.start(ctx); err != nil {
		stop()
		store.close()
		kept.close()
		if kv != nil {
			kv.Close()
		}
		return nil, fmt.Errorf("serve: %w", err)
	}
	s := &Server{m: m, cfg: cfg, e: e, stop: stop, sem: semaphore.NewWeighted(int64(cfg.MaxSequences + cfg.MaxQueue)),
		mux: http.NewServeMux(), met: newMetrics(cfg.Name), store: store, created: time.Now().Unix(), kv: kv,
		kept: kept, schemas: newSchemaCache(schemaCacheEntries), drafters: pool}
	s.mux.HandleFunc("POST /v1/chat/completions", s.authorized(generation(s, s.chatJob)))
	s.mux.HandleFunc("POST /v1/completions", s.authorized(generation(s, s.completionJob)))
	s.mux.HandleFunc("POST /v1/responses", s.authorized(generation(s, s.responsesJob)))
	s.mux.HandleFunc("GET /v1/responses/{id}", s.authorized(s.getResponse))
	s.mux.HandleFunc("DELETE /v1/responses/{id}", s.authorized(s.deleteResponse))
	s.mux.HandleFunc("/v1/responses/{id...}", s.authorized(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: 404, typ: "invalid_request_error", msg: fmt.Sprintf("no route %s %s: k3 serves GET and DELETE /v1/responses/{id}", r.Method, r.URL.Path)})
	}))
	s.mux.HandleFunc("GET /v1/models", s.authorized(s.models))
	s.mux.HandleFunc("GET /v1/models/{id...}", s.authorized(s.model))
	s.mux.HandleFunc("POST /tokenize", s.authorized(s.tokenize))
	s.mux.HandleFunc("POST /detokenize", s.authorized(s.detokenize))
	s.mux.HandleFunc("DELETE /v1/sessions/{id}", s.authorized(s.deleteSession))
	s.mux.HandleFunc("GET /health", s.health)
	s.mux.HandleFunc("GET /metrics", s.metrics)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: 404, typ: "invalid_request_error", msg: fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)})
	})
	if pool != nil {
		// The first drafter now: a drafter the model cannot make (no
		// draft module) fails here, not in every request.
		d, err := cfg.NewDrafter()
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("serve: Config.NewDrafter: %w", err)
		}
		pool.made = 1
		pool.put(d)
	}
	return s, nil
}

// Warm runs one throwaway request through the scheduler (k3.Batcher.Warm)
// so that the first real request does not pay for the passes' first use;
// it counts in no metric and leaves nothing in the prefix cache. Call it
// before the server is reported ready.
func (s *Server) Warm(ctx context.Context) error { return s.e.warm(ctx) }

// ServeHTTP serves the routes in the package doc.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close stops the scheduler: requests still running end with an error
// and /health reports 503; kept sessions are parked (SessionDir) or
// dropped. Shut the http.Server down first to let running requests
// finish. Close is idempotent.
func (s *Server) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.stop()
	defer s.store.close()
	defer s.kept.close()
	if s.kv != nil {
		defer s.kv.Close()
	}
	if s.drafters != nil {
		defer s.drafters.close() // generations still ending close theirs as they give them back
	}
	if err := s.e.wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func (s *Server) authorized(h http.HandlerFunc) http.HandlerFunc {
	if s.cfg.APIKey == "" {
		return h
	}
	want := []byte("Bearer " + s.cfg.APIKey)
	return func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			writeError(w, &apiError{status: 401, typ: "invalid_request_error", code: "invalid_api_key",
				msg: "missing or wrong API key (send Authorization: Bearer KEY)"})
			return
		}
		h(w, r)
	}
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if s.closed.Load() {
		writeError(w, &apiError{status: 503, typ: "server_error", msg: "shutting down"})
		return
	}
	w.WriteHeader(http.StatusOK)
}

type modelCard struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len"`
}

func (s *Server) card() modelCard {
	return modelCard{ID: s.cfg.Name, Object: "model", Created: s.created, OwnedBy: "k3", MaxModelLen: s.m.ContextLength()}
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, 200, map[string]any{"object": "list", "data": []modelCard{s.card()}})
}

func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	if id := r.PathValue("id"); id != s.cfg.Name {
		writeError(w, &apiError{status: 404, typ: "invalid_request_error", param: "model", code: "model_not_found",
			msg: fmt.Sprintf("the model %q does not exist (this server has %q)", id, s.cfg.Name)})
		return
	}
	writeJSON(w, 200, s.card())
}

// tokenize takes vLLM's shape: {"prompt": text} or {"messages": [...]}
// (rendered in the chat format, ending with the assistant's turn).
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string          `json:"model"`
		Prompt   *string         `json:"prompt"`
		Messages []chatMessage   `json:"messages"`
		Tools    json.RawMessage `json:"tools"`
	}
	if !s.decode(w, r, &req) {
		return
	}
	if req.Model != "" && req.Model != s.cfg.Name {
		writeError(w, &apiError{status: 404, typ: "invalid_request_error", param: "model", code: "model_not_found",
			msg: fmt.Sprintf("the model %q does not exist (this server has %q)", req.Model, s.cfg.Name)})
		return
	}
	var ids []int32
	switch {
	case req.Prompt != nil && req.Messages != nil:
		writeError(w, badParam("prompt", "give prompt or messages, not both"))
		return
	case req.Prompt != nil:
		ids = s.m.Encode(*req.Prompt)
	case req.Messages != nil:
		j, err := s.chatJob(&chatRequest{sampling: sampling{Tools: req.Tools}, Messages: req.Messages})
		if err != nil {
			writeError(w, err)
			return
		}
		ids = j.prompts[0]
	default:
		writeError(w, badParam("prompt", "prompt (or messages) is missing"))
		return
	}
	if ids == nil {
		ids = []int32{}
	}
	writeJSON(w, 200, map[string]any{"count": len(ids), "max_model_len": s.m.ContextLength(), "tokens": ids})
}

func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Tokens []int64 `json:"tokens"`
	}
	if !s.decode(w, r, &req) {
		return
	}
	ids, err := s.tokenIDs(req.Tokens, "tokens")
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, map[string]string{"prompt": s.m.Decode(ids)})
}

// decode reads r's JSON body into v, answering the error itself when it
// cannot. The Content-Type is not checked: curl -d sends a form type.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err := dec.Decode(v); err != nil {
		writeError(w, decodeError(err))
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) body() errorBody {
	b := errorBody{Error: errorObject{Message: e.msg, Type: e.typ}}
	if e.param != "" {
		b.Error.Param = &e.param
	}
	if e.code != "" {
		b.Error.Code = &e.code
	}
	return b
}

// asAPIError maps an error from the SDK to what the client sees.
func asAPIError(err error) *apiError {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, k3.ErrInvalidOption), errors.Is(err, k3.ErrBadToken), errors.Is(err, k3.ErrContextFull),
		errors.Is(err, k3.ErrEmptyPrompt):
		return &apiError{status: 400, typ: "invalid_request_error", msg: err.Error()}
	case errors.Is(err, k3.ErrMemoryBudget):
		return &apiError{status: 503, typ: "server_error", msg: err.Error()}
	case errors.Is(err, k3.ErrBatcherClosed), errors.Is(err, k3.ErrClosed):
		return &apiError{status: 503, typ: "server_error", msg: "the server is shutting down"}
	}
	return &apiError{status: 500, typ: "server_error", msg: err.Error()}
}

func writeError(w http.ResponseWriter, err error) {
	ae := asAPIError(err)
	if ae.status == 429 || ae.status == 503 {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, ae.status, ae.body())
}
