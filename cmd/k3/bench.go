package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"k3/internal/backends"
	"k3/internal/bench"
	"k3/internal/kernel"
	"k3/internal/modelbench"
)

const benchUsage = `usage: k3 bench dsa|kernels|model|spec|serve [flags]

  dsa      sparse against dense DSA decode at several context lengths: a table and a plot
  kernels  GEMM and matrix-vector products against the machine's probed limits
           (and OpenBLAS, in a build with -tags openblas)
  model    whole-model prefill and decode of the 100M and 1B K3.1 Pro-shaped presets
  spec     speculative decoding on the 100M preset at controlled acceptance, against theory
  serve    k3 serve under 1, 8 and 32 streaming clients on loopback, against the engine alone

"k3 bench NAME -h" lists a benchmark's flags.`

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, benchUsage)
		return errUsage
	}
	if isHelp(args[0]) || args[0] == "help" {
		fmt.Fprintln(stdout, benchUsage)
		return errHelp
	}
	switch args[0] {
	case "dsa":
		return benchDSA(ctx, args[1:], stdout, stderr)
	case "kernels":
		fs := flag.NewFlagSet("bench kernels", flag.ContinueOnError)
		if err := parseFlags(fs, "bench kernels\n\nGEMM and matrix-vector products against the probed FLOP peak and bandwidth (a minute or two).", args[1:], stdout, stderr); err != nil {
			return err
		}
		if err := measurable(); err != nil {
			return err
		}
		bench.Kernels(stdout)
		return nil
	case "model":
		fs := flag.NewFlagSet("bench model", flag.ContinueOnError)
		presets := fs.String("presets", "100m,1b", "which presets to measure: 100m (k31pro-100m: prefill, decode, rollback, the scheduler, the prefix cache, memory) and 1b (k31pro-1b, about 1.9 GB written to a temporary directory: prefill, decode and their bounds with a step several times the last-level cache)")
		backend := fs.String("backend", "go", "go, or go-fastbf16: the opt-in fast bf16 products (x rounded to bfloat16), its shares taken of the peak of the products it runs")
		if err := parseFlags(fs, "bench model [-presets 100m,1b] [-backend go|go-fastbf16]\n\nWhole-model prefill and decode of the 100M and 1B K3.1 Pro-shaped presets, written on the fly (several minutes).", args[1:], stdout, stderr); err != nil {
			return err
		}
		if *backend != "go" && *backend != "go-fastbf16" {
			return fmt.Errorf("bench model: -backend %q: want go or go-fastbf16", *backend)
		}
		want := map[string]bool{}
		for _, p := range strings.Split(*presets, ",") {
			if p != "100m" && p != "1b" {
				return fmt.Errorf("bench model: -presets %q: want 100m, 1b or both, comma-separated", *presets)
			}
			want[p] = true
		}
		if err := measurable(); err != nil {
			return err
		}
		logf := func(s string) { fmt.Fprintln(stderr, s) }
		if want["100m"] {
			r, err := modelbench.Run(ctx, *backend, logf)
			if err != nil {
				return err
			}
			fmt.Fprint(stdout, r.Table())
		}
		if want["1b"] {
			r, err := modelbench.RunLarge(ctx, *backend, logf)
			if err != nil {
				return err
			}
			fmt.Fprint(stdout, r.LargeTable())
		}
		return nil
	case "spec":
		return benchSpec(ctx, args[1:], stdout, stderr)
	case "serve":
		return benchServe(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "k3 bench: unknown benchmark %q\n%s\n", args[0], benchUsage)
	return errUsage
}

// measurable refuses a benchmark where K3_AMX=emulate stands the AMX
// tiles' plain-Go twin in for them: it would time the twin.
func measurable() error {
	if kernel.AMXEmulated() {
		return errors.New("K3_AMX=emulate runs the AMX tiles' plain-Go twin, a correctness mode: unset it to measure")
	}
	return nil
}

func benchDSA(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench dsa", flag.ContinueOnError)
	ctxs := fs.String("contexts", "4096,16384,65536,131072", "context lengths, comma separated")
	iters := fs.Int("iters", 3, "decode steps timed per context (median)")
	out := fs.String("out", "", "write OUT.txt (the table) and OUT.png (latency against context) (default: dsa_decode.* in a new temporary directory)")
	noFiles := fs.Bool("no-files", false, "print the table only")
	backend := addBackendFlags(fs)
	if err := parseFlags(fs, "bench dsa [-contexts N,N,...] [-iters N] [-out PATH | -no-files] [-backend NAME [-fused-attention]]", args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return errUsage
	}
	var lens []int
	for _, f := range strings.Split(*ctxs, ",") {
		var n int
		if _, err := fmt.Sscan(f, &n); err != nil || n <= 0 {
			return fmt.Errorf("bad context length %q", f)
		}
		lens = append(lens, n)
	}
	if *iters <= 0 {
		return fmt.Errorf("-iters %d must be positive", *iters)
	}
	if err := measurable(); err != nil {
		return err
	}
	b, err := backends.OpenWith(backend.name, backend.options())
	if err != nil {
		return err
	}
	defer b.Close()
	name := b.Name()
	if backend.fused {
		name += " -fused-attention"
	}
	s := bench.K31Pro
	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(&table, "DSA decode step, attention core, K3.1 Pro shape (%d heads, latent %d + rope %d, indexer %d x %d, top-%d), %s backend\n",
		s.Heads, s.Latent, s.Rope, s.IndexHeads, s.IndexDim, s.TopK, name)
	fmt.Fprintf(&table, "%s, %d cores, %s, kernel path %s\n", cpuModel(), runtime.NumCPU(), time.Now().Format("2006-01-02"), kernel.Path())
	fmt.Fprintln(tw, "context\tsparse ms\tindexer ms\tindexer share\tdense ms\tmeasured ratio\tFLOP ratio\tsparse MB read\tdense MB read\t")
	sparse, dense := make(plotter.XYs, 0), make(plotter.XYs, 0)
	for _, l := range lens {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := bench.DSADecode(b, s, l, *iters)
		if err != nil {
			return err
		}
		ms := func(d interface{ Seconds() float64 }) float64 { return d.Seconds() * 1e3 }
		fmt.Fprintf(tw, "%d\t%.2f\t%.2f\t%.0f%%\t%.2f\t%.2fx\t%.2fx\t%.1f\t%.1f\t\n", l, ms(r.Sparse), ms(r.Indexer),
			100*float64(r.Indexer)/float64(r.Sparse), ms(r.Dense), float64(r.Dense)/float64(r.Sparse),
			s.DenseFLOPs(l)/s.SparseFLOPs(l), s.SparseBytes(l)/1e6, s.DenseBytes(l)/1e6)
		sparse = append(sparse, plotter.XY{X: float64(l) / 1024, Y: ms(r.Sparse)})
		dense = append(dense, plotter.XY{X: float64(l) / 1024, Y: ms(r.Dense)})
	}
	tw.Flush()
	fmt.Fprint(stdout, table.String())
	if *noFiles {
		return nil
	}
	if *out == "" {
		dir, err := os.MkdirTemp("", "k3-bench-dsa-")
		if err != nil {
			return err
		}
		*out = filepath.Join(dir, "dsa_decode")
	}
	if err := os.WriteFile(*out+".txt", []byte(table.String()), 0o644); err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = "DSA decode step (K3.1 Pro shape, go backend)"
	p.X.Label.Text = "context (K tokens)"
	p.Y.Label.Text = "latency (ms)"
	p.Add(plotter.NewGrid())
	for i, c := range []struct {
		name string
		xy   plotter.XYs
	}{{"sparse (indexer + top-k + attention)", sparse}, {"dense MLA", dense}} {
		line, points, err := plotter.NewLinePoints(c.xy)
		if err != nil {
			return err
		}
		line.Color = plotter.DefaultLineStyle.Color
		if i == 1 {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(line, points)
		p.Legend.Add(c.name, line, points)
	}
	p.Legend.Top, p.Legend.Left = true, true
	if err := p.Save(6*vg.Inch, 4*vg.Inch, *out+".png"); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s.txt and %s.png\n", *out, *out)
	return nil
}

func benchSpec(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench spec", flag.ContinueOnError)
	alphas := fs.String("alpha", "0.5,0.7,0.9", "acceptance rates, comma separated, each in [0, 1)")
	depths := fs.String("depth", "1,2,3,4,5,6,7", "draft depths, comma separated, each in 1..15")
	tokens := fs.Int("tokens", 384, "tokens generated per run (per sequence with -batch)")
	batch := fs.Int("batch", 1, "sequences speculating together in a Batcher (1: one session, against theory)")
	realRun := fs.Bool("real", false, "real drafters on the embedded model, with prompts from the files given (at batch 1 and -batch, default 8)")
	drafters := fs.String("drafters", "ngram,self:3,dspark", "with -real: the drafters, comma separated (ngram, self:N, dspark)")
	temperature := fs.Float64("temperature", 0, "with -real: sample at this temperature (0: greedy)")
	rejection := fs.Bool("rejection", false, "with -real and -temperature: verify by rejection sampling, drafts drawn from the drafter's distribution")
	if err := parseFlags(fs, "bench spec [-alpha A,A,...] [-depth K,K,...] [-tokens N] [-batch B]\n\nSpeculative greedy decoding of the 100M preset with drafts of controlled acceptance, against plain decoding and theory (a few minutes);\nwith -batch, B sequences speculating together inside a Batcher against the same batch decoding plainly;\nwith -real FILE..., real drafters (-drafters ngram,self:N,dspark) on the embedded model, prompts from the files' starts.", args, stdout, stderr); err != nil {
		return err
	}
	var as []float64
	for _, f := range strings.Split(*alphas, ",") {
		var a float64
		if _, err := fmt.Sscan(f, &a); err != nil || a < 0 || a >= 1 {
			return fmt.Errorf("-alpha: %q is not a rate in [0, 1)", f)
		}
		as = append(as, a)
	}
	var ks []int
	for _, f := range strings.Split(*depths, ",") {
		var k int
		if _, err := fmt.Sscan(f, &k); err != nil || k < 1 || k > 15 {
			return fmt.Errorf("-depth: %q is not a depth in 1..15", f)
		}
		ks = append(ks, k)
	}
	if *tokens < 8 {
		return fmt.Errorf("-tokens %d: want at least 8", *tokens)
	}
	if *batch < 1 || *batch > 64 {
		return fmt.Errorf("-batch %d: want 1..64", *batch)
	}
	if err := measurable(); err != nil {
		return err
	}
	// A kernel monitor sampling memory stalls the passes it lands on; a
	// run it overlapped says so, whether it was on at the start or the end.
	damon := modelbench.DamonNote()
	report := func(table string) {
		if damon == "" {
			damon = modelbench.DamonNote()
		}
		fmt.Fprint(stdout, table, damon)
	}
	if *realRun {
		if fs.NArg() == 0 {
			return fmt.Errorf("-real: give the prompt files as arguments (e.g. $(python3 tools/train/heldout.py | head -8))")
		}
		b := *batch
		if b == 1 {
			b = 8
		}
		if *temperature < 0 {
			return fmt.Errorf("-temperature %g: want >= 0", *temperature)
		}
		rows, err := modelbench.SpecReal(ctx, fs.Args(), strings.Split(*drafters, ","), b, *tokens, ks, float32(*temperature), *rejection, func(s string) { fmt.Fprintln(stderr, s) })
		if err != nil {
			return err
		}
		report(modelbench.RealTable(fs.NArg(), *tokens, float32(*temperature), *rejection, rows))
		return nil
	}
	if *batch > 1 {
		rows, err := modelbench.SpecBatch(ctx, as, ks, *batch, *tokens, func(s string) { fmt.Fprintln(stderr, s) })
		if err != nil {
			return err
		}
		report(modelbench.SpecBatchTable(*batch, *tokens, rows))
		return nil
	}
	r, err := modelbench.Spec(ctx, as, ks, *tokens, func(s string) { fmt.Fprintln(stderr, s) })
	if err != nil {
		return err
	}
	report(r.Table())
	return nil
}
