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
	"k3/internal/safetensors"
)

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	synopsis := "inspect PATH\n\nPATH is a .safetensors file (a checkpoint shard or a golden file) or a checkpoint directory."
	if err := parseFlags(fs, synopsis, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errUsage
	}
	path := fs.Arg(0)
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		f, err := safetensors.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		printMetadata(stdout, f.Metadata())
		printTensors(stdout, f.Tensors())
		return nil
	}
	var cfg *config.Config
	if _, err := os.Stat(filepath.Join(path, "config.json")); err == nil {
		if cfg, err = config.Load(path); err != nil {
			return err
		}
	}
	ck, err := safetensors.OpenCheckpoint(path)
	if err != nil {
		return err
	}
	defer ck.Close()
	var all []safetensors.TensorInfo
	for _, name := range ck.Names() {
		t, _, _ := ck.Tensor(name)
		all = append(all, t)
	}
	for _, f := range ck.Files {
		if len(f.Metadata()) > 0 {
			fmt.Fprintf(stdout, "%s metadata:\n", filepath.Base(f.Name()))
			printMetadata(stdout, f.Metadata())
		}
	}
	printTensors(stdout, all)
	if cfg != nil {
		printConfig(stdout, cfg)
	}
	return nil
}

func printMetadata(w io.Writer, m map[string]string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %s: %s\n", k, m[k])
	}
}

func printTensors(w io.Writer, ts []safetensors.TensorInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "name\tdtype\tshape\tbytes")
	byDType := map[safetensors.DType]int64{}
	var total int64
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s\t%v\t%d\n", t.Name, t.DType, t.Shape, t.Size)
		byDType[t.DType] += t.Size
		total += t.Size
	}
	tw.Flush()
	var parts []string
	for dt, n := range byDType {
		parts = append(parts, fmt.Sprintf("%s %s", dt, humanBytes(n)))
	}
	sort.Strings(parts)
	fmt.Fprintf(w, "%d tensors, %s (%s)\n", len(ts), humanBytes(total), strings.Join(parts, ", "))
}

func printConfig(w io.Writer, c *config.Config) {
	kinds := make([]string, len(c.Layers))
	for i, k := range c.Layers {
		kinds[i] = k.String()
	}
	fmt.Fprintf(w, "config: model_type %s, %d layers, hidden %d, vocab %d, %.2fM parameters\n",
		c.ModelType, c.NumLayers, c.HiddenSize, c.VocabSize, float64(c.NumParams())/1e6)
	fmt.Fprintf(w, "  layers: %s\n", strings.Join(kinds, " "))
	if c.KDA.NumHeads > 0 {
		gate := "softplus"
		if c.KDA.GateLowerBound != nil {
			gate = fmt.Sprintf("lower bound %g", *c.KDA.GateLowerBound)
		}
		fmt.Fprintf(w, "  kda: %d heads x %d, conv %d, gate %s, full-rank output gate %v\n",
			c.KDA.NumHeads, c.KDA.HeadDim, c.KDA.ConvKernel, gate, c.KDA.FullRankGate)
	}
	m := c.MLA
	if m.NumHeads > 0 {
		fmt.Fprintf(w, "  mla: %d heads, q_lora %d, kv_lora %d, nope %d, rope %d, v %d, nope-mode %v, output gate %v\n",
			m.NumHeads, m.QLoRARank, m.KVLoRARank, m.QKNopeHeadDim, m.QKRopeHeadDim, m.VHeadDim, m.UseNoPE, m.OutputGate)
	}
	if ix := c.Indexer; ix != nil {
		fmt.Fprintf(w, "  indexer: %d heads x %d, top-k %d\n", ix.NumHeads, ix.HeadDim, ix.TopK)
	}
	if e := c.MoE; e != nil {
		fmt.Fprintf(w, "  moe: %d experts, top-%d, %d shared, width %d, latent %d, groups %d/%d, scale %g, first dense %d\n",
			e.NumExperts, e.TopK, e.NumShared, e.IntermediateSize, e.LatentSize, e.TopKGroup, e.NumGroups, e.ScalingFactor, e.FirstKDense)
	}
	if c.AttnResBlockSize > 0 {
		fmt.Fprintf(w, "  attnres: block size %d layers\n", c.AttnResBlockSize)
	}
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
