package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k3/k3"
	"k3/k3/serve"
	"k3/specdec"
)

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	model := fs.String("model", "", "checkpoint directory (default: the embedded tiny model)")
	addr := fs.String("addr", "127.0.0.1:8080", "listen address (loopback unless told otherwise)")
	name := fs.String("name", "", `model id served (default "k3-tiny", or the checkpoint directory's name)`)
	backend := addBackendFlags(fs)
	apiKey := fs.String("api-key", "", "bearer token every /v1 request must carry (default $K3_API_KEY)")
	seqs := fs.Int("sequences", 16, "sequences decoded together")
	queue := fs.Int("queue", 0, "sequences that may wait beyond -sequences before requests get 429 (default 4 x -sequences)")
	maxTokens := fs.Int("max-tokens", 2048, "the most tokens a request may generate")
	memory := fs.Int64("memory-mb", 2048, "sequence-state budget in MiB (attention pages, KDA states, the prefix cache)")
	prefix := fs.Int64("prefix-cache-mb", 512, "prefix-cache memory in MiB (0: no prefix cache)")
	maxBody := fs.Int64("max-body-kb", 4096, "largest request body in KiB")
	drain := fs.Duration("drain", 30*time.Second, "how long shutdown waits for running requests")
	sessionDir := fs.String("session-dir", "", "park idle kept sessions (K3-Session header) in this directory, and resume them after a restart")
	var spec genFlags
	fs.StringVar(&spec.speculate, "speculate", "", "speculative decoding with this drafter: ngram (one for every request), dspark (the checkpoint's draft module), self:N (the model's first N layers and its head) or model:DIR (a smaller checkpoint's greedy tokens, same vocabulary), these three one for each generation; outputs stay those of plain decoding")
	fs.StringVar(&spec.draftDepth, "draft-depth", "auto", "with -speculate: drafts per verify pass (1..15), or auto")
	fs.IntVar(&spec.layout.TP, "tp", 1, "split the model over this many tensor-parallel ranks (heads, MLP columns); needs -model, and runs without a prefix cache, speculating with ngram or model:DIR at a fixed -draft-depth only")
	fs.IntVar(&spec.layout.EP, "ep", 1, "expert-parallel ranks (routed experts); needs -model, as -tp")
	sessionIdle := fs.Duration("session-idle", 5*time.Minute, "how long a kept session stays in memory unused")
	reasoning := fs.Bool("reasoning", false, "a thinking model (Kimi K2 Thinking, K3): answer its <think> reasoning as reasoning_content")
	kvEvents := fs.String("kv-events", "", "publish KV-cache events for llm-d: tcp://*:PORT listens, tcp://HOST:PORT connects")
	kvTopic := fs.String("kv-events-topic", "", `the KV events' topic (default "kv@HOSTNAME@NAME")`)
	storeMB := fs.Int64("responses-store-mb", 64, "memory in MiB for finished /v1/responses kept for previous_response_id and GET (0: none in memory)")
	storeDir := fs.String("responses-dir", "", "also keep every finished /v1/responses in this directory: they outlive the server, and servers sharing it continue each other's chains")
	storeTTL := fs.Duration("responses-ttl", 30*24*time.Hour, "with -responses-dir: how long a kept response's file lasts")
	synopsis := "serve [-model DIR] [-addr 127.0.0.1:8080] [-api-key KEY] [-tp N] [-ep N] ...\n\nServes the OpenAI-compatible API (/v1/chat/completions, /v1/completions,\n/v1/responses, /v1/models, /tokenize, /detokenize, /health, /metrics) until interrupted;\nwith -tp or -ep the model runs split over that many ranks (k3.LoadGroup). See docs/SERVING.md."
	if err := parseFlags(fs, synopsis, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "k3 serve: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	for _, f := range []struct {
		name string
		bad  bool
		want string
	}{
		{"sequences", *seqs < 1, "1 or more"},
		{"queue", *queue < 0, "0 (4 x -sequences) or more"},
		{"max-tokens", *maxTokens < 1, "1 or more"},
		{"max-body-kb", *maxBody < 1, "1 or more"},
		{"drain", *drain < 0, "0 or more"},
		{"session-idle", *sessionIdle <= 0, "a positive duration"},
	} {
		if f.bad {
			return fmt.Errorf("-%s %s: want %s", f.name, fs.Lookup(f.name).Value, f.want)
		}
	}
	if spec.split() {
		// A group keeps no prefix cache and speculates with no drafter:
		// the default prefix cache is off, an asked-for one refused.
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		switch {
		case *model == "":
			return errors.New("-tp and -ep split a checkpoint: give -model DIR (the embedded model is not split)")
		case set["prefix-cache-mb"] && *prefix > 0:
			return fmt.Errorf("-prefix-cache-mb %d with -tp or -ep: a split model keeps no prefix cache (give 0)", *prefix)
		case spec.speculate != "" && spec.speculate != "ngram" && !strings.HasPrefix(spec.speculate, "model:"):
			return fmt.Errorf("-speculate %s with -tp or -ep: a split model's server speculates with ngram or model:DIR only", spec.speculate)
		case spec.speculate != "" && spec.draftDepth == "auto":
			return fmt.Errorf("-speculate %s with -tp or -ep: give a fixed -draft-depth K (a split model does not choose its depth)", spec.speculate)
		case *kvEvents != "":
			return errors.New("-kv-events with -tp or -ep: a split model keeps no prefix cache to report")
		}
		*prefix = 0
		if err := spec.layout.Validate(); err != nil {
			return err
		}
	}
	if *memory <= 0 || *prefix < 0 || *prefix >= *memory {
		return fmt.Errorf("-memory-mb %d and -prefix-cache-mb %d: want 0 <= prefix < memory", *memory, *prefix)
	}
	if *storeMB < 0 {
		return fmt.Errorf("-responses-store-mb %d: want 0 or more", *storeMB)
	}
	if *storeTTL <= 0 {
		return fmt.Errorf("-responses-ttl %v: want a positive duration", *storeTTL)
	}
	if *kvEvents != "" && *prefix == 0 {
		return errors.New("-kv-events needs a prefix cache (-prefix-cache-mb above 0)")
	}
	if *kvEvents != "" {
		if _, _, err := serve.KVEventsEndpoint(*kvEvents); err != nil {
			return err
		}
	}
	key := *apiKey
	if key == "" {
		key = os.Getenv("K3_API_KEY")
	}
	cfg := serve.Config{Name: *name, MaxSequences: *seqs, MaxQueue: *queue, MaxTokens: *maxTokens, MaxBodyBytes: *maxBody << 10, APIKey: key,
		SessionDir: *sessionDir, SessionIdle: *sessionIdle, Reasoning: *reasoning,
		KVEvents: *kvEvents, KVEventsTopic: *kvTopic, Logf: lockedLogf(stderr), ResponseStoreBytes: *storeMB << 20,
		ResponseDir: *storeDir, ResponseTTL: *storeTTL}
	if *storeMB == 0 {
		cfg.ResponseStoreBytes = -1
	}
	if cfg.Name == "" {
		cfg.Name = "k3-tiny"
		if *model != "" {
			cfg.Name = filepath.Base(filepath.Clean(*model))
		}
	}

	opts := append(backend.loadOptions(), k3.WithMemoryBudget(*memory<<20))
	// Loaded below; the drafters of each generation are made from them.
	var m, draft *k3.Model
	if d, err := spec.drafter(); err != nil {
		return err
	} else if spec.speculate != "" {
		k, auto, _ := spec.depth()
		opts = append(opts, k3.WithRollback(k)) // speculation rolls back through the replay logs
		switch {
		case d != nil: // ngram: one drafter serves every request
			cfg.Speculation = k3.WithSpeculation(d, k)
			if auto {
				cfg.Speculation = k3.WithAdaptiveSpeculation(d, k)
			}
		case spec.speculate == "dspark":
			cfg.NewDrafter = func() (specdec.Drafter, error) { return m.NewDSpark() }
		case strings.HasPrefix(spec.speculate, "model:"):
			cfg.NewDrafter = func() (specdec.Drafter, error) { return m.NewDraftModel(draft) }
		default: // self:N, checked by drafter
			n, _ := spec.selfLayers(strings.TrimPrefix(spec.speculate, "self:"))
			cfg.NewDrafter = func() (specdec.Drafter, error) { return m.NewSelfDraft(n) }
		}
		cfg.DraftDepth, cfg.AdaptiveDraft = k, auto && cfg.NewDrafter != nil
	}
	if *prefix > 0 {
		opts = append(opts, k3.WithPrefixCache(*prefix<<20))
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	// The listener answers from the start; until the model is in, every
	// route (/health included) says 503.
	var ready atomic.Pointer[serve.Server]
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s := ready.Load(); s != nil {
			s.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, `{"error":{"message":"the model is loading","type":"server_error","param":null,"code":null}}`)
	})
	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	fmt.Fprintf(stderr, "k3 serve: listening on http://%s (model %q loading)\n", ln.Addr(), cfg.Name)

	var grp *k3.Group
	switch {
	case spec.split():
		if grp, err = k3.LoadGroup(ctx, *model, spec.layout, opts...); err == nil {
			defer grp.Close()
			m = grp.Ranks()[0]
		}
	case *model == "":
		m, err = k3.LoadTiny(ctx, opts...)
	default:
		m, err = k3.Load(ctx, *model, opts...)
	}
	if err != nil {
		hs.Close()
		return err
	}
	if grp == nil {
		defer m.Close()
	}
	if dir, ok := strings.CutPrefix(spec.speculate, "model:"); ok {
		// Each generation's drafter holds a session of the draft model,
		// which rolls back the drafts the target rejects: its logs are as
		// deep as the drafts. Closed after the server, which closes the
		// drafters.
		k, _, _ := spec.depth()
		draft, err = k3.Load(ctx, dir, append(backend.loadOptions(), k3.WithRollback(k))...)
		if err != nil {
			hs.Close()
			return fmt.Errorf("-speculate %s: %w", spec.speculate, err)
		}
		defer draft.Close()
		if draft.VocabSize() != m.VocabSize() {
			hs.Close()
			return fmt.Errorf("-speculate %s: the draft model scores %d tokens, the target %d", spec.speculate, draft.VocabSize(), m.VocabSize())
		}
	}
	if (cfg.Speculation != nil || cfg.NewDrafter != nil) && spec.draftDepth == "auto" {
		// Measured now, for every batch the scheduler may run, not in its
		// loop at the first request of each.
		for b := 1; b <= max(cfg.MaxSequences, 16); b *= 2 {
			_, err := m.SpeculationCostsAt(ctx, b)
			if errors.Is(err, k3.ErrMemoryBudget) {
				// Larger batches take their depths from the largest
				// measured (or decode plainly, with none).
				fmt.Fprintf(stderr, "k3 serve: speculation costs measured below a batch of %d: %v\n", b, err)
				break
			}
			if err != nil {
				hs.Close()
				return err
			}
		}
	}
	var srv *serve.Server
	if grp != nil {
		srv, err = serve.NewGroup(grp, cfg)
	} else {
		srv, err = serve.New(m, cfg)
	}
	if err != nil {
		hs.Close()
		return err
	}
	defer srv.Close()
	start := time.Now()
	if err := srv.Warm(ctx); err != nil {
		// Not fatal: a budget that leaves no room for a whole prefill
		// chunk still serves shorter prompts.
		fmt.Fprintf(stderr, "k3 serve: warm-up skipped: %v\n", err)
	} else {
		fmt.Fprintf(stderr, "k3 serve: warmed up in %v\n", time.Since(start).Round(time.Millisecond))
	}
	ready.Store(srv)
	if grp != nil {
		fmt.Fprintf(stderr, "k3 serve: ready (%s over %d ranks, %v, context %d tokens)\n", cfg.Name, len(grp.Ranks()), grp.Layout(), m.ContextLength())
	} else {
		fmt.Fprintf(stderr, "k3 serve: ready (%s, context %d tokens)\n", cfg.Name, m.ContextLength())
	}

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	fmt.Fprintln(stderr, "k3 serve: shutting down; waiting for running requests")
	sctx, cancel := context.WithTimeout(context.Background(), *drain)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return srv.Close()
}

// lockedLogf writes the server's background reports to w, a line each,
// one at a time.
func lockedLogf(w io.Writer) func(string, ...any) {
	var mu sync.Mutex
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, "k3 "+format+"\n", args...)
	}
}
