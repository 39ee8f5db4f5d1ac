// Package modelbench measures a whole model: prefill, decode at batch 1
// and 8, and decode against the bandwidth roofline. It is shared by `k3
// bench model` and the go test benchmark of package k3.
package modelbench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"k3/config"
	"k3/internal/kernel"
	"k3/internal/tiny"
	"k3/k3"
)

// ModelResult holds `k3 bench model`'s figures.
type ModelResult struct {
	Preset                string // the tiny preset measured
	Backend               string // "go" or "go-fastbf16"
	Params                int64
	WeightBytes           int64
	PrefillTokens         int
	PrefillTokPerSec      float64 // warm: the best of three prefills after the first
	FirstPrefillTokPerSec float64 // the first prefill after Load (weights faulted in)
	Decode1TokPerSec      float64
	Decode8TokPerSec      float64 // aggregate over the batch
	StepBytes             float64 // bytes one batch-1 decode step must read
	Step8Bytes            float64 // the same for batch 8 (load-balanced routing estimate)
	Bandwidth             float64 // median of max(read, triad) probed next to the decode stretches
	RooflineShare         float64 // batch-1 decode time at that bandwidth / measured (median over stretches)
	NTRooflineShare       float64 // the same against a triad with non-temporal stores
	Batch8Gain            float64 // batch-8 throughput / batch-1 (median over neighbouring stretches)
	// Verify8Ratio is the time of one session's 8-token exact pass (a
	// verification of 7 drafts plus the bonus position) over a batch-1
	// decode step, median over neighbouring stretches.
	Verify8Ratio float64
	// The verification pass's bound: it reads VerifyBytes (the experts its
	// 8 tokens route to, load-balanced estimate, and the state once) and
	// does VerifyFLOPs of products (2 per active parameter and token);
	// VerifyBoundRatio is the larger of bytes over the probed bandwidth
	// and arithmetic over the probed FMA peak, over the batch-1 step's
	// bytes over the bandwidth: the lowest Verify8Ratio this machine
	// allows a pass and a step that both run at their bounds.
	// VerifyShare is that bound over the pass's measured time.
	VerifyBytes, VerifyFLOPs, Peak float64
	VerifyBoundRatio, VerifyShare  float64
	// Each decode step's bound, the larger of its bytes over the probed
	// bandwidth and its products' arithmetic (2 per active parameter and
	// token) over the peak of the FMAs they issue: Peak (256-bit) for a
	// single row's stream kernels, Peak8 for products of 8 rows (the
	// 512-bit peak where the 2x8 tiles run on zmm registers, the AMX
	// exact product's ceiling with K3_KERNEL=amx, else Peak; named by
	// Path8; the verification pass's bound uses it too). Step1Share and
	// Step8Share are the bound over the measured step (medians over
	// stretches); Ceiling8 is the batch-8 aggregate tokens/s at the bound.
	Peak8                                                    float64
	Path8                                                    string
	Step1Bound, Step8Bound, Step1Share, Step8Share, Ceiling8 float64
	// Step8Parts is the batch-8 step's bound with its parts one after
	// another rather than overlapped: the products of the weights every
	// token reads at the larger of their bytes' and their arithmetic's
	// time, then the experts' likewise, then the KDA states' bytes.
	// Step8PartsShare is it over the measured step (medians over
	// stretches). Where the weights every token reads are compute-bound at
	// 8 rows and the experts memory-bound (exact products on a CPU whose
	// FMA peak feeds fewer bytes than its memory), Step8Bound holds only
	// if the two overlap.
	Step8Parts, Step8PartsShare float64
	// PrefillFLOPs is a token's products in prefill, 2 per active
	// parameter (attention over the prompt not counted); PrefillPeak the
	// peak of the products on this path, named by PrefillPath (the FMA
	// peak of the packed GEMM's tile, or the AMX exact product's ceiling).
	PrefillFLOPs, PrefillPeak float64
	PrefillPath               string
	// Truncate's costs at position TruncateAt, in decode steps at that
	// position, on a model loaded with WithRollback(TruncateDepth): back
	// TruncateShort tokens and back 100; and back 100 without logs (the
	// default: a rebuild). TruncateStateBytes is a session's state there.
	TruncateAt, TruncateShort, TruncateDepth                    int
	TruncateShortSteps, Truncate100Steps, Truncate100NoLogSteps float64
	TruncateStateBytes                                          int64
	// Truncate100SnapSteps is back 100 on a model with snapshots every
	// TruncateSnapInterval tokens (the newest 8 kept) and no logs.
	TruncateSnapInterval   int
	Truncate100SnapSteps   float64
	TruncateSnapStateBytes int64
	StateBytesPerSession   int64
	// Schedule holds a long prompt arriving beside 8 streams, at four
	// chunk sizes: the trade between their latency and its first token.
	Schedule []*ScheduleResult
	Chat     *ChatResult
	// The model's memory ledger before and after 1,000 sessions, each
	// prefilled, forked, both decoded a token, and closed.
	LedgerBefore, LedgerAfter, LedgerPeak int64
	// RSSGrowth is how much the process's resident memory grew from before
	// Load to after the first prefill (weights mapped and touched, load-time
	// copies, one session and its scratch); 0 where /proc is missing.
	RSSGrowth int64
}

// backendOptions returns the load options for a backend name of Run's.
func backendOptions(backend string) ([]k3.Option, error) {
	switch backend {
	case "", "go":
		return nil, nil
	case "go-fastbf16":
		return []k3.Option{k3.WithBackend(backend)}, nil
	}
	return nil, fmt.Errorf("modelbench: backend %q: want go or go-fastbf16", backend)
}

func backendName(backend string) string {
	if backend == "" {
		return "go"
	}
	return backend
}

// rss returns the process's resident set size from /proc/self/statm, or 0.
func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, resident int64
	if _, err := fmt.Sscan(string(b), &size, &resident); err != nil {
		return 0
	}
	return resident * int64(os.Getpagesize())
}

// stepBytes estimates what one decode step of batch sessions reads: every
// weight except the embedding table and the experts no token of the batch
// routes to, plus each session's KDA state, read and written. At batch 1
// that is the top-k experts of every MoE layer; for a batch it is the
// expected number of distinct experts among batch·k uniform picks
// (E·(1 − (1 − k/E)^batch)), the load-balanced case. The DSA layers'
// cache reads are left out: at the tens to low hundreds of positions the
// decode stretches run at, under 1% of a step on either preset (the 100M
// preset's batch-8 sessions read about 1.6 MB of latent and rope rows a
// step against its 198 MB).
func stepBytes(cfg *config.Config, weightBytes, stateBytes int64, batch int) float64 {
	p := stepParts(cfg, weightBytes, stateBytes, batch)
	return p.dense + p.experts + p.state
}

// parts is a decode step's bytes by kind, and the arithmetic of its
// expert products.
type parts struct {
	dense   float64 // weights every token reads (bf16)
	experts float64 // the routed experts' weights the batch reads
	state   float64 // the sessions' KDA states, read and written
	// expertFLOPs is the routed experts' products: 2 per weight and
	// routed token.
	expertFLOPs float64
}

// stepParts splits stepBytes' estimate by kind.
func stepParts(cfg *config.Config, weightBytes, stateBytes int64, batch int) parts {
	var p parts
	total := float64(weightBytes)
	if cfg.MoE != nil {
		// Expert tensors of one layer: NumExperts × 3 matrices.
		din := cfg.HiddenSize
		if cfg.MoE.LatentSize > 0 {
			din = cfg.MoE.LatentSize
		}
		per := float64(3*din*cfg.MoE.IntermediateSize) * 2 // bf16
		moeLayers := 0
		for l := range cfg.Layers {
			if cfg.IsMoELayer(l) {
				moeLayers++
			}
		}
		e, k := float64(cfg.MoE.NumExperts), float64(cfg.MoE.TopK)
		active := k
		if batch > 1 {
			active = e * (1 - math.Pow(1-k/e, float64(batch)))
		}
		total -= per * float64(moeLayers) * e
		p.experts = per * float64(moeLayers) * active
		p.expertFLOPs = per * float64(moeLayers) * k * float64(batch)
	}
	// The embedding table is read one row per token.
	if !cfg.TieWordEmbeddings {
		total -= float64(cfg.VocabSize*cfg.HiddenSize) * 2
	}
	p.dense = total
	p.state = 2 * float64(batch) * float64(stateBytes)
	return p
}

// bound is the step's time at the bandwidth bw and the peak with its
// parts one after another: the weights every token reads and the experts
// each at the larger of their bytes' and their products' time (2 FLOPs a
// weight and row: rows·bytes for bf16 weights), then the states' bytes.
func (p parts) bound(rows int, bw, peak float64) float64 {
	return max(p.dense/bw, float64(rows)*p.dense/peak) + max(p.experts/bw, p.expertFLOPs/peak) + p.state/bw
}

// writePreset writes a preset's random-weight checkpoint (bf16) into a
// new temporary directory, which the caller removes.
func writePreset(preset string, log func(string)) (string, error) {
	dir, err := os.MkdirTemp("", "k3-bench-")
	if err != nil {
		return "", err
	}
	log(fmt.Sprintf("writing the %s random-weight checkpoint (bf16)...", preset))
	if err := tiny.Write(dir, preset, tiny.Options{Seed: 1, BF16: true}); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	// The kernel would otherwise write the new file back while decode is
	// timed, taking memory bandwidth and a core's time from it.
	if err := syncFiles(dir); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// syncFiles flushes every regular file in dir to its storage device.
func syncFiles(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("modelbench: flushing %s: %w", e.Name(), err)
		}
	}
	return nil
}

// RunLarge measures the ~1B-parameter preset k31pro-1b, whose decode step
// reads about 1.3 GB, several times any CPU's last-level cache, so that its
// roofline share is against memory alone (the 100M preset's 110 MB step
// is partly served from a large L3): prefill, decode at batch 1 and 8,
// the verification pass and their bounds. The checkpoint is about 1.9 GB
// on disk in a temporary directory. backend is as Run's.
func RunLarge(ctx context.Context, backend string, log func(string)) (*ModelResult, error) {
	opts, err := backendOptions(backend)
	if err != nil {
		return nil, err
	}
	const preset = "k31pro-1b"
	dir, err := writePreset(preset, log)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	debug.FreeOSMemory()
	rss0 := rss()
	m, err := k3.Load(ctx, dir, opts...)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	r := &ModelResult{Preset: preset, Backend: backendName(backend), Params: m.Config.NumParams(), WeightBytes: m.WeightBytes()}
	r.PrefillTokens = 256
	prompt := make([]int32, r.PrefillTokens)
	for i := range prompt {
		prompt[i] = int32(3 + (i*31)%256)
	}
	log("prefill...")
	for i := range 3 {
		s, err := m.NewSession()
		if err != nil {
			return nil, err
		}
		start := time.Now()
		if _, err := s.Forward(ctx, prompt); err != nil {
			return nil, err
		}
		tps := float64(len(prompt)) / time.Since(start).Seconds()
		if i == 0 {
			r.FirstPrefillTokPerSec = tps
			if r1 := rss(); rss0 > 0 && r1 > rss0 {
				r.RSSGrowth = r1 - rss0
			}
		} else {
			r.PrefillTokPerSec = max(r.PrefillTokPerSec, tps)
		}
		s.Close()
	}
	log("decode, batch 1 and 8, between bandwidth probes...")
	if err := decodeFigures(ctx, m, prompt, r, 5); err != nil {
		return nil, err
	}
	return r, nil
}

// Run builds the ~100M-parameter K3.1 Pro-shaped checkpoint (bf16), then
// times prefill, decode at batch 1 and at batch 8, on the named backend:
// "go" (or "") or "go-fastbf16", the opt-in fast bf16 products.
func Run(ctx context.Context, backend string, log func(string)) (*ModelResult, error) {
	opts, err := backendOptions(backend)
	if err != nil {
		return nil, err
	}
	dir, err := writePreset("k31pro-100m", log)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	debug.FreeOSMemory() // the writer's garbage must not count, or hide, the model's memory
	rss0 := rss()
	m, err := k3.Load(ctx, dir, opts...)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	r := &ModelResult{Preset: "k31pro-100m", Backend: backendName(backend), Params: m.Config.NumParams(), WeightBytes: m.WeightBytes()}
	// Prefill.
	r.PrefillTokens = 512
	prompt := make([]int32, r.PrefillTokens)
	for i := range prompt {
		prompt[i] = int32(3 + (i*31)%256)
	}
	s, err := m.NewSession()
	if err != nil {
		return nil, err
	}
	log("prefill...")
	// The first prefill also faults the mapped weights in; it is reported
	// apart from the steady state, the best of three more on new sessions,
	// each closed after it as a server closes its requests' sessions (the
	// next takes the closed one's KDA states rather than fresh memory).
	start := time.Now()
	if _, err := s.Forward(ctx, prompt); err != nil {
		return nil, err
	}
	r.FirstPrefillTokPerSec = float64(len(prompt)) / time.Since(start).Seconds()
	r.StateBytesPerSession = s.StateBytes()
	if r0, r1 := rss0, rss(); r0 > 0 && r1 > r0 {
		r.RSSGrowth = r1 - r0
	}
	for range 3 {
		sw, err := m.NewSession()
		if err != nil {
			return nil, err
		}
		start = time.Now()
		if _, err := sw.Forward(ctx, prompt); err != nil {
			return nil, err
		}
		r.PrefillTokPerSec = max(r.PrefillTokPerSec, float64(len(prompt))/time.Since(start).Seconds())
		sw.Close()
	}

	log("decode, batch 1 and 8, between bandwidth probes...")
	if err := decodeFigures(ctx, m, prompt, r, 9); err != nil {
		return nil, err
	}
	if err := truncateCost(ctx, m, dir, r, log, opts); err != nil {
		return nil, err
	}
	log("1,000 forked and closed sessions...")
	if err := churn(ctx, m, r); err != nil {
		return nil, err
	}
	log("chat: two turns with the prefix cache...")
	if r.Chat, err = Chat(ctx, dir, 1000, 64, 24, opts...); err != nil {
		return nil, err
	}
	for _, chunk := range []int{8, 16, 20, 24, 32} {
		log(fmt.Sprintf("scheduler: 8 streams and a 4,096-token prompt in chunks of %d...", chunk))
		sr, err := Schedule(ctx, m, 8, 4096, chunk)
		if err != nil {
			return nil, err
		}
		r.Schedule = append(r.Schedule, sr)
	}
	return r, nil
}

// truncateCost times Truncate on a session at about 2,000 positions
// against decode steps at that position: on m (no logs) back 100, and on
// the same checkpoint loaded with WithRollback back 10 and back 100.
func truncateCost(ctx context.Context, m *k3.Model, dir string, r *ModelResult, log func(string), opts []k3.Option) error {
	log("truncate at 2,000 positions...")
	r.TruncateAt, r.TruncateShort, r.TruncateDepth = 2000, 10, 128
	hist := make([]int32, r.TruncateAt)
	for i := range hist {
		hist[i] = int32(3 + (i*37)%250)
	}
	plain, err := m.NewSession()
	if err != nil {
		return err
	}
	if _, err := plain.Forward(ctx, hist); err != nil {
		return err
	}
	start := time.Now()
	if err := plain.Truncate(ctx, plain.Len()-100); err != nil {
		return err
	}
	rebuild := time.Since(start).Seconds()
	mr, err := k3.Load(ctx, dir, append(opts, k3.WithRollback(r.TruncateDepth))...)
	if err != nil {
		return err
	}
	defer mr.Close()
	s, err := mr.NewSession()
	if err != nil {
		return err
	}
	if _, err := s.Forward(ctx, hist[:r.TruncateAt-200]); err != nil {
		return err
	}
	for _, tok := range hist[r.TruncateAt-200 : r.TruncateAt-40] { // records for the last 200 positions
		if _, err := s.Forward(ctx, []int32{tok}); err != nil {
			return err
		}
	}
	var steps []float64
	for _, tok := range hist[r.TruncateAt-40:] {
		start := time.Now()
		if _, err := s.Forward(ctx, []int32{tok}); err != nil {
			return err
		}
		steps = append(steps, time.Since(start).Seconds())
	}
	step := median(steps)
	var short []float64
	for range 5 {
		start := time.Now()
		if err := s.Truncate(ctx, s.Len()-r.TruncateShort); err != nil {
			return err
		}
		short = append(short, time.Since(start).Seconds()/step)
		for _, tok := range hist[s.Len():] {
			if _, err := s.Forward(ctx, []int32{tok}); err != nil {
				return err
			}
		}
	}
	r.TruncateShortSteps = median(short)
	r.TruncateStateBytes = s.StateBytes()
	start = time.Now()
	if err := s.Truncate(ctx, s.Len()-100); err != nil {
		return err
	}
	r.Truncate100Steps = time.Since(start).Seconds() / step
	r.Truncate100NoLogSteps = rebuild / step

	r.TruncateSnapInterval = 64
	ms, err := k3.Load(ctx, dir, append(opts, k3.WithSnapshots(r.TruncateSnapInterval, 8))...)
	if err != nil {
		return err
	}
	defer ms.Close()
	ss, err := ms.NewSession()
	if err != nil {
		return err
	}
	for c := 0; c < r.TruncateAt; c += 64 { // a chat's turns, so snapshots land where they would
		if _, err := ss.Forward(ctx, hist[c:min(c+64, r.TruncateAt)]); err != nil {
			return err
		}
	}
	r.TruncateSnapStateBytes = ss.StateBytes()
	start = time.Now()
	if err := ss.Truncate(ctx, ss.Len()-100); err != nil {
		return err
	}
	r.Truncate100SnapSteps = time.Since(start).Seconds() / step
	return nil
}

// decodeFigures measures decode at batch 1 and 8, the 8-token
// verification pass and their bounds on m into r, over stretches
// alternating with bandwidth probes. Its probe pool also measures the FMA
// peaks, so it sets the peak prefill's share is taken of as well.
func decodeFigures(ctx context.Context, m *k3.Model, prompt []int32, r *ModelResult, stretches int) error {
	// A shared host's bandwidth drifts from one second to the next (by up
	// to 2x on the machines in docs/bench), so the decode runs in short stretches, alternating batch 1
	// and batch 8, each batch-1 stretch between a read pass and a STREAM
	// triad (and a triad with non-temporal stores, reported beside it);
	// every figure is the median over the stretches of a ratio between
	// neighbours: a stretch's time against the bandwidth probed next to it,
	// batch 8 against the batch-1 stretch before it.
	probe := kernel.NewPool(0)
	defer probe.Close()
	const n = 64 << 20
	pa, pb, pc := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range pb {
		pb[i], pc[i] = 1, 2
	}
	s1, _ := m.NewSession()
	if _, err := s1.Forward(ctx, prompt[:32]); err != nil {
		return err
	}
	bt, err := m.NewBatch(8)
	if err != nil {
		return err
	}
	var ss []*k3.Session
	for i := 0; i < 8; i++ {
		si, _ := m.NewSession()
		if _, err := si.Forward(ctx, prompt[i:i+32]); err != nil {
			return err
		}
		ss = append(ss, si)
	}
	toks := make([]int32, 8)
	step1 := func(i int) error {
		_, err := s1.Forward(ctx, []int32{int32(3 + i%200)})
		return err
	}
	step8 := func(i int) error {
		for j := range toks {
			toks[j] = int32(3 + (i+j)%200)
		}
		return bt.Step(ctx, ss, toks)
	}
	// The verification pass runs on a session of its own, which grows by 8
	// tokens a pass (a few hundred positions over the run: attention's
	// share stays small).
	sv, _ := m.NewSession()
	if _, err := sv.Forward(ctx, prompt[:32]); err != nil {
		return err
	}
	vtoks := make([]int32, 8)
	verify8 := func(i int) error {
		for j := range vtoks {
			vtoks[j] = int32(3 + (i*8+j)%200)
		}
		_, err := sv.Forward(ctx, vtoks)
		return err
	}
	// One untimed step each sizes the scratch; the timed steps are the
	// steady state.
	if err := step1(0); err != nil {
		return err
	}
	if err := step8(0); err != nil {
		return err
	}
	if err := verify8(0); err != nil {
		return err
	}
	timed := func(steps, from int, step func(int) error) (float64, error) {
		start := time.Now()
		for i := from; i < from+steps; i++ {
			if err := step(i); err != nil {
				return 0, err
			}
		}
		return time.Since(start).Seconds() / float64(steps), nil
	}
	state := stateKDABytes(s1)
	r.StepBytes = stepBytes(m.Config, r.WeightBytes, state, 1)
	r.Step8Bytes = stepBytes(m.Config, r.WeightBytes, state, 8)
	// One sequence's 8 tokens read its state once (a layer's state stays
	// in cache from token to token) and, token for token, multiply by the
	// weights a batch-1 step reads.
	r.VerifyBytes = r.Step8Bytes - 2*7*float64(state)
	r.VerifyFLOPs = 8 * (r.StepBytes - 2*float64(state))
	r.Peak = probe.PeakFLOPS()
	// Prefill's projections run the k-major tiles' 512-bit FMAs where the
	// path has them (kernel.KMajorFast), else the packed GEMM, on 512-bit
	// FMAs where they run at full width (kernel.WideFMA).
	r.PrefillPeak, r.PrefillPath = r.Peak, "256-bit FMA peak"
	if kernel.WideFMA() || kernel.KMajorFast() {
		r.PrefillPeak, r.PrefillPath = probe.PeakWideFLOPS(), "512-bit FMA peak"
	}
	r.Peak8, r.Path8 = r.PrefillPeak, r.PrefillPath
	if r.Backend == "go-fastbf16" && kernel.FastBF16Pays() && !kernel.AMXAvailable() {
		// Every product of a laid-out weight runs VDPBF16PS over x
		// rounded to bf16 (cpu.NewFastBF16).
		r.PrefillPeak, r.PrefillPath = probe.PeakBF16DotFLOPS(), "VDPBF16PS peak (x rounded to bf16)"
		r.Peak8, r.Path8 = r.PrefillPeak, r.PrefillPath
	}
	if kernel.AMXAvailable() {
		// Prefill's products run on the tiles: the exact product runs
		// three tile products per weight tile. Decode batches' products
		// run there only with the weights laid out for the tiles.
		r.PrefillPeak, r.PrefillPath = probe.PeakAMXFLOPS()/3, "AMX exact-product ceiling (a third of the probed tile peak)"
		if kernel.AMXPreferred() {
			r.Peak8, r.Path8 = r.PrefillPeak, r.PrefillPath
		}
	}
	r.PrefillFLOPs = r.StepBytes - 2*float64(state)
	const steps = 12
	var tok1, tok8, gain, share, shareNT, bws, verify, vbound, vshare []float64
	var bound1, bound8, share1, share8, parts8, partsShare8 []float64
	step8Parts := stepParts(m.Config, r.WeightBytes, state, 8)
	for k := 0; k < stretches; k++ {
		rd := probe.ReadBandwidth(pb, 1)
		dt1, err := timed(steps, k*steps, step1)
		if err != nil {
			return err
		}
		tr := probe.Triad(pa, pb, pc, 1)
		nt := probe.TriadNT(pa, pb, pc, 1)
		dt8, err := timed(steps/2, k*steps, step8)
		if err != nil {
			return err
		}
		dtv, err := timed(steps/4, k*steps, verify8)
		if err != nil {
			return err
		}
		verify = append(verify, dtv/dt1)
		bw := max(rd, tr)
		if r.Peak > 0 {
			bound := max(r.VerifyBytes/bw, r.VerifyFLOPs/r.Peak8)
			vbound, vshare = append(vbound, bound/(r.StepBytes/bw)), append(vshare, bound/dtv)
			// A step of b tokens multiplies each by every weight it
			// reads: 2 FLOPs per weight (2 bytes in bf16) and token.
			b1 := max(r.StepBytes/bw, (r.StepBytes-2*float64(state))/r.Peak)
			b8 := max(r.Step8Bytes/bw, r.VerifyFLOPs/r.Peak8)
			bound1, bound8 = append(bound1, b1), append(bound8, b8)
			share1, share8 = append(share1, b1/dt1), append(share8, b8/dt8)
			p8 := step8Parts.bound(8, bw, r.Peak8)
			parts8, partsShare8 = append(parts8, p8), append(partsShare8, p8/dt8)
		}
		tok1, tok8, gain = append(tok1, 1/dt1), append(tok8, 8/dt8), append(gain, 8*dt1/dt8)
		share, shareNT, bws = append(share, r.StepBytes/bw/dt1), append(shareNT, r.StepBytes/nt/dt1), append(bws, bw)
	}
	r.Decode1TokPerSec, r.Decode8TokPerSec, r.Batch8Gain = median(tok1), median(tok8), median(gain)
	r.RooflineShare, r.NTRooflineShare, r.Bandwidth = median(share), median(shareNT), median(bws)
	r.Verify8Ratio = median(verify)
	if len(vbound) > 0 {
		r.VerifyBoundRatio, r.VerifyShare = median(vbound), median(vshare)
		r.Step1Bound, r.Step8Bound = median(bound1), median(bound8)
		r.Step1Share, r.Step8Share = median(share1), median(share8)
		r.Ceiling8 = 8 / r.Step8Bound
		r.Step8Parts, r.Step8PartsShare = median(parts8), median(partsShare8)
	}
	return nil
}

// stateKDABytes is the session's recurrent state (read and written each step).
func stateKDABytes(s *k3.Session) int64 { return s.KDAStateBytes() }

// Table formats the result.
func (r *ModelResult) Table() string {
	var b strings.Builder
	r.head(&b)
	r.tail(&b)
	return b.String()
}

// LargeTable formats RunLarge's result: prefill, decode and their bounds.
func (r *ModelResult) LargeTable() string {
	var b strings.Builder
	r.head(&b)
	r.rssLine(&b)
	return b.String()
}

// head writes the preset's line, prefill, decode and the bounds.
func (r *ModelResult) head(b *strings.Builder) {
	fmt.Fprintf(b, "k3 bench model: K3.1 Pro-shaped preset %s (%.1fM parameters, bf16 weights %.1f MB), %s backend\n",
		r.Preset, float64(r.Params)/1e6, float64(r.WeightBytes)/1e6, r.Backend)
	fmt.Fprintf(b, "  prefill (%d tokens):        %8.1f tokens/s  (the first after Load, faulting the weights in: %.1f)\n", r.PrefillTokens, r.PrefillTokPerSec, r.FirstPrefillTokPerSec)
	if r.PrefillPeak > 0 {
		fmt.Fprintf(b, "    kernel path %s: %.1f GFLOP/s of products (%.0f MFLOP a token, 2 per active parameter), %.0f%% of the %.0f GFLOP/s %s\n",
			kernel.Path(), r.PrefillTokPerSec*r.PrefillFLOPs/1e9, r.PrefillFLOPs/1e6, 100*r.PrefillTokPerSec*r.PrefillFLOPs/r.PrefillPeak, r.PrefillPeak/1e9, r.PrefillPath)
	}
	fmt.Fprintf(b, "  decode, batch 1:            %8.1f tokens/s  (%.1f MB read per step; %.0f%% of the roofline at %.1f GB/s, the higher of a read pass and a STREAM triad next to each stretch; %.0f%% against a triad with non-temporal stores)\n",
		r.Decode1TokPerSec, r.StepBytes/1e6, 100*r.RooflineShare, r.Bandwidth/1e9, 100*r.NTRooflineShare)
	fmt.Fprintf(b, "  decode, batch 8 (aggregate): %7.1f tokens/s  (%.2fx batch 1, stretch by stretch; a step reads about %.1f MB, so a batch-8 step as bandwidth-efficient as batch 1 gains at most %.2fx)\n",
		r.Decode8TokPerSec, r.Batch8Gain, r.Step8Bytes/1e6, 8*r.StepBytes/r.Step8Bytes)
	if r.Step8Bound > 0 {
		fmt.Fprintf(b, "  decode bounds (the larger of bytes at the probed bandwidth and products at the peak of the FMAs they issue): batch 1 %.2f ms a step (%.1f MB or %.2f GFLOP at the %.0f GFLOP/s 256-bit peak), the step at %.0f%% of it; batch 8 %.2f ms (%.1f MB or %.2f GFLOP at the %.0f GFLOP/s %s), a ceiling of %.0f tokens/s, the step at %.0f%% of it\n",
			1e3*r.Step1Bound, r.StepBytes/1e6, r.VerifyFLOPs/8e9, r.Peak/1e9, 100*r.Step1Share, 1e3*r.Step8Bound, r.Step8Bytes/1e6, r.VerifyFLOPs/1e9, r.Peak8/1e9, r.Path8, r.Ceiling8, 100*r.Step8Share)
	}
	if r.Step8Parts > 0 {
		fmt.Fprintf(b, "    batch 8 with its parts one after another (the weights every token reads, then the experts, each at the larger of its bytes' and its products' time, then the KDA states' bytes): %.2f ms, the step at %.0f%% of it (the bound above holds only where those parts overlap)\n",
			1e3*r.Step8Parts, 100*r.Step8PartsShare)
	}
	fmt.Fprintf(b, "  verification pass, 8 tokens of one session: %.1fx a batch-1 decode step (weights read once; the 8 tokens route to more experts, about %.1f MB read against %.1f)\n",
		r.Verify8Ratio, r.VerifyBytes/1e6, r.StepBytes/1e6)
	if r.VerifyBoundRatio > 0 {
		fmt.Fprintf(b, "    its bound: %.1fx a batch-1 step's (the larger of %.1f MB at the probed bandwidth and %.2f GFLOP at the %.0f GFLOP/s %s); the pass runs at %.0f%% of its bound\n",
			r.VerifyBoundRatio, r.VerifyBytes/1e6, r.VerifyFLOPs/1e9, r.Peak8/1e9, r.Path8, 100*r.VerifyShare)
	}
}

// tail writes the 100M preset's figures past decode: rollback, the
// scheduler, the prefix cache and memory.
func (r *ModelResult) tail(b *strings.Builder) {
	fmt.Fprintf(b, "  truncate at %d positions, WithRollback(%d): back %d tokens %.1f decode steps, back 100 tokens %.1f (replayed from the KDA logs; state per session %.1f MB); without logs (the default) back 100 tokens %.0f decode steps (the kept tokens are prefilled again)\n",
		r.TruncateAt, r.TruncateDepth, r.TruncateShort, r.TruncateShortSteps, r.Truncate100Steps, float64(r.TruncateStateBytes)/1e6, r.Truncate100NoLogSteps)
	fmt.Fprintf(b, "  truncate at %d positions, WithSnapshots(%d, 8) and no logs: back 100 tokens %.1f decode steps (the newest snapshot before the cut, then up to %d tokens again; state per session %.1f MB)\n",
		r.TruncateAt, r.TruncateSnapInterval, r.Truncate100SnapSteps, r.TruncateSnapInterval, float64(r.TruncateSnapStateBytes)/1e6)
	if len(r.Schedule) > 0 {
		b.WriteString(DamonNote())
	}
	for _, sr := range r.Schedule {
		b.WriteString(sr.Line())
	}
	if r.Chat != nil {
		b.WriteString(r.Chat.Line())
	}
	fmt.Fprintf(b, "  sequence state: the memory ledger holds %.1f MB before and %.1f MB after 1,000 sessions were prefilled, forked, decoded and closed (%.1f MB at the peak, one session and its fork)\n",
		float64(r.LedgerBefore)/1e6, float64(r.LedgerAfter)/1e6, float64(r.LedgerPeak)/1e6)
	fmt.Fprintf(b, "  memory: weights %.1f MB in the checkpoint + %.2f MB state per session (after a 512-token prompt)\n",
		float64(r.WeightBytes)/1e6, float64(r.StateBytesPerSession)/1e6)
	r.rssLine(b)
}

// rssLine writes how much the process's resident memory grew over Load
// and the first prefill.
func (r *ModelResult) rssLine(b *strings.Builder) {
	if r.RSSGrowth > 0 {
		fmt.Fprintf(b, "  process RSS grew %.1f MB from before Load to after the first prefill (weights touched, load-time copies, one pass's scratch)\n",
			float64(r.RSSGrowth)/1e6)
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// churn opens 1,000 sessions one after another, each prefilled with 16
// tokens and forked, decodes a token in both, and closes them.
func churn(ctx context.Context, m *k3.Model, r *ModelResult) error {
	// The ledger counts the KDA states that closed sessions leave for new
	// ones (a few sessions' worth at most): one round first fills that
	// list as the loop will, so that before and after compare like with
	// like and a leak shows.
	for i := range 1001 {
		if i == 1 {
			r.LedgerBefore = m.MemoryUsage().Used
		}
		s, err := m.NewSession()
		if err != nil {
			return err
		}
		prompt := make([]int32, 16)
		for j := range prompt {
			prompt[j] = int32(3 + (i+j)%200)
		}
		if _, err := s.Forward(ctx, prompt); err != nil {
			return err
		}
		f, err := s.Clone()
		if err != nil {
			return err
		}
		for _, x := range []*k3.Session{s, f} {
			if _, err := x.Forward(ctx, []int32{int32(3 + i%100)}); err != nil {
				return err
			}
		}
		r.LedgerPeak = max(r.LedgerPeak, m.MemoryUsage().Used)
		f.Close()
		s.Close()
	}
	r.LedgerAfter = m.MemoryUsage().Used
	return nil
}
