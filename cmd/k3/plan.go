package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"k3/config"
	"k3/internal/plan"
)

func runPlan(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "config.json, or a checkpoint directory holding one (required)")
	cards := fs.Int("cards", 8, "cards to deploy on")
	var presets []string
	for n := range plan.Cards {
		presets = append(presets, n)
	}
	sort.Strings(presets)
	cardName := fs.String("card", "a3", "card preset ("+strings.Join(presets, ", ")+"); the flags below override its fields")
	mem := fs.Float64("card-memory", 0, "device memory per card, GB")
	tflops := fs.Float64("card-tflops", 0, "matrix peak per card at the weights' dtype, TFLOP/s")
	memBW := fs.Float64("card-gbps", 0, "device memory bandwidth per card, GB/s")
	link := fs.Float64("link-gbps", 0, "collective bandwidth per card, one direction, GB/s")
	lat := fs.Float64("latency-us", -1, "fixed cost of one collective, µs")
	ctxLen := fs.Int("context", 4096, "tokens each decoding sequence attends over")
	batch := fs.Int("batch", 64, "sequences decoding at once over all cards")
	prompt := fs.Int("prompt", 4096, "prompt tokens, for the time-to-first-token estimate")
	wb := fs.Float64("weight-bytes", 2, "bytes per weight (2 bf16, 1 int8/fp8)")
	kvb := fs.Float64("kv-bytes", 2, "bytes per cached element (2 bf16, 1 int8)")
	ab := fs.Float64("act-bytes", 2, "bytes per activation element in collectives")
	drafts := fs.Int("drafts", 0, "draft tokens verified per sequence and step (multi-token prediction)")
	accepted := fs.Float64("accepted", 0, "draft tokens kept per step on average")
	top := fs.Int("top", 5, "layouts to print (0: all)")
	splitIndexer := fs.Bool("split-indexer", false, "split the Lightning Indexer's heads over TP too (its scores all-reduced per DSA layer)")
	if err := parseFlags(fs, "plan -config FILE -cards N [-card NAME] [-context L] [-batch B] ...", args, stdout, stderr); err != nil {
		return err
	}
	if *cfgPath == "" || fs.NArg() > 0 {
		fs.Usage()
		return errUsage
	}
	path := *cfgPath
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "config.json")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	cfg, err := config.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	card, ok := plan.Cards[*cardName]
	if !ok {
		return fmt.Errorf("unknown card %q (have %s)", *cardName, strings.Join(presets, ", "))
	}
	for _, o := range []struct {
		v   float64
		dst *float64
	}{{*mem, &card.MemoryGB}, {*tflops, &card.TFLOPS}, {*memBW, &card.MemGBps}, {*link, &card.LinkGBps}} {
		if o.v != 0 {
			*o.dst = o.v
		}
	}
	if *lat >= 0 {
		card.LatencyUs = *lat
	}
	w := plan.Workload{Context: *ctxLen, Batch: *batch, Prompt: *prompt, WeightBytes: *wb, KVBytes: *kvb, ActBytes: *ab,
		Drafts: *drafts, Accepted: *accepted, SplitIndexer: *splitIndexer}
	est, err := plan.Plan(cfg, card, *cards, w)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %.1fB parameters on %d x %s (%.0f GB, %.0f TFLOP/s, %.0f GB/s, link %.0f GB/s, %.0f µs per collective)\n",
		path, float64(cfg.NumParams())/1e9, *cards, card.Name, card.MemoryGB, card.TFLOPS, card.MemGBps, card.LinkGBps, card.LatencyUs)
	fmt.Fprintf(stdout, "context %d, batch %d, prompt %d, %g B/weight, %g B/cache element, %d drafts (%g kept)\n",
		w.Context, w.Batch, w.Prompt, w.WeightBytes, w.KVBytes, w.Drafts, w.Accepted)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "layout\tfits\tweights GB\tstate GB\tcomm MB/step\tcompute ms\tmemory ms\tcomm ms\tTPOT ms\ttok/card/s\tTTFT ms\t")
	for i, e := range est {
		if *top > 0 && i == *top {
			break
		}
		fmt.Fprintf(tw, "%v\t%v\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%.0f\t\n", e.Layout, e.Fits, e.WeightsGB, e.StateGB,
			e.CommMB, e.ComputeMs, e.MemoryMs, e.CommMs, e.TPOTMs, e.TokPerCardS, e.TTFTMs)
	}
	return tw.Flush()
}
