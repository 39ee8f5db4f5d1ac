package modelbench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"k3/k3"
	"k3/specdec"
)

// SpecRow is one depth at one acceptance rate: speculative greedy decoding
// against plain greedy decoding of the same tokens, run side by side.
type SpecRow struct {
	Alpha float64 // the probability that a draft is the target's own token
	K     int     // the draft depth; 0: the adaptive depth
	// C is the verify pass's cost per draft, measured: a pass of K+1
	// tokens costs (C·K + 1) decode steps.
	C       float64
	Theory  float64 // (1 - α^(K+1)) / ((1 - α)(C·K + 1))
	Speedup float64 // plain decoding's time over speculative decoding's, the median of the pairs
	// Low and High are the pairs' least and greatest speedups.
	Low, High float64
	Tau       float64 // tokens per verify pass, measured
}

// SpecResult is `k3 bench spec`'s table.
type SpecResult struct {
	Tokens int // generated per run
	StepMS float64
	Rows   []SpecRow
}

// corrupted proposes the target's own greedy continuation (want, indexed
// by absolute position), each draft replaced by another token with
// probability 1 - alpha: a drafter of controlled acceptance.
type corrupted struct {
	want  []int32
	alpha float64
	vocab int32
	rng   *rand.Rand
}

func (c *corrupted) Draft(history []int32, n int, dst []int32) []int32 {
	for i := range n {
		p := len(history) + i
		if p >= len(c.want) {
			break
		}
		tok := c.want[p]
		if c.rng.Float64() >= c.alpha {
			tok = (tok + 1 + c.rng.Int32N(c.vocab-1)) % c.vocab
		}
		dst = append(dst, tok)
	}
	return dst
}

// Spec measures speculative decoding on the 100M preset at controlled
// acceptance: for each alpha and depth, a plain greedy generation and a
// speculative one of the same tokens alternate (the ratio of neighbours
// survives a shared host's drift), next to the theory with the verify
// pass's cost measured in the same run.
func Spec(ctx context.Context, alphas []float64, depths []int, tokens int, log func(string)) (*SpecResult, error) {
	if len(alphas) == 0 || len(depths) == 0 {
		return nil, fmt.Errorf("modelbench: no acceptance rates or no depths")
	}
	// The verify passes are timed this many at a time, after one more.
	const timed = 3
	deepest := slices.Max(depths)
	if tokens < (timed+1)*(deepest+1) {
		return nil, fmt.Errorf("modelbench: %d tokens a run: the verify passes of depth %d are measured on %d of them in a row, want at least %d", tokens, deepest, timed+1, (timed+1)*(deepest+1))
	}
	dir, err := writePreset("k31pro-100m", log)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	m, err := k3.Load(ctx, dir, k3.WithRollback(deepest))
	if err != nil {
		return nil, err
	}
	defer m.Close()
	prompt := make([]int32, 64)
	for i := range prompt {
		prompt[i] = int32(3 + (i*31)%256)
	}
	base, err := m.NewSession()
	if err != nil {
		return nil, err
	}
	defer base.Close()
	if _, err := base.Forward(ctx, prompt); err != nil {
		return nil, err
	}
	opts := []k3.GenerateOption{k3.WithMaxTokens(tokens), k3.WithoutDefaultStops()}
	// gen times a greedy generation from the prompt on a fork of base.
	gen := func(extra ...k3.GenerateOption) ([]int32, k3.Usage, time.Duration, error) {
		s, err := base.Fork()
		if err != nil {
			return nil, k3.Usage{}, 0, err
		}
		defer s.Close()
		var out []int32
		var u k3.Usage
		start := time.Now()
		for tok, err := range s.GenerateTokens(ctx, nil, append(opts, extra...)...) {
			if err != nil {
				return nil, u, 0, err
			}
			out = append(out, tok.ID)
			if tok.Usage != nil {
				u = *tok.Usage
			}
		}
		return out, u, time.Since(start), nil
	}
	log("plain greedy decoding (warm-up and the target's tokens)...")
	want, _, _, err := gen()
	if err != nil {
		return nil, err
	}
	full := append(append([]int32(nil), prompt...), want...)
	// Verify passes of n tokens, as the loop runs them back to back when
	// their drafts are accepted: on a fork of a session standing in the
	// middle of the generated tokens (reached by decode steps, so the
	// passes attend over the loop's average context), a pass the fork's
	// copy warms up, then passes timed one after another.
	anchor := len(prompt) + min(tokens/2, tokens-(timed+1)*(deepest+1))
	probe, err := base.Fork()
	if err != nil {
		return nil, err
	}
	defer probe.Close()
	for i := len(prompt); i < anchor; i++ {
		if _, err := probe.Forward(ctx, full[i:i+1]); err != nil {
			return nil, err
		}
	}
	passes := func(n int) ([]float64, error) {
		f, err := probe.Fork()
		if err != nil {
			return nil, err
		}
		defer f.Close()
		var ts []float64
		for i := range timed + 1 {
			at := anchor + i*n
			start := time.Now()
			if _, err := f.Forward(ctx, full[at:at+n]); err != nil {
				return nil, err
			}
			if i > 0 {
				ts = append(ts, float64(time.Since(start)))
			}
		}
		return ts, nil
	}
	if _, err := passes(deepest + 1); err != nil { // warm-up
		return nil, err
	}
	// The adaptive depth's cost table is measured once per model, at
	// first use; the pairs time the loop after it.
	if _, err := m.SpeculationCosts(ctx); err != nil {
		return nil, err
	}
	r := &SpecResult{Tokens: tokens}
	var steps []float64
	for _, a := range alphas {
		for _, k := range append(slices.Clone(depths), 0) { // 0: the adaptive depth, up to the deepest
			log(fmt.Sprintf("alpha %.1f, depth %d...", a, k))
			var ratios, taus, costs []float64
			for rep := range pairsFor(k) {
				d := &corrupted{want: full, alpha: a, vocab: int32(m.VocabSize()), rng: rand.New(rand.NewPCG(uint64(k), uint64(rep)))}
				opt := k3.WithSpeculation(d, k)
				if k == 0 {
					opt = k3.WithAdaptiveSpeculation(d, deepest)
				}
				var got []int32
				var u k3.Usage
				var plain, spec time.Duration
				err := inTurn(rep, func() (err error) {
					_, _, plain, err = gen()
					return err
				}, func() (err error) {
					got, u, spec, err = gen(opt)
					return err
				})
				if err != nil {
					return nil, err
				}
				if !slices.Equal(got, want) {
					return nil, fmt.Errorf("modelbench: speculative decoding (alpha %.1f, depth %d) gave other tokens than plain decoding", a, k)
				}
				ratios = append(ratios, float64(plain)/float64(spec))
				taus = append(taus, float64(len(got))/float64(len(got)-u.AcceptedTokens))
				// The decode step is the plain generation's own: its tokens
				// but the first each took one. The verify pass is measured
				// next to it, so that c sees the same state of a shared
				// host as the pair it is set against.
				step := float64(plain) / float64(tokens-1)
				steps = append(steps, step/1e6)
				if k > 0 {
					ts, err := passes(k + 1)
					if err != nil {
						return nil, err
					}
					costs = append(costs, (median(ts)/step-1)/float64(k))
				}
			}
			row := SpecRow{Alpha: a, K: k, Speedup: median(ratios), Tau: median(taus), Low: slices.Min(ratios), High: slices.Max(ratios)}
			if k > 0 {
				row.C = median(costs)
				row.Theory = (1 - math.Pow(a, float64(k+1))) / ((1 - a) * (row.C*float64(k) + 1))
			}
			r.Rows = append(r.Rows, row)
		}
	}
	r.StepMS = median(steps)
	return r, nil
}

// inTurn runs one pair's plain and speculative generations, plain first in
// even pairs and speculative first in odd ones, so that a shared host's
// drift favours neither.
func inTurn(rep int, plain, spec func() error) error {
	first, second := plain, spec
	if rep%2 == 1 {
		first, second = spec, plain
	}
	if err := first(); err != nil {
		return err
	}
	return second()
}

// pairsFor returns how many plain/speculative pairs time a depth: more
// for the adaptive depth, whose bound against plain decoding (3%) lies
// inside a shared host's pair-to-pair spread.
func pairsFor(k int) int {
	if k == 0 {
		return 7
	}
	return 3
}

// Table formats the result as `k3 bench spec` prints it.
func (r *SpecResult) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "speculative greedy decoding, 100M preset, %d tokens a run, drafts of controlled acceptance alpha (the target's own tokens, each replaced with probability 1-alpha); decode step %.2f ms\n", r.Tokens, r.StepMS)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "alpha\tdepth\tc\ttokens/pass\ttheory\tspeedup\tof theory\t")
	for _, row := range r.Rows {
		if row.K == 0 {
			fmt.Fprintf(tw, "%.1f\tauto\t\t%.2f\t\t%.2fx (%.2f-%.2f)\t\t\n", row.Alpha, row.Tau, row.Speedup, row.Low, row.High)
			continue
		}
		fmt.Fprintf(tw, "%.1f\t%d\t%.3f\t%.2f\t%.2fx\t%.2fx\t%.0f%%\t\n", row.Alpha, row.K, row.C, row.Tau, row.Theory, row.Speedup, 100*row.Speedup/row.Theory)
	}
	tw.Flush()
	b.WriteString("c: a verify pass of K+1 tokens costs (c·K + 1) decode steps (the median over the 3 pairs of: 3 passes back to back on a fork standing mid-run, against the pair's plain step); theory (1 - alpha^(K+1)) / ((1 - alpha)(c·K + 1)); speedup: the median of 3 plain/speculative pairs run back to back, in turn plain first and speculative first; auto: WithAdaptiveSpeculation up to the deepest depth, its costs measured by Model.SpeculationCosts before the pairs, the median of 7 pairs (least-greatest)\n")
	return b.String()
}

// SpecBatchRow is one acceptance rate and depth with a batch of sequences
// speculating together in a Batcher, against the same batch decoding
// plainly in it.
type SpecBatchRow struct {
	Alpha   float64
	K       int     // 0: the adaptive depth
	Speedup float64 // plain batch's time over the speculating batch's, the median of the pairs
	// Low and High are the pairs' least and greatest speedups.
	Low, High float64
	Tau       float64 // tokens per verify run, over the batch
}

// SpecBatch measures speculation inside the Batcher: batch sequences of
// distinct prompts, each with its own drafter of controlled acceptance
// (the sequence's own greedy tokens, each replaced with probability
// 1-alpha), run together; plain and speculating batches alternate, three
// pairs each, and every speculating sequence must give its plain tokens.
func SpecBatch(ctx context.Context, alphas []float64, depths []int, batch, tokens int, log func(string)) ([]SpecBatchRow, error) {
	dir, err := writePreset("k31pro-100m", log)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	m, err := k3.Load(ctx, dir, k3.WithRollback(slices.Max(depths)))
	if err != nil {
		return nil, err
	}
	defer m.Close()
	br, stop, err := startSpecBatcher(ctx, m, batch)
	if err != nil {
		return nil, err
	}
	defer stop()
	prompts := make([][]int32, batch)
	for i := range prompts {
		prompts[i] = make([]int32, 64)
		for j := range prompts[i] {
			prompts[i][j] = int32(3 + (j*31+i*17)%256)
		}
	}
	opts := []k3.GenerateOption{k3.WithMaxTokens(tokens), k3.WithoutDefaultStops()}
	// run generates every sequence at once, spec(i) its extra options.
	run := func(spec func(i int) []k3.GenerateOption) ([][]int32, int, time.Duration, error) {
		return generateAll(ctx, m, br, prompts, opts, spec)
	}
	none := func(int) []k3.GenerateOption { return nil }
	log(fmt.Sprintf("batch %d, plain (warm-up and the targets' tokens)...", batch))
	want, _, _, err := run(none)
	if err != nil {
		return nil, err
	}
	var rows []SpecBatchRow
	for _, a := range alphas {
		for _, k := range append(slices.Clone(depths), 0) {
			log(fmt.Sprintf("batch %d, alpha %.1f, depth %d...", batch, a, k))
			var ratios, taus []float64
			for rep := range pairsFor(k) {
				speculate := func(i int) []k3.GenerateOption {
					full := append(slices.Clone(prompts[i]), want[i]...)
					d := &corrupted{want: full, alpha: a, vocab: int32(m.VocabSize()), rng: rand.New(rand.NewPCG(uint64(k*100+i), uint64(rep)))}
					if k == 0 {
						return []k3.GenerateOption{k3.WithAdaptiveSpeculation(d, slices.Max(depths))}
					}
					return []k3.GenerateOption{k3.WithSpeculation(d, k)}
				}
				var got [][]int32
				var acc int
				var plain, spec time.Duration
				err := inTurn(rep, func() (err error) {
					_, _, plain, err = run(none)
					return err
				}, func() (err error) {
					got, acc, spec, err = run(speculate)
					return err
				})
				if err != nil {
					return nil, err
				}
				for i := range got {
					if !slices.Equal(got[i], want[i]) {
						return nil, fmt.Errorf("modelbench: batch speculation (alpha %.1f, depth %d) gave sequence %d other tokens than plain decoding", a, k, i)
					}
				}
				ratios = append(ratios, float64(plain)/float64(spec))
				n := batch * tokens
				taus = append(taus, float64(n)/float64(n-acc))
			}
			rows = append(rows, SpecBatchRow{Alpha: a, K: k, Speedup: median(ratios), Low: slices.Min(ratios), High: slices.Max(ratios), Tau: median(taus)})
		}
	}
	return rows, nil
}

// SpecBatchTable formats SpecBatch's rows.
func SpecBatchTable(batch, tokens int, rows []SpecBatchRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "speculation inside the Batcher, 100M preset, %d sequences of %d tokens each speculating with its own drafter of controlled acceptance; speedup = the same batch decoding plainly, over speculating: the median of 3 pairs (auto: 7, its cost table measured before them), in turn plain first and speculative first, least-greatest in brackets\n", batch, tokens)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "alpha\tdepth\tspeedup\ttokens/run\t")
	for _, r := range rows {
		depth := fmt.Sprint(r.K)
		if r.K == 0 {
			depth = "auto"
		}
		fmt.Fprintf(tw, "%.1f\t%s\t%.2fx (%.2f-%.2f)\t%.2f\t\n", r.Alpha, depth, r.Speedup, r.Low, r.High, r.Tau)
	}
	tw.Flush()
	return b.String()
}

// RealRow is one drafter on the embedded model at one batch size and
// depth: acceptance length and throughput against plain decoding.
type RealRow struct {
	Drafter     string // ngram, self:N or dspark
	Batch       int
	K           int     // 0: the adaptive depth
	Tau         float64 // tokens per verify run (generated over runs)
	Plain, Spec float64 // tokens per second, all sequences together (medians)
	// Speedup is the median of the pairs' speedups, Low and High their
	// least and greatest.
	Speedup, Low, High float64
}

// SpecReal measures real drafters (ngram, self:N, dspark) on the embedded trained
// model: a
// prompt from the start of each file (its first 768 bytes), tokens
// generated greedily after each, at batch 1 (the prompts one after
// another, each alone) and at batch (all at once in a Batcher), plain and
// speculative runs alternating, three pairs each; every speculative
// sequence must give its plain tokens. With a temperature the tokens are
// sampled (seeded per prompt), and with rejection the speculation runs
// k3.WithRejectionSampling, whose tokens match plain sampling's in
// distribution only, so they are not compared.
func SpecReal(ctx context.Context, files []string, drafters []string, batch, tokens int, depths []int, temperature float32, rejection bool, log func(string)) ([]RealRow, error) {
	m, err := k3.LoadTiny(ctx, k3.WithRollback(slices.Max(depths)))
	if err != nil {
		return nil, err
	}
	defer m.Close()
	var prompts [][]int32
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		prompts = append(prompts, m.Encode(string(b[:min(len(b), 768)])))
	}
	if len(prompts) == 0 {
		return nil, fmt.Errorf("modelbench: no prompt files")
	}
	br, stop, err := startSpecBatcher(ctx, m, batch)
	if err != nil {
		return nil, err
	}
	defer stop()
	opts := []k3.GenerateOption{k3.WithMaxTokens(tokens), k3.WithoutDefaultStops()}
	// run generates every prompt at batch b (1: one after another, each
	// alone).
	run := func(b int, extra func(i int) []k3.GenerateOption) ([][]int32, int, time.Duration, error) {
		in := br
		if b == 1 {
			in = nil
		}
		return generateAll(ctx, m, in, prompts, opts, extra)
	}
	sampling := func(i int) []k3.GenerateOption {
		if temperature == 0 {
			return nil
		}
		return []k3.GenerateOption{k3.WithTemperature(temperature), k3.WithSeed(uint64(i + 1))}
	}
	// drafterFor returns the drafters of one run, one per prompt (a self
	// drafter follows one sequence), and what closes them.
	drafterFor := func(name string) ([]specdec.Drafter, func(), error) {
		ds := make([]specdec.Drafter, len(prompts))
		var dms []interface{ Close() error }
		done := func() {
			for _, d := range dms {
				d.Close()
			}
		}
		for i := range ds {
			if n, ok := strings.CutPrefix(name, "self:"); ok {
				var k int
				if _, err := fmt.Sscan(n, &k); err != nil {
					return nil, done, fmt.Errorf("modelbench: drafter %q", name)
				}
				d, err := m.NewSelfDraft(k)
				if err != nil {
					done()
					return nil, done, err
				}
				dms, ds[i] = append(dms, d), d
			} else if name == "ngram" {
				ds[i] = specdec.NGram{}
			} else if name == "dspark" {
				d, err := m.NewDSpark()
				if err != nil {
					done()
					return nil, done, err
				}
				dms, ds[i] = append(dms, d), d
			} else {
				return nil, done, fmt.Errorf("modelbench: drafter %q: want ngram, self:N or dspark", name)
			}
		}
		return ds, done, nil
	}
	want, _, _, err := run(1, sampling) // warm-up, and the tokens to match
	if err != nil {
		return nil, err
	}
	var rows []RealRow
	for _, name := range drafters {
		for _, b := range []int{1, batch} {
			for _, k := range append(slices.Clone(depths), 0) {
				log(fmt.Sprintf("%s drafter, batch %d, depth %d...", name, b, k))
				var plains, specs, taus, ratios []float64
				for rep := range pairsFor(k) {
					var got [][]int32
					var acc int
					var pd, sd time.Duration
					err := inTurn(rep, func() (err error) {
						_, _, pd, err = run(b, sampling)
						return err
					}, func() error {
						// The drafters live for the speculative run alone.
						ds, done, err := drafterFor(name)
						if err != nil {
							return err
						}
						defer done()
						got, acc, sd, err = run(b, func(i int) []k3.GenerateOption {
							o := sampling(i)
							if k == 0 {
								o = append(o, k3.WithAdaptiveSpeculation(ds[i], slices.Max(depths)))
							} else {
								o = append(o, k3.WithSpeculation(ds[i], k))
							}
							if rejection {
								o = append(o, k3.WithRejectionSampling())
							}
							return o
						})
						return err
					})
					if err != nil {
						return nil, err
					}
					n := 0
					for i := range got {
						if !slices.Equal(got[i], want[i]) && !(rejection && temperature > 0) {
							return nil, fmt.Errorf("modelbench: the %s drafter (batch %d, depth %d) changed prompt %d's tokens", name, b, k, i)
						}
						n += len(got[i])
					}
					plains = append(plains, float64(n)/pd.Seconds())
					specs = append(specs, float64(n)/sd.Seconds())
					taus = append(taus, float64(n)/float64(n-acc))
					ratios = append(ratios, pd.Seconds()/sd.Seconds())
				}
				rows = append(rows, RealRow{Drafter: name, Batch: b, K: k, Tau: median(taus), Plain: median(plains), Spec: median(specs),
					Speedup: median(ratios), Low: slices.Min(ratios), High: slices.Max(ratios)})
			}
		}
	}
	return rows, nil
}

// RealTable formats SpecReal's rows.
func RealTable(files, tokens int, temperature float32, rejection bool, rows []RealRow) string {
	var b strings.Builder
	how := "greedy"
	if temperature > 0 {
		how = fmt.Sprintf("sampled (temperature %g, coupled verification)", temperature)
		if rejection {
			how = fmt.Sprintf("sampled (temperature %g, rejection sampling)", temperature)
		}
	}
	fmt.Fprintf(&b, "real drafters on the embedded model, %d prompts (a file's first 768 bytes each), %d %s tokens after each; speedup: the median of 3 pairs (auto: 7), in turn plain first and speculative first, least-greatest in brackets\n", files, tokens, how)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "drafter\tbatch\tdepth\ttokens/run\tplain tok/s\tspeculative tok/s\tspeedup\t")
	for _, r := range rows {
		depth := fmt.Sprint(r.K)
		if r.K == 0 {
			depth = "auto"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.2f\t%.0f\t%.0f\t%.2fx (%.2f-%.2f)\t\n", r.Drafter, r.Batch, depth, r.Tau, r.Plain, r.Spec, r.Speedup, r.Low, r.High)
	}
	tw.Flush()
	return b.String()
}

// generateAll generates every prompt with opts and extra(i), each in a
// session of its own, and returns the tokens, the drafts accepted in all
// and the time: all at once in br, or, with br nil, one after another.
func generateAll(ctx context.Context, m *k3.Model, br *k3.Batcher, prompts [][]int32, opts []k3.GenerateOption,
	extra func(i int) []k3.GenerateOption) ([][]int32, int, time.Duration, error) {
	out := make([][]int32, len(prompts))
	accepted := make([]int, len(prompts))
	errs := make([]error, len(prompts))
	one := func(i int) {
		s, err := m.NewSession()
		if err != nil {
			errs[i] = err
			return
		}
		defer s.Close()
		o := append(slices.Clone(opts), extra(i)...)
		seq := s.GenerateTokens(ctx, prompts[i], o...)
		if br != nil {
			seq = br.GenerateTokens(ctx, s, prompts[i], o...)
		}
		for tok, err := range seq {
			if err != nil {
				errs[i] = err
				return
			}
			out[i] = append(out[i], tok.ID)
			if tok.Usage != nil {
				accepted[i] = tok.Usage.AcceptedTokens
			}
		}
	}
	start := time.Now()
	if br == nil {
		for i := range prompts {
			one(i)
		}
	} else {
		var wg sync.WaitGroup
		for i := range prompts {
			wg.Add(1)
			go func() { defer wg.Done(); one(i) }()
		}
		wg.Wait()
	}
	d := time.Since(start)
	acc := 0
	for i := range prompts {
		if errs[i] != nil {
			return nil, 0, 0, errs[i]
		}
		acc += accepted[i]
	}
	return out, acc, d, nil
}

// startSpecBatcher starts a Batcher of batch sequences on m and measures
// the adaptive depth's cost tables for every batch the runs pass through
// (sequences join one by one) before any timing: a first use would
// measure inside the loop. stop ends the Batcher.
func startSpecBatcher(ctx context.Context, m *k3.Model, batch int) (*k3.Batcher, context.CancelFunc, error) {
	br, err := m.NewBatcher(batch)
	if err != nil {
		return nil, nil, err
	}
	bctx, stop := context.WithCancel(ctx)
	if err := br.Start(bctx); err != nil {
		stop()
		return nil, nil, err
	}
	for b := 1; b <= batch; b *= 2 {
		if _, err := m.SpeculationCostsAt(ctx, b); err != nil {
			stop()
			return nil, nil, err
		}
	}
	return br, stop, nil
}
