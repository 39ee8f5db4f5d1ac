// Command longcontext runs a long prompt through a model whose
// full-attention layers are DSA (K3.1 Pro) and times decoding with the
// Lightning Indexer's sparse attention against the same model run densely.
//
//	go run ./examples/longcontext -tokens 3000
//
// The prompt is Go source (the fmt package of the Go installation that
// builds the example), which the embedded model was trained on; its DSA
// layers keep 64 positions per query. `k3 bench dsa` measures the K3.1 Pro
// shape (top-2048) at long contexts.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k3/k3"
)

func main() {
	model := flag.String("model", "", "checkpoint directory with DSA layers (default: the embedded tiny model)")
	tokens := flag.Int("tokens", 2000, "prompt length")
	steps := flag.Int("steps", 16, "decode steps to time")
	flag.Parse()
	ctx := context.Background()

	load := func(opts ...k3.Option) *k3.Model {
		opts = append(opts, k3.WithPrefillChunk(512)) // long prompts run in chunks
		var m *k3.Model
		var err error
		if *model == "" {
			m, err = k3.LoadTiny(ctx, opts...)
		} else {
			m, err = k3.Load(ctx, *model, opts...)
		}
		if err != nil {
			log.Fatal(err)
		}
		return m
	}
	if *model == "" {
		fmt.Fprintln(os.Stderr, "using the", k3.TinyLabel)
	}
	prompt := longPrompt(load(), *tokens)
	for _, dense := range []bool{false, true} {
		var opts []k3.Option
		if dense {
			opts = append(opts, k3.WithDenseAttention())
		}
		m := load(opts...)
		s, err := m.NewSession()
		if err != nil {
			log.Fatal(err)
		}
		start := time.Now()
		if _, err := s.Forward(ctx, prompt); err != nil {
			log.Fatal(err)
		}
		prefill := time.Since(start)
		start = time.Now()
		n := 0
		for _, err := range s.GenerateTokens(ctx, nil, k3.WithMaxTokens(*steps), k3.WithoutDefaultStops()) {
			if err != nil {
				log.Fatal(err)
			}
			n++
		}
		mode := "sparse (indexer top-k)"
		if dense {
			mode = "dense MLA"
		}
		fmt.Printf("%-22s prefill %d tokens in %v; decode %.2f ms/token at context %d\n", mode, *tokens,
			prefill.Round(time.Millisecond), float64(time.Since(start).Microseconds())/1e3/float64(n), s.Len())
		m.Close()
	}
}

// longPrompt tokenizes Go source until it has n tokens.
func longPrompt(m *k3.Model, n int) []int32 {
	defer m.Close()
	text := []byte(nil)
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err == nil {
		text, err = os.ReadFile(filepath.Join(strings.TrimSpace(string(goroot)), "src", "fmt", "print.go"))
	}
	if err != nil {
		text = []byte("package main\n\nfunc main() {\n\tprintln(\"hello\")\n}\n")
	}
	var ids []int32
	for len(ids) < n {
		ids = append(ids, m.Tokenizer().Encode(string(text), false)...)
	}
	return ids[:n]
}
