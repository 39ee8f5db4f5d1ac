// Command rounds sets k3's prefill beside llama.cpp's in alternating
// rounds, so that a shared host's drift hits both alike (issue 20's
// "1.5x llama.cpp's bf16 prefill share"; docs/bench, "against
// llama.cpp"). Each round times k3's prefill of the k31pro-100m preset
// (random bf16 weights, the checkpoint k3 bench model writes) on each
// backend named, the best of -runs prefills, then llama.cpp's prefill of
// the peer model through bench.mjs, the best of as many; it prints each
// figure as GFLOP/s of products and each k3 figure over llama.cpp's of
// the same round, then the medians and ranges. Both sides' shares are
// taken of one peak, so the ratio of shares is the ratio of GFLOP/s.
//
//	go run ./tools/llamacpp -o /tmp/dense.gguf
//	(cd tools/llamacpp && npm ci)
//	go run ./tools/llamacpp/rounds -gguf /tmp/dense.gguf [-rounds 8]
//
// llama.cpp's bf16 products round the activations to bf16, as k3's fast
// backend (go-fastbf16) does; the default backend's are exact.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"k3/internal/modelbench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "rounds:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rounds", flag.ContinueOnError)
	fs.SetOutput(stderr)
	gguf := fs.String("gguf", "", "the peer model (go run ./tools/llamacpp -o FILE writes it and FILE.json)")
	rounds := fs.Int("rounds", 6, "rounds")
	tokens := fs.Int("tokens", 512, "prompt tokens of every prefill")
	runs := fs.Int("runs", 5, "prefills a side times in a round (the best counts)")
	backends := fs.String("backends", "go,go-fastbf16", "k3 backends, comma separated (go, go-fastbf16)")
	node := fs.String("node", "node", "the Node.js binary")
	script := fs.String("bench", "tools/llamacpp/bench.mjs", "bench.mjs, the llama.cpp side (its node_modules beside it: npm ci)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *gguf == "":
		return errors.New("-gguf: want the peer model's path")
	case *rounds < 1 || *tokens < 1 || *runs < 1:
		return fmt.Errorf("-rounds %d, -tokens %d, -runs %d: want each at least 1", *rounds, *tokens, *runs)
	}
	if _, err := os.Stat(*gguf + ".json"); err != nil {
		return fmt.Errorf("-gguf: %w (go run ./tools/llamacpp -o %s writes it beside the model)", err, *gguf)
	}
	names := strings.Split(*backends, ",")
	dir, err := modelbench.WritePreset("k31pro-100m", func(s string) { fmt.Fprintln(stderr, s) })
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var ks []*modelbench.Prefiller
	defer func() {
		for _, p := range ks {
			p.Close()
		}
	}()
	for _, name := range names {
		p, err := modelbench.NewPrefiller(ctx, dir, name, *tokens)
		if err != nil {
			return fmt.Errorf("backend %s: %w", name, err)
		}
		ks = append(ks, p)
	}
	fmt.Fprintf(stdout, "CPU: %s, %d threads; %s; prefill of %d tokens, best of %d a side and round\n",
		cpuModel(), runtime.GOMAXPROCS(0), time.Now().UTC().Format("2006-01-02"), *tokens, *runs)
	fmt.Fprintf(stdout, "k3: the k31pro-100m preset, %.1f MFLOP of products a token; llama.cpp: %s\n", ks[0].FLOPsPerToken/1e6, *gguf)
	ratios := make([][]float64, len(ks))
	var peers []float64
	for r := range *rounds {
		line := fmt.Sprintf("round %d:", r+1)
		gf := make([]float64, len(ks))
		for i, p := range ks {
			tps, err := p.Best(ctx, *runs)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, p.Backend, err)
			}
			gf[i] = tps * p.FLOPsPerToken / 1e9
		}
		peer, err := llama(ctx, *node, *script, *gguf, *tokens, runtime.GOMAXPROCS(0), *runs)
		if err != nil {
			return fmt.Errorf("round %d, llama.cpp: %w", r+1, err)
		}
		peers = append(peers, peer)
		line += fmt.Sprintf(" llama.cpp %.1f GFLOP/s", peer)
		for i, p := range ks {
			ratios[i] = append(ratios[i], gf[i]/peer)
			line += fmt.Sprintf("; %s %.1f (%.2fx)", p.Backend, gf[i], gf[i]/peer)
		}
		fmt.Fprintln(stdout, line)
	}
	lo, mid, hi := spread(peers)
	fmt.Fprintf(stdout, "llama.cpp: median %.1f GFLOP/s (%.1f-%.1f)\n", mid, lo, hi)
	for i, p := range ks {
		lo, mid, hi := spread(ratios[i])
		fmt.Fprintf(stdout, "%s over llama.cpp: median %.2fx (%.2f-%.2f over %d rounds)\n", p.Backend, mid, lo, hi, *rounds)
	}
	return nil
}

// llama runs bench.mjs and returns its best run's GFLOP/s.
func llama(ctx context.Context, node, script, gguf string, tokens, threads, runs int) (float64, error) {
	cmd := exec.CommandContext(ctx, node, script, gguf, strconv.Itoa(tokens), strconv.Itoa(threads), strconv.Itoa(runs))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s %s: %w: %s", node, script, err, strings.TrimSpace(errOut.String()))
	}
	return parseBest(out.String())
}

var bestLine = regexp.MustCompile(`^best [0-9.]+ tokens/s, ([0-9.]+) GFLOP/s of products`)

// parseBest finds bench.mjs's line "best T tokens/s, G GFLOP/s of products
// (...)" and returns G.
func parseBest(out string) (float64, error) {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		m := bestLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		g, err := strconv.ParseFloat(m[1], 64)
		if err != nil || !(g > 0) {
			return 0, fmt.Errorf("bench.mjs's best line %q: GFLOP/s %q is not a positive number", sc.Text(), m[1])
		}
		return g, nil
	}
	return 0, fmt.Errorf("bench.mjs printed no line \"best ... GFLOP/s of products\": %q", out)
}

// spread returns the least, the median and the greatest of v (not empty).
func spread(v []float64) (lo, mid, hi float64) {
	s := slices.Sorted(slices.Values(v))
	n := len(s)
	mid = s[n/2]
	if n%2 == 0 {
		mid = (s[n/2-1] + s[n/2]) / 2
	}
	return s[0], mid, s[n-1]
}

// cpuModel returns /proc/cpuinfo's first model name, as lscpu prints it.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}
