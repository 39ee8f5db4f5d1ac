package modelbench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"k3/compute"
	"k3/internal/cpu"
	"k3/internal/tiny"
	"k3/k3"
)

type timed struct {
	compute.Backend
	t     map[string]time.Duration
	n     map[string]int
	flops map[string]float64
}

func (b *timed) rec(name string, start time.Time) { b.t[name] += time.Since(start); b.n[name]++ }
func (b *timed) MatMul(d, x, w compute.Tensor) error {
	name := fmt.Sprintf("MatMul M=%d", x.Len()/x.Dim(-1))
	if os.Getenv("K3_PROFILE_SHAPES") != "" {
		name += fmt.Sprintf(" %dx%d", w.Dim(0), w.Dim(1))
	}
	if b.flops != nil {
		b.flops[name] += 2 * float64(x.Len()) * float64(w.Dim(0))
	}
	defer b.rec(name, time.Now())
	return b.Backend.MatMul(d, x, w)
}
func (b *timed) HeadMatMul(d, x, w compute.Tensor) error {
	defer b.rec("HeadMatMul", time.Now())
	return b.Backend.HeadMatMul(d, x, w)
}
func (b *timed) KDAChunk(a *compute.KDAArgs) error {
	defer b.rec("KDAChunk", time.Now())
	return b.Backend.KDAChunk(a)
}
func (b *timed) CausalConv(a *compute.ConvArgs) error {
	defer b.rec("CausalConv", time.Now())
	return b.Backend.CausalConv(a)
}
func (b *timed) Binary(op compute.BinaryOp, d, x, y compute.Tensor) error {
	defer b.rec("Binary", time.Now())
	return b.Backend.Binary(op, d, x, y)
}
func (b *timed) Unary(op compute.UnaryOp, d, x compute.Tensor) error {
	defer b.rec("Unary", time.Now())
	return b.Backend.Unary(op, d, x)
}
func (b *timed) KDAStep(a *compute.KDAStepArgs) error {
	defer b.rec("KDAStep", time.Now())
	return b.Backend.KDAStep(a)
}

// PrepareMatMul passes the weight layout through, so that the products
// timed are the ones the backend runs.
func (b *timed) PrepareMatMul(w compute.Tensor) (compute.Tensor, error) {
	return compute.PrepareMatMul(b.Backend, w)
}

// PrepareExperts passes the experts' layout through too.
func (b *timed) PrepareExperts(w1, w3, w2 []compute.Tensor) error {
	return compute.PrepareExperts(b.Backend, w1, w3, w2)
}

// unpaired is a backend whose experts keep PrepareMatMul's layout alone
// (it hides PrepareExperts), for TestProfileLayouts.
type unpaired struct{ compute.Backend }

func (b unpaired) PrepareMatMul(w compute.Tensor) (compute.Tensor, error) {
	return compute.PrepareMatMul(b.Backend, w)
}

func (b *timed) Attention(a *compute.AttnArgs) error {
	name := "Attention"
	if os.Getenv("K3_PROFILE_SHAPES") != "" {
		form := "dense"
		if !a.Indices.IsZero() {
			form = "sparse"
		}
		name += fmt.Sprintf(" %s %dx%d", form, a.Q.Dim(0), a.Q.Dim(1))
	}
	defer b.rec(name, time.Now())
	return b.Backend.Attention(a)
}

// AttentionBatch passes a pass's calls on as one, as the backend takes
// them (one call timed).
func (b *timed) AttentionBatch(calls []*compute.AttnArgs) error {
	defer b.rec("Attention", time.Now())
	return compute.AttentionBatch(b.Backend, calls)
}
func (b *timed) LightningIndexer(a *compute.IndexerArgs) error {
	defer b.rec("Indexer", time.Now())
	return b.Backend.LightningIndexer(a)
}

// LightningIndexerBatch passes a pass's calls on as one (one call timed).
func (b *timed) LightningIndexerBatch(calls []*compute.IndexerArgs) error {
	defer b.rec("Indexer", time.Now())
	return compute.LightningIndexerBatch(b.Backend, calls)
}
func (b *timed) MoEExperts(a *compute.ExpertArgs) error {
	defer b.rec("MoEExperts", time.Now())
	return b.Backend.MoEExperts(a)
}
func (b *timed) MoERoute(a *compute.RouteArgs) error {
	defer b.rec("MoERoute", time.Now())
	return b.Backend.MoERoute(a)
}
func (b *timed) AttnResUpdate(a *compute.AttnResUpdateArgs) error {
	defer b.rec("AttnResUpdate", time.Now())
	return b.Backend.AttnResUpdate(a)
}
func (b *timed) AttnResPrepare(a *compute.AttnResPrepareArgs) error {
	defer b.rec("AttnResPrepare", time.Now())
	return b.Backend.AttnResPrepare(a)
}
func (b *timed) GatedAct(act compute.Activation, d, g, u compute.Tensor) error {
	defer b.rec("GatedAct", time.Now())
	return b.Backend.GatedAct(act, d, g, u)
}
func (b *timed) Copy(d, s compute.Tensor) error {
	defer b.rec("Copy", time.Now())
	return b.Backend.Copy(d, s)
}
func (b *timed) RoPE(a *compute.RopeArgs) error {
	defer b.rec("RoPE", time.Now())
	return b.Backend.RoPE(a)
}
func (b *timed) LayerNorm(d, x, w, bias compute.Tensor, e float32) error {
	defer b.rec("LayerNorm", time.Now())
	return b.Backend.LayerNorm(d, x, w, bias, e)
}
func (b *timed) Embedding(d, table, ids compute.Tensor) error {
	defer b.rec("Embedding", time.Now())
	return b.Backend.Embedding(d, table, ids)
}
func (b *timed) RMSNorm(d, x, w compute.Tensor, e float32) error {
	name := "RMSNorm"
	if os.Getenv("K3_PROFILE_SHAPES") != "" {
		name += fmt.Sprintf(" %dx%d", x.Len()/x.Dim(-1), x.Dim(-1))
	}
	defer b.rec(name, time.Now())
	return b.Backend.RMSNorm(d, x, w, e)
}

// profilePreset skips the test unless K3_PROFILE is set, and writes the
// preset K3_PROFILE_PRESET names (k31pro-100m by default) in bf16 to a
// temporary directory, which it returns.
func profilePreset(t *testing.T) string {
	t.Helper()
	if os.Getenv("K3_PROFILE") == "" {
		t.Skip("set K3_PROFILE=1")
	}
	dir := t.TempDir()
	preset := "k31pro-100m"
	if p := os.Getenv("K3_PROFILE_PRESET"); p != "" {
		preset = p
	}
	if err := tiny.Write(dir, preset, tiny.Options{Seed: 1, BF16: true}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// loadTimed writes the 100M preset (or K3_PROFILE_PRESET's) and loads it
// on a timed go backend (go-fastbf16 with K3_PROFILE_FAST set); the test
// is skipped unless K3_PROFILE is set.
func loadTimed(t *testing.T) (*k3.Model, *timed) {
	dir := profilePreset(t)
	var be compute.Backend = cpu.New(0)
	if os.Getenv("K3_PROFILE_FAST") != "" {
		be = cpu.NewFastBF16(0) // the opt-in fast bf16 products
	}
	tb := &timed{Backend: be, t: map[string]time.Duration{}, n: map[string]int{}, flops: map[string]float64{}}
	opts := []k3.Option{k3.WithComputeBackend(tb)}
	if v, err := strconv.Atoi(os.Getenv("K3_PROFILE_CHUNK")); err == nil && v > 0 {
		opts = append(opts, k3.WithPrefillChunk(v)) // the prefill's chunk (default 512)
	}
	m, err := k3.Load(context.Background(), dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m, tb
}

func (b *timed) reset() {
	clear(b.t)
	clear(b.n)
	clear(b.flops)
}

// report logs every operation's time divided by runs, slowest first, after
// a header naming what ran and how long it took in all.
func (b *timed) report(t *testing.T, header string, total time.Duration, runs int) {
	var names []string
	var sum time.Duration
	for k, v := range b.t {
		names = append(names, k)
		sum += v
	}
	sort.Slice(names, func(i, j int) bool { return b.t[names[i]] > b.t[names[j]] })
	per := time.Duration(runs)
	t.Logf("%s: %v per run; ops account for %v", header, total/per, sum/per)
	for _, k := range names {
		gf := ""
		if f := b.flops[k]; f > 0 {
			gf = fmt.Sprintf(", %.1f GFLOP/s", f/b.t[k].Seconds()/1e9)
		}
		t.Logf("  %-16s %8v per run (%d calls%s)", k, b.t[k]/per, b.n[k]/runs, gf)
	}
}

func TestProfileDecode(t *testing.T) {
	m, tb := loadTimed(t)
	ctx := context.Background()
	steps := 20
	if v, err := strconv.Atoi(os.Getenv("K3_PROFILE_STEPS")); err == nil {
		steps = v
	}
	sizes := []int{1, 8}
	if v, err := strconv.Atoi(os.Getenv("K3_PROFILE_BATCH")); err == nil {
		sizes = []int{v}
	}
	for _, bsz := range sizes {
		bt, _ := m.NewBatch(bsz)
		var ss []*k3.Session
		for i := 0; i < bsz; i++ {
			s, _ := m.NewSession()
			s.Forward(ctx, []int32{1, 2, 3, 4, 5, 6, 7, 8})
			ss = append(ss, s)
		}
		// Distinct tokens per session, as in `k3 bench model`: the same
		// token everywhere would route every row to the same experts.
		toks := make([]int32, bsz)
		feed := func(i int) {
			for j := range toks {
				toks[j] = int32(3 + (i+j*7)%200)
			}
			bt.Step(ctx, ss, toks)
		}
		feed(0) // sizes the batch's scratch
		tb.reset()
		start := time.Now()
		for i := 0; i < steps; i++ {
			feed(i + 1)
		}
		tb.report(t, fmt.Sprintf("decode step, batch %d", bsz), time.Since(start), steps)
	}
}

// TestProfileVerify prints where an 8-token exact pass of one session
// (a verification of 7 drafts) spends its time, beside a single step.
func TestProfileVerify(t *testing.T) {
	m, tb := loadTimed(t)
	ctx := context.Background()
	steps := 20
	if v, err := strconv.Atoi(os.Getenv("K3_PROFILE_STEPS")); err == nil {
		steps = v
	}
	for _, k := range []int{1, 8} {
		s, _ := m.NewSession()
		s.Forward(ctx, []int32{1, 2, 3, 4, 5, 6, 7, 8})
		toks := make([]int32, k)
		feed := func(i int) {
			for j := range toks {
				toks[j] = int32(3 + (i*k+j)%200)
			}
			s.Forward(ctx, toks)
		}
		feed(0)
		tb.reset()
		start := time.Now()
		for i := 0; i < steps; i++ {
			feed(i + 1)
		}
		tb.report(t, fmt.Sprintf("exact pass of %d tokens, one session", k), time.Since(start), steps)
	}
}

// TestProfilePrefill prints where a 512-token prefill of the 100M preset
// spends its time, per backend operation (K3_PROFILE_TOKENS=n: n tokens
// of the same varied pattern instead; K3_PROFILE_CHUNK=n: prefill chunks
// of n tokens instead of 256). With K3_PROFILE_REPEAT=n the
// prompt is one token n times, as the scheduler's long prompt in
// `k3 bench model`; K3_PROFILE_RUNS=n times n prefills (for a CPU
// profile's sake, or a best of n) and reports their mean and the best.
func TestProfilePrefill(t *testing.T) {
	m, tb := loadTimed(t)
	ctx := context.Background()
	n := 512
	if v, err := strconv.Atoi(os.Getenv("K3_PROFILE_TOKENS")); err == nil && v > 0 {
		n = v
	}
	prompt := make([]int32, n)
	for i := range prompt {
		prompt[i] = int32(3 + (i*31)%256)
	}
	if n, err := strconv.Atoi(os.Getenv("K3_PROFILE_REPEAT")); err == nil {
		prompt = m.Encode(strings.Repeat("x", n))
	}
	s, _ := m.NewSession()
	// A whole prefill first: it sizes the scratch and makes the narrow
	// weights' tile copies (K3_KERNEL=amx), which the first long product
	// of each makes.
	s.Forward(ctx, prompt)
	s.Reset()
	s.Forward(ctx, prompt[:16])
	s.Reset()
	runs := 1
	if v, err := strconv.Atoi(os.Getenv("K3_PROFILE_RUNS")); err == nil && v > 0 {
		runs = v
	}
	tb.reset()
	var total, best time.Duration
	for i := range runs {
		s.Reset()
		start := time.Now()
		if _, err := s.Forward(ctx, prompt); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		total += took
		if i == 0 || took < best {
			best = took
		}
	}
	per := total / time.Duration(runs)
	tb.report(t, fmt.Sprintf("prefill of %d tokens (%.0f tokens/s; best of %d %.0f)", len(prompt), float64(len(prompt))/per.Seconds(),
		runs, float64(len(prompt))/best.Seconds()), total, runs)
}

// TestProfileLayouts loads the preset twice in one process, once with
// the weights laid out for this CPU (cpu.New: k-major or AMX tiles where
// they run) and once as stored (cpu.NewStoredLayout: the dot-form tiles
// and the packed GEMM), and alternates them: decode at batch 1 and 8 in
// rounds of 20 steps, then whole 512-token prefills. Each line gives the
// median time of each and the median, least and greatest of the rounds'
// ratios (the first over the second; under 1, the first is faster): a shared
// host's drift hits both alike, which separate runs cannot promise.
// K3_PROFILE_VS names the two backends instead ("go,fast": the exact
// default against the fast bf16 backend; "fast,stored"; one name is
// "go,NAME"), of go (cpu.New), stored (cpu.NewStoredLayout), unpaired
// (cpu.New with PrepareExperts hidden: narrow experts' gate and up apart)
// and fast (cpu.NewFastBF16).
func TestProfileLayouts(t *testing.T) {
	dir := profilePreset(t)
	ctx := context.Background()
	names := [2]string{"go", "stored"}
	if v := os.Getenv("K3_PROFILE_VS"); v != "" {
		a, b, ok := strings.Cut(v, ",")
		if !ok {
			a, b = "go", v
		}
		names = [2]string{a, b}
	}
	var backends [2]compute.Backend
	for i, name := range names {
		switch name {
		case "go":
			backends[i] = cpu.New(0)
		case "stored":
			backends[i] = cpu.NewStoredLayout(0)
		case "fast":
			backends[i] = cpu.NewFastBF16(0)
		case "unpaired":
			backends[i] = unpaired{cpu.New(0)}
		default:
			t.Fatalf("K3_PROFILE_VS: unknown backend %q (go, stored, fast, unpaired)", name)
		}
	}
	var models [2]*k3.Model
	for i, be := range backends {
		m, err := k3.Load(ctx, dir, k3.WithComputeBackend(be))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		models[i] = m
	}
	rounds := 15
	if v, err := strconv.Atoi(os.Getenv("K3_PROFILE_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	// alternate times run(i, round) for both models, rounds+1 times (the
	// first a warm-up), and logs the comparison per of what a round runs.
	alternate := func(what string, per int, run func(i, round int)) {
		var times [2][]float64
		for round := 0; round <= rounds; round++ {
			for i := range models {
				start := time.Now()
				run(i, round)
				if round > 0 {
					times[i] = append(times[i], time.Since(start).Seconds()/float64(per))
				}
			}
		}
		ratios := make([]float64, rounds)
		for r := range ratios {
			ratios[r] = times[0][r] / times[1][r]
		}
		median := func(v []float64) float64 {
			v = append([]float64(nil), v...)
			sort.Float64s(v)
			return v[len(v)/2]
		}
		sort.Float64s(ratios)
		t.Logf("%s: %s %.3f ms, %s %.3f ms; ratio median %.3f (%.3f-%.3f over %d rounds)",
			what, names[0], 1e3*median(times[0]), names[1], 1e3*median(times[1]), median(ratios), ratios[0], ratios[len(ratios)-1], rounds)
	}
	const steps = 20
	for _, bsz := range []int{1, 8} {
		var batches [2]*k3.Batch
		var sessions [2][]*k3.Session
		for i, m := range models {
			batches[i], _ = m.NewBatch(bsz)
			for range bsz {
				s, _ := m.NewSession()
				s.Forward(ctx, []int32{1, 2, 3, 4, 5, 6, 7, 8})
				sessions[i] = append(sessions[i], s)
			}
		}
		toks := make([]int32, bsz)
		alternate(fmt.Sprintf("decode step, batch %d (%d steps a round)", bsz, steps), steps, func(i, round int) {
			for st := range steps {
				for j := range toks {
					toks[j] = int32(3 + (round*steps+st+j*7)%200)
				}
				batches[i].Step(ctx, sessions[i], toks)
			}
		})
		for i := range sessions {
			for _, s := range sessions[i] {
				s.Close()
			}
		}
	}
	prompt := make([]int32, 512)
	for i := range prompt {
		prompt[i] = int32(3 + (i*31)%256)
	}
	alternate("prefill of 512 tokens", 1, func(i, round int) {
		s, _ := models[i].NewSession()
		defer s.Close()
		if _, err := s.Forward(ctx, prompt); err != nil {
			t.Fatal(err)
		}
	})
}
