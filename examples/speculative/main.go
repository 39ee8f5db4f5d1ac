// Command speculative generates with speculative decoding: the n-gram
// drafter proposes tokens the output is likely to copy from its own
// history, one exact pass verifies them, and the session rolls back past
// the first one the model's own draw rejects. The output is exactly what
// plain decoding gives; the program checks that and reports how many
// drafts were kept.
//
//	go run ./examples/speculative
//	go run ./examples/speculative -model /path/to/checkpoint -depth 6
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"

	"k3/k3"
	"k3/specdec"
)

func main() {
	model := flag.String("model", "", "checkpoint directory (default: the embedded tiny model)")
	prompt := flag.String("prompt", "// Max returns the larger of a and b.\nfunc Max(a, b int) int {\n\tif a > b {\n\t\treturn a\n\t}\n\treturn b\n}\n\n// Min returns the smaller of a and b.\nfunc Min(a, b int) int {\n", "prompt")
	depth := flag.Int("depth", 4, "drafts per verify pass (1..15)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	// Speculation rolls the session back through the KDA layers' replay
	// logs, which the model keeps when loaded WithRollback.
	var m *k3.Model
	var err error
	if *model == "" {
		m, err = k3.LoadTiny(ctx, k3.WithRollback(*depth))
	} else {
		m, err = k3.Load(ctx, *model, k3.WithRollback(*depth))
	}
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	generate := func(opts ...k3.GenerateOption) ([]int32, k3.Usage) {
		var ids []int32
		var u k3.Usage
		opts = append(opts, k3.WithMaxTokens(64))
		for tok, err := range m.Generate(ctx, *prompt, opts...) {
			if err != nil {
				log.Fatal(err)
			}
			if tok.ID >= 0 {
				ids = append(ids, tok.ID)
				fmt.Print(tok.Text)
			}
			if tok.Usage != nil {
				u = *tok.Usage
			}
		}
		fmt.Println()
		return ids, u
	}
	fmt.Print(*prompt)
	spec, u := generate(k3.WithSpeculation(specdec.NGram{}, *depth))
	fmt.Fprintf(os.Stderr, "\n%d tokens; the drafter proposed %d, %d were kept\n", len(spec), u.DraftTokens, u.AcceptedTokens)

	plain, _ := generateQuiet(ctx, m, *prompt)
	if !slices.Equal(spec, plain) {
		log.Fatal("speculative decoding differed from plain decoding")
	}
	fmt.Fprintln(os.Stderr, "plain decoding gives the same tokens")
}

// generateQuiet is plain greedy decoding of the same prompt.
func generateQuiet(ctx context.Context, m *k3.Model, prompt string) ([]int32, error) {
	var ids []int32
	for tok, err := range m.Generate(ctx, prompt, k3.WithMaxTokens(64)) {
		if err != nil {
			return nil, err
		}
		if tok.ID >= 0 {
			ids = append(ids, tok.ID)
		}
	}
	return ids, nil
}
