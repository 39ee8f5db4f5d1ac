package main

import (
	"context"
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

	"k3/internal/servebench"
	"k3/internal/tiny"
	"k3/k3"
)

func benchServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench serve", flag.ContinueOnError)
	clients := fs.String("clients", "1,8,32", "concurrency levels, comma separated")
	perClient := fs.Int("requests", 4, "requests each client sends per level")
	promptTokens := fs.Int("prompt", 64, "prompt tokens per request")
	maxTokens := fs.Int("tokens", 32, "tokens generated per request")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound on each level")
	model := fs.String("model", "", "checkpoint directory (default: the 100M K3.1 Pro-shaped preset, written to a temporary directory)")
	prefixMB := fs.Int64("prefix-cache-mb", 1024, "the prefix cache's budget in MiB (0: none)")
	out := fs.String("out", "", "path prefix of the table (.txt) and plot (.png) (default: a temporary directory)")
	synopsis := "bench serve [-clients 1,8,32] [-requests 4] [-prompt 64] [-tokens 32] [-prefix-cache-mb 1024] [-model DIR] [-out PATH]\n\nStreaming clients on loopback against k3 serve at each level, beside the same generations\nthrough a Batcher in process; a table and a PNG of latency against concurrency (a few minutes)."
	if err := parseFlags(fs, synopsis, args, stdout, stderr); err != nil {
		return err
	}
	var levels []int
	for _, f := range strings.Split(*clients, ",") {
		var c int
		if _, err := fmt.Sscan(f, &c); err != nil || c < 1 || c > 256 {
			return fmt.Errorf("-clients: %q is not a count in 1..256", f)
		}
		levels = append(levels, c)
	}
	if *perClient < 1 || *promptTokens < 1 || *maxTokens < 2 {
		return fmt.Errorf("-requests %d, -prompt %d, -tokens %d: want >= 1, >= 1, >= 2", *perClient, *promptTokens, *maxTokens)
	}
	if *prefixMB < 0 || *prefixMB > 1<<20 {
		return fmt.Errorf("-prefix-cache-mb %d: want 0..%d", *prefixMB, 1<<20)
	}
	if err := measurable(); err != nil {
		return err
	}
	dir, label := *model, *model
	if dir == "" {
		label = "the k31pro-100m preset (bf16, random weights)"
		tmp, err := os.MkdirTemp("", "k3-bench-serve-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		fmt.Fprintln(stderr, "writing the k31pro-100m random-weight checkpoint (bf16)...")
		if err := tiny.Write(tmp, "k31pro-100m", tiny.Options{Seed: 1, BF16: true}); err != nil {
			return err
		}
		dir = tmp
	}
	m, err := k3.Load(ctx, dir, k3.WithMemoryBudget(16<<30), k3.WithPrefixCache(*prefixMB<<20))
	if err != nil {
		return err
	}
	defer m.Close()
	res, chat, err := servebench.Run(ctx, m, servebench.Options{Clients: levels, PerClient: *perClient, PromptTokens: *promptTokens,
		MaxTokens: *maxTokens, LevelTimeout: *timeout}, func(s string) { fmt.Fprintln(stderr, s) })
	if err != nil {
		return err
	}
	var table strings.Builder
	fmt.Fprintf(&table, "k3 bench serve: %s, %d cores, %s; %s, a %d MiB prefix cache; streaming completions of %d prompt + %d generated tokens on loopback\n\n",
		cpuModel(), runtime.NumCPU(), time.Now().Format("2006-01-02"), label, *prefixMB, *promptTokens, *maxTokens)
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "clients\trequests\terrors\treq/s\tout tok/s\tdirect tok/s\tserver/direct\tTTFT p50 ms\tTTFT p99 ms\tITL p50 ms\tITL p99 ms\tgoroutines left\t")
	ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 }
	var xy [4]plotter.XYs
	for _, l := range res {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.2f\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t\n", l.Clients, l.Requests, l.Errors,
			l.RequestsPerSec, l.TokensPerSec, l.DirectTokensPerSec, l.TokensPerSec/l.DirectTokensPerSec,
			ms(l.TTFT[0]), ms(l.TTFT[1]), ms(l.ITL[0]), ms(l.ITL[1]), l.GoroutinesLeft)
		for i, d := range []time.Duration{l.TTFT[0], l.TTFT[1], l.ITL[0], l.ITL[1]} {
			xy[i] = append(xy[i], plotter.XY{X: float64(l.Clients), Y: ms(d)})
		}
	}
	tw.Flush()
	fmt.Fprintf(&table, "\nchat, second turn: first token %.0f ms against %.0f ms for the first turn (%d history tokens): %.3fx; %d of its %d prompt tokens came from the prefix cache\n",
		ms(chat.Second), ms(chat.First), chat.HistoryTokens, chat.Second.Seconds()/chat.First.Seconds(), chat.CachedTokens, chat.SecondPromptTokens)
	fmt.Fprint(stdout, table.String())
	if *out == "" {
		tmp, err := os.MkdirTemp("", "k3-bench-serve-out-")
		if err != nil {
			return err
		}
		*out = filepath.Join(tmp, "serve_latency")
	}
	if err := os.WriteFile(*out+".txt", []byte(table.String()), 0o644); err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = "k3 serve: latency against concurrent streaming clients"
	p.X.Label.Text = "concurrent clients"
	p.Y.Label.Text = "latency (ms, log scale)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	for i, name := range []string{"TTFT p50", "TTFT p99", "ITL p50", "ITL p99"} {
		line, points, err := plotter.NewLinePoints(xy[i])
		if err != nil {
			return err
		}
		line.Color = plotter.DefaultLineStyle.Color
		points.Shape = nil
		if i%2 == 1 {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		if i >= 2 {
			line.Width = vg.Points(2)
		}
		p.Add(line)
		p.Legend.Add(name, line)
	}
	p.Legend.Top, p.Legend.Left = false, false // bottom right, clear of the rising lines
	if err := p.Save(6*vg.Inch, 4*vg.Inch, *out+".png"); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s.txt and %s.png\n", *out, *out)
	return nil
}

// cpuModel is the CPU's model name as lscpu prints it (from /proc/cpuinfo).
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
