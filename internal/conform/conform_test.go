package conform

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"k3/ascend"
	"k3/compute"
	"k3/internal/cpu"
	"k3/internal/safetensors"
)

func runAll(t *testing.T, roots ...string) []Result {
	t.Helper()
	cases, err := Discover(roots...)
	if err != nil {
		t.Fatal(err)
	}
	b := cpu.New(2)
	defer b.Close()
	var out []Result
	for r := range Run(context.Background(), b, cases) {
		out = append(out, r)
	}
	return out
}

// TestImplementedAreas runs the areas whose ops the go backend implements;
// each later area joins this list when it lands. Under the race detector
// the random layouts of testdata/configs are left to the plain runs and
// to CI's k3 conform lines: they run the same code as the goldens, whose
// cases the race run keeps.
func TestImplementedAreas(t *testing.T) {
	areas := []string{"attnres", "configs", "dsa", "kda", "model", "moe"}
	if raceEnabled {
		areas = slices.DeleteFunc(areas, func(a string) bool { return a == "configs" })
	}
	for _, area := range areas {
		res := runAll(t, filepath.Join("../../testdata", area))
		if len(res) == 0 {
			t.Fatalf("%s: no cases", area)
		}
		for _, r := range res {
			if !r.Pass {
				t.Error(r)
			}
		}
	}
}

func TestDiscoverFindsEveryArea(t *testing.T) {
	cases, err := Discover("../../testdata")
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]int{}
	for _, c := range cases {
		if c.Err != nil {
			t.Errorf("%s: %v", c.Path, c.Err)
		}
		ops[c.Op]++
	}
	// model.forward: the four goldens of testdata/model and the twenty
	// layouts of testdata/configs.
	if ops["model.forward"] != 24 || ops["kda.core"] != 2 || ops["moe.router"] != 5 || ops["dsa.indexer"] != 1 {
		t.Errorf("ops found: %v", ops)
	}
}

// TestDetectsWrongValues corrupts one expected value of a golden file and
// checks that the runner fails the case, and that unreadable or truncated
// files and unknown ops fail with a reason instead of crashing.
func TestDetectsWrongValues(t *testing.T) {
	dir := t.TempDir()
	src := "../../testdata/moe/router_negbias_e16_k4_g4_tg2.safetensors"
	f, err := safetensors.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	var tensors []safetensors.Tensor
	for _, ti := range f.Tensors() {
		b, _, _ := f.Bytes(ti.Name)
		data := append([]byte(nil), b...)
		if ti.Name == "topk_weight" {
			data[0] ^= 0x10 // perturb the lowest mantissa byte... of one weight
			data[2] ^= 0x40
		}
		tensors = append(tensors, safetensors.Tensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Data: data})
	}
	meta := f.Metadata()
	f.Close()
	if err := safetensors.WriteFile(filepath.Join(dir, "bad_weight.safetensors"), tensors, meta); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(src)
	os.WriteFile(filepath.Join(dir, "truncated.safetensors"), raw[:len(raw)/2], 0o644)
	os.WriteFile(filepath.Join(dir, "garbage.safetensors"), []byte("not a tensor file"), 0o644)
	meta2 := map[string]string{"op": "no.such_op"}
	safetensors.WriteFile(filepath.Join(dir, "unknown.safetensors"), nil, meta2)
	// A model case without its checkpoint fails in its handler, before
	// anything is compared.
	exp, err := os.ReadFile("../../testdata/model/tiny_k31pro/expected.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "nockpt"), 0o755)
	os.WriteFile(filepath.Join(dir, "nockpt", "expected.safetensors"), exp, 0o644)

	res := runAll(t, dir)
	if len(res) != 5 {
		t.Fatalf("%d results: %v", len(res), res)
	}
	for _, r := range res {
		if r.Pass {
			t.Errorf("%s passed", r.Path)
		}
		if r.Reason == "" {
			t.Errorf("%s: no reason", r.Path)
		}
		// Figures only where something was compared: not for a case that
		// could not be read or run.
		line := r.String()
		compared := strings.HasSuffix(r.Path, "bad_weight.safetensors")
		if strings.Contains(line, "max_abs_err=") != compared {
			t.Errorf("report line %q: figures shown %v, want %v", line, !compared, compared)
		}
		if strings.HasSuffix(r.Path, "unknown.safetensors") && !strings.Contains(r.Reason, "unsupported op") {
			t.Errorf("unknown op reason: %s", r.Reason)
		}
		if strings.Contains(r.Path, "nockpt") && !strings.Contains(r.Reason, filepath.Join(dir, "nockpt", "config.json")) {
			t.Errorf("a model case without its checkpoint: reason %q does not name its config.json", r.Reason)
		}
		if strings.HasSuffix(r.Path, "bad_weight.safetensors") && !strings.Contains(r.Reason, "topk_weight") {
			t.Errorf("corrupted weight reason: %s", r.Reason)
		}
	}
}

// TestModelMinimalCase: a model case holding only input_ids,
// prefill_logits, generated_ids, decode_positions and decode_logits
// passes; one whose decode logits are wrong fails.
func TestModelMinimalCase(t *testing.T) {
	src := "../../testdata/model/tiny_k31pro"
	f, err := safetensors.Open(filepath.Join(src, "expected.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	var keep []safetensors.Tensor
	for _, ti := range f.Tensors() {
		switch ti.Name {
		case "input_ids", "prefill_logits", "generated_ids", "decode_positions", "decode_logits":
			b, _, err := f.Bytes(ti.Name)
			if err != nil {
				t.Fatal(err)
			}
			keep = append(keep, safetensors.Tensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Data: append([]byte(nil), b...)})
		}
	}
	meta := f.Metadata()
	f.Close()
	if len(keep) != 5 {
		t.Fatalf("kept %d tensors", len(keep))
	}
	for _, corrupt := range []bool{false, true} {
		dir := t.TempDir()
		for _, name := range []string{"config.json", "model.safetensors"} {
			b, err := os.ReadFile(filepath.Join(src, name))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, name), b, 0o644)
		}
		ts := keep
		if corrupt {
			ts = append([]safetensors.Tensor(nil), keep...)
			for i := range ts {
				if ts[i].Name == "decode_logits" {
					d := append([]byte(nil), ts[i].Data...)
					d[len(d)-1] ^= 0x40 // the last logit's exponent
					ts[i].Data = d
				}
			}
		}
		if err := safetensors.WriteFile(filepath.Join(dir, "expected.safetensors"), ts, meta); err != nil {
			t.Fatal(err)
		}
		res := runAll(t, dir)
		if len(res) != 1 || res[0].Pass == corrupt {
			t.Errorf("corrupt=%v: %v", corrupt, res)
		}
	}
}

// TestDSADecodeSeveralRows: a dsa.decode case with several query rows at
// the last positions (a verification pass) runs, checked against a float64
// reference of the indexer and of sparse and dense latent attention
// computed here from the equations; a corrupted expectation fails.
func TestDSADecodeSeveralRows(t *testing.T) {
	const sq, l, hi, di, h, dc, dr, topK = 3, 24, 2, 8, 2, 8, 4, 6
	const scale = 0.3
	r := rand.New(rand.NewPCG(5, 6))
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return v
	}
	qi, ki, wi := rnd(sq*hi*di), rnd(l*di), rnd(sq*hi)
	ql, qp, kv, kp := rnd(sq*h*dc), rnd(sq*h*dr), rnd(l*dc), rnd(l*dr)
	scores := make([]float32, sq*l)
	picks := make([]int32, sq*topK)
	counts := make([]int32, sq)
	for t0 := range sq {
		pos := l - sq + t0
		type cand struct {
			s     int
			score float32
		}
		var cs []cand
		for s := range l {
			if s > pos {
				scores[t0*l+s] = float32(math.Inf(-1))
				continue
			}
			var sum float64
			for hh := range hi {
				var dot float64
				for d := range di {
					dot += float64(qi[(t0*hi+hh)*di+d]) * float64(ki[s*di+d])
				}
				sum += float64(wi[t0*hi+hh]) * max(dot, 0)
			}
			scores[t0*l+s] = float32(sum)
			cs = append(cs, cand{s, float32(sum)})
		}
		sort.SliceStable(cs, func(a, b int) bool { return cs[a].score > cs[b].score })
		n := min(topK, len(cs))
		counts[t0] = int32(n)
		for i := range topK {
			picks[t0*topK+i] = -1
			if i < n {
				picks[t0*topK+i] = int32(cs[i].s)
			}
		}
	}
	attend := func(sparse bool) (out, lse []float32) {
		out, lse = make([]float32, sq*h*dc), make([]float32, sq*h)
		for t0 := range sq {
			pos := l - sq + t0
			var keys []int
			if sparse {
				for _, p := range picks[t0*topK : (t0+1)*topK] {
					if p >= 0 {
						keys = append(keys, int(p))
					}
				}
			} else {
				for s := 0; s <= pos; s++ {
					keys = append(keys, s)
				}
			}
			for hh := range h {
				logits := make([]float64, len(keys))
				mx := math.Inf(-1)
				for i, s := range keys {
					var dot float64
					for d := range dc {
						dot += float64(ql[(t0*h+hh)*dc+d]) * float64(kv[s*dc+d])
					}
					for d := range dr {
						dot += float64(qp[(t0*h+hh)*dr+d]) * float64(kp[s*dr+d])
					}
					logits[i] = dot * scale
					mx = max(mx, logits[i])
				}
				var z float64
				acc := make([]float64, dc)
				for i, s := range keys {
					e := math.Exp(logits[i] - mx)
					z += e
					for d := range dc {
						acc[d] += e * float64(kv[s*dc+d])
					}
				}
				for d := range dc {
					out[(t0*h+hh)*dc+d] = float32(acc[d] / z)
				}
				lse[t0*h+hh] = float32(mx + math.Log(z))
			}
		}
		return out, lse
	}
	ol, lse := attend(true)
	old, lsed := attend(false)
	for _, corrupt := range []bool{false, true} {
		if corrupt {
			ol = append([]float32(nil), ol...)
			ol[sq*h*dc-1] += 0.1 // the last row's output
		}
		ts := []safetensors.Tensor{
			safetensors.F32Tensor("q_index", []int{sq, hi, di}, qi), safetensors.F32Tensor("k_index", []int{l, di}, ki),
			safetensors.F32Tensor("w_index", []int{sq, hi}, wi), safetensors.F32Tensor("scores", []int{sq, l}, scores),
			safetensors.I32Tensor("topk_indices", []int{sq, topK}, picks), safetensors.I32Tensor("topk_count", []int{sq}, counts),
			safetensors.F32Tensor("q_latent", []int{sq, h, dc}, ql), safetensors.F32Tensor("q_pe", []int{sq, h, dr}, qp),
			safetensors.F32Tensor("kv_c", []int{l, dc}, kv), safetensors.F32Tensor("k_pe", []int{l, dr}, kp),
			safetensors.F32Tensor("softmax_scale", []int{1}, []float32{scale}),
			safetensors.F32Tensor("o_latent", []int{sq, h, dc}, ol), safetensors.F32Tensor("lse", []int{sq, h}, lse),
			safetensors.F32Tensor("o_latent_dense", []int{sq, h, dc}, old), safetensors.F32Tensor("lse_dense", []int{sq, h}, lsed),
		}
		path := filepath.Join(t.TempDir(), "dsa_decode_rows.safetensors")
		if err := safetensors.WriteFile(path, ts, map[string]string{"op": "dsa.decode", "K": fmt.Sprint(topK)}); err != nil {
			t.Fatal(err)
		}
		res := runAll(t, path)
		if len(res) != 1 || res[0].Pass == corrupt {
			t.Errorf("corrupt=%v: %v", corrupt, res)
		}
	}
}

// countChunks counts the token-by-token KDAChunk calls of the composed
// decode route.
type countChunks struct {
	unfused
	steps int
}

func (c *countChunks) KDAChunk(a *compute.KDAArgs) error {
	if a.ChunkSize == 0 {
		c.steps++
	}
	return c.unfused.KDAChunk(a)
}

// The decode case's composed route really runs the composition, and
// passes.
func TestKDADecodeComposedRoute(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	c := &countChunks{unfused: unfused{b}}
	chk := &checker{}
	if err := runKDALayerDecodeOn(c, "../../testdata/kda/layer_k3_decode.safetensors", chk, " (composed)"); err != nil {
		t.Fatal(err)
	}
	if len(chk.fails) > 0 || chk.compared == 0 {
		t.Fatalf("composed route: %d compared, fails %v", chk.compared, chk.fails)
	}
	if c.steps == 0 {
		t.Fatal("the layer did not take the composition")
	}
}

// The decode case's graph route captures the composed step once and
// replays it for the later steps, with every comparison passing; the
// steps after the capture run only by replay (the layer is not called).
func TestKDADecodeGraphRoute(t *testing.T) {
	b, err := ascend.OpenHost(ascend.Options{ArenaBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c := &countChunks{unfused: unfused{b}}
	chk := &checker{}
	if err := runKDALayerDecodeGraph(c, b, "../../testdata/kda/layer_k3_decode.safetensors", chk); err != nil {
		t.Fatal(err)
	}
	if len(chk.fails) > 0 || chk.compared == 0 {
		t.Fatalf("graph route: %d compared, fails %v", chk.compared, chk.fails)
	}
	// The file has 3 decode steps: step 0 eager and step 1 under the
	// capture call the layer; step 2 replays. The eager route over the
	// same 3 steps counts the layer's calls for all three.
	eager := &countChunks{unfused: unfused{b}}
	if err := runKDALayerDecodeOn(eager, "../../testdata/kda/layer_k3_decode.safetensors", &checker{}, ""); err != nil {
		t.Fatal(err)
	}
	if eager.steps == 0 || eager.steps%3 != 0 || c.steps != eager.steps/3*2 {
		t.Fatalf("the composed recurrence ran %d times through the layer in the graph route and %d in the eager one, want 2/3 of it", c.steps, eager.steps)
	}
}

// Every case passes through the Ascend backend's orchestration on the
// host driver (arena, stream, staging, descriptors, two-phase operators;
// the operations not mapped to aclnn run on the pure-Go backend); under
// the race detector, all but testdata/configs (as TestImplementedAreas).
func TestAscendHost(t *testing.T) {
	b, err := ascend.OpenHost(ascend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cases, err := Discover("../../testdata")
	if err != nil {
		t.Fatal(err)
	}
	if raceEnabled {
		cases = slices.DeleteFunc(cases, func(c Case) bool {
			return strings.Contains(filepath.ToSlash(c.Path), "/configs/")
		})
	}
	n := 0
	for r := range Run(context.Background(), b, cases) {
		n++
		if !r.Pass {
			t.Errorf("%s", r)
		}
	}
	if n == 0 {
		t.Fatal("no cases")
	}
}
