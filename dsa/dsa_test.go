package dsa

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"k3/compute"
	"k3/internal/cpu"
	"k3/internal/weights"
)

func testConfig() Config {
	return Config{Hidden: 32, NumHeads: 4, QLoRARank: 24, KVLoRARank: 16, NopeDim: 8, RopeDim: 8, VDim: 8,
		NoPE: false, OutputGate: true, RopeTheta: 10000, Indexer: &IndexerConfig{NumHeads: 2, HeadDim: 16, TopK: 4}}
}

// randomSource serves random weights of the requested shapes.
func randomSource(cfg Config, seed uint64) weights.Source {
	r := rand.New(rand.NewPCG(seed, 1))
	h, d, qin := cfg.NumHeads, cfg.Hidden, cfg.QLoRARank
	shapes := map[string][]int{
		"q_a_proj.weight": {qin, d}, "q_a_layernorm.weight": {qin}, "q_b_proj.weight": {h * (cfg.NopeDim + cfg.RopeDim), qin},
		"kv_a_proj_with_mqa.weight": {cfg.KVLoRARank + cfg.RopeDim, d}, "kv_a_layernorm.weight": {cfg.KVLoRARank},
		"kv_b_proj.weight": {h * (cfg.NopeDim + cfg.VDim), cfg.KVLoRARank}, "g_proj.weight": {h * cfg.VDim, d},
		"o_proj.weight": {d, h * cfg.VDim},
	}
	if ix := cfg.Indexer; ix != nil {
		shapes["indexer.wq_b.weight"] = []int{ix.NumHeads * ix.HeadDim, qin}
		shapes["indexer.wk.weight"] = []int{ix.HeadDim, d}
		shapes["indexer.k_norm.weight"] = []int{ix.HeadDim}
		shapes["indexer.k_norm.bias"] = []int{ix.HeadDim}
		shapes["indexer.weights_proj.weight"] = []int{ix.NumHeads, d}
	}
	return func(name string) (compute.DType, []int, []byte, error) {
		shape, ok := shapes[name]
		if !ok {
			return 0, nil, nil, errors.New("no tensor " + name)
		}
		n := 1
		for _, s := range shape {
			n *= s
		}
		data := make([]byte, 4*n)
		for i := 0; i < n; i++ {
			v := math.Float32bits(float32(r.NormFloat64() * 0.3))
			data[4*i], data[4*i+1], data[4*i+2], data[4*i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		}
		return compute.F32, shape, data, nil
	}
}

// TestIncrementalEqualsPrefill checks that decoding token by token with
// the cache (which grows past its initial capacity) gives the outputs of
// one prefill, and that truncating and re-running reproduces them.
func TestIncrementalEqualsPrefill(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	cfg := testConfig()
	w, err := LoadWeights(b, cfg, randomSource(cfg, 1))
	if err != nil {
		t.Fatal(err)
	}
	const n = 13
	r := rand.New(rand.NewPCG(2, 2))
	xs := make([]float32, n*cfg.Hidden)
	for i := range xs {
		xs[i] = float32(r.NormFloat64())
	}
	x, _ := b.Alloc(compute.F32, n, cfg.Hidden)
	b.Write(x, xs)
	full, _ := NewLayer(b, cfg, w, n)
	c1, _ := NewCache(NewPool(b, cfg), 64)
	y1, _ := b.Alloc(compute.F32, n, cfg.Hidden)
	if err := full.Forward(x, chunkOf(c1, n), y1); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, n*cfg.Hidden)
	b.Read(want, y1)

	step, _ := NewLayer(b, cfg, w, 1)
	c2, _ := NewCache(NewPool(b, cfg), 64) // grows 2 -> 4 -> 8 -> 16
	y2, _ := b.Alloc(compute.F32, 1, cfg.Hidden)
	got := make([]float32, cfg.Hidden)
	check := func(from int) {
		for i := from; i < n; i++ {
			if err := step.Forward(x.Rows(i, i+1), stepOf(c2, 1), y2); err != nil {
				t.Fatal(err)
			}
			b.Read(got, y2)
			for j := range got {
				if w := want[i*cfg.Hidden+j]; !(math.Abs(float64(got[j]-w)) <= 1e-4*(1+math.Abs(float64(w)))) {
					t.Fatalf("token %d channel %d: %g, prefill %g", i, j, got[j], w)
				}
			}
		}
	}
	check(0)
	if c2.Len != n || c2.Cap() < n || c2.Bytes() <= 0 {
		t.Fatalf("cache len %d cap %d bytes %d", c2.Len, c2.Cap(), c2.Bytes())
	}
	if err := c2.Truncate(5); err != nil {
		t.Fatal(err)
	}
	check(5)
	if err := c2.Truncate(n + 1); err == nil {
		t.Error("truncate beyond the length accepted")
	}
	// No allocation per decode token once the cache has room.
	c3, _ := NewCache(NewPool(b, cfg), 64)
	s3 := stepOf(c3, 1)
	if allocs := testing.AllocsPerRun(10, func() { step.Forward(x.Rows(0, 1), s3, y2) }); allocs != 0 && !raceEnabled {
		t.Errorf("decode step allocates %v times", allocs)
	}
}

func TestBadInput(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	cfg := testConfig()
	w, _ := LoadWeights(b, cfg, randomSource(cfg, 3))
	l, _ := NewLayer(b, cfg, w, 4)
	// A top-K beyond the context is no error: every row keeps all it sees.
	small, err := NewCache(NewPool(b, cfg), 3)
	if err != nil {
		t.Fatalf("top-k %d beyond a cache limit of 3: %v", cfg.Indexer.TopK, err)
	}
	x3, _ := b.Alloc(compute.F32, 3, cfg.Hidden)
	y3, _ := b.Alloc(compute.F32, 3, cfg.Hidden)
	if err := l.Forward(x3, chunkOf(small, 3), y3); err != nil {
		t.Fatalf("3 tokens into a cache of limit 3 with top-k %d: %v", cfg.Indexer.TopK, err)
	}
	c, _ := NewCache(NewPool(b, cfg), 5)
	x, _ := b.Alloc(compute.F32, 3, cfg.Hidden)
	y, _ := b.Alloc(compute.F32, 3, cfg.Hidden)
	if err := l.Forward(x, chunkOf(c, 3), y); err != nil {
		t.Fatal(err)
	}
	if err := l.Forward(x, chunkOf(c, 3), y); !errors.Is(err, ErrCacheFull) {
		t.Errorf("overflowing the cache limit: %v", err)
	}
	for _, bad := range []*Seqs{
		{Cu: []int32{0, 3}},
		{Cu: []int32{0, 2}, Caches: []*Cache{c}},
		{Cu: []int32{0, 3}, Caches: []*Cache{c}, Exact: 2},
		{Cu: []int32{0, 0, 3}, Caches: []*Cache{c, small}},
		{Cu: []int32{0, 1, 3}, Caches: []*Cache{c, c}},
		{Cu: []int32{0, 3}, Caches: []*Cache{nil}},
	} {
		if err := l.Forward(x, bad, y); err == nil {
			t.Errorf("Forward accepted %+v", *bad)
		}
	}
	// Attention-level checks.
	q, _ := b.Alloc(compute.F32, 1, 2, 8)
	k, _ := b.Alloc(compute.F32, 6, 1, 8)
	out, _ := b.Alloc(compute.F32, 1, 2, 8)
	idx, _ := b.Alloc(compute.I32, 1, 1, 2)
	b.Write(idx, []int32{1, 9})
	qpos, _ := b.Alloc(compute.I32, 1)
	b.Write(qpos, []int32{4})
	a := compute.AttnArgs{Q: q, K: k, V: k, Indices: idx, QPos: qpos, KVLen: 6, Causal: true, Scale: 1, Out: out}
	if err := b.Attention(&a); err == nil || !strings.Contains(err.Error(), "outside the cache") {
		t.Errorf("index outside the cache: %v", err)
	}
	b.Write(idx, []int32{1, 2})
	b.Write(qpos, []int32{6})
	if err := b.Attention(&a); err == nil || !strings.Contains(err.Error(), "beyond the cache length") {
		t.Errorf("query beyond the cache: %v", err)
	}
	k7, _ := b.Alloc(compute.F32, 6, 1, 7)
	b.Write(qpos, []int32{4})
	a.K = k7
	if err := b.Attention(&a); !errors.Is(err, compute.ErrShape) {
		t.Errorf("mismatched head dims: %v", err)
	}
	bad := randomSource(cfg, 4)
	wrong := func(name string) (compute.DType, []int, []byte, error) {
		if name == "kv_b_proj.weight" {
			return compute.F32, []int{3, 3}, make([]byte, 36), nil
		}
		return bad(name)
	}
	if _, err := LoadWeights(b, cfg, wrong); err == nil || !strings.Contains(err.Error(), "kv_b_proj.weight") {
		t.Errorf("mis-shaped kv_b_proj: %v", err)
	}
}

// TestMHAEqualsAbsorbed runs the same prefill in both attention forms,
// the chunks dense, or index-sparse with selections covering at least
// half of what each row sees (mhaPays), and checks which form each chunk
// took.
func TestMHAEqualsAbsorbed(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	for _, c := range []struct {
		nope bool
		topK int
		mha  [2]bool // the chunks' forms where MHAMin admits both
	}{
		{false, 4, [2]bool{true, false}}, // the first chunk masked, the second too sparse
		{true, 4, [2]bool{true, false}},
		{false, 12, [2]bool{true, true}}, // dense, then masked after a cached prefix
		{false, 32, [2]bool{true, true}}, // both dense
	} {
		nope := c.nope
		cfg := testConfig()
		cfg.NoPE = nope
		cfg.Indexer.TopK = c.topK
		cfg.Yarn = &Yarn{Factor: 4, OriginalMaxPositions: 8, MaxPositions: 64, BetaFast: 32, BetaSlow: 1, MScale: 1, MScaleAllDim: 0.7}
		w, err := LoadWeights(b, cfg, randomSource(cfg, 9))
		if err != nil {
			t.Fatal(err)
		}
		const n = 20
		r := rand.New(rand.NewPCG(4, 4))
		xs := make([]float32, n*cfg.Hidden)
		for i := range xs {
			xs[i] = float32(r.NormFloat64())
		}
		x, _ := b.Alloc(compute.F32, n, cfg.Hidden)
		b.Write(x, xs)
		var outs [2][]float32
		for i, mhaMin := range []int{1, n + 1} {
			l, _ := NewLayer(b, cfg, w, n)
			l.MHAMin = mhaMin
			cache, _ := NewCache(NewPool(b, cfg), 64)
			y, _ := b.Alloc(compute.F32, n, cfg.Hidden)
			// Two chunks, so the second attends to the first's cache too.
			var forms [2]bool
			if err := l.Forward(x.Rows(0, 7), chunkOf(cache, 7), y.Rows(0, 7)); err != nil {
				t.Fatal(err)
			}
			forms[0] = l.mha[0]
			if err := l.Forward(x.Rows(7, n), chunkOf(cache, n-7), y.Rows(7, n)); err != nil {
				t.Fatal(err)
			}
			forms[1] = l.mha[0]
			want := c.mha
			if mhaMin > n {
				want = [2]bool{}
			}
			if forms != want {
				t.Fatalf("top %d, MHAMin %d: chunks in MHA form %v, want %v", c.topK, mhaMin, forms, want)
			}
			outs[i] = make([]float32, n*cfg.Hidden)
			b.Read(outs[i], y)
		}
		for i := range outs[0] {
			if d := math.Abs(float64(outs[0][i] - outs[1][i])); d > 1e-4*(1+math.Abs(float64(outs[1][i]))) {
				t.Fatalf("nope=%v top %d element %d: MHA %g, absorbed %g", nope, c.topK, i, outs[0][i], outs[1][i])
			}
		}
	}
}

func TestYarnFrequencies(t *testing.T) {
	plain := Config{RopeTheta: 10000}
	cfg := plain
	cfg.Yarn = &Yarn{Factor: 40, OriginalMaxPositions: 4096, MaxPositions: 163840, BetaFast: 32, BetaSlow: 1, MScale: 1, MScaleAllDim: 1}
	base, scaled := plain.ropeFreqs(64), cfg.ropeFreqs(64)
	// Pairs that turn more than beta_fast times over the original context
	// keep their frequency; those turning less than beta_slow times are
	// divided by the factor; the ones between are interpolated.
	for i := range base {
		turns := base[i] * 4096 / (2 * math.Pi)
		switch {
		case turns > 32 && scaled[i] != base[i]:
			t.Errorf("pair %d (%.1f turns) changed: %g -> %g", i, turns, base[i], scaled[i])
		case turns < 1 && math.Abs(scaled[i]-base[i]/40) > 1e-12*base[i]:
			t.Errorf("pair %d (%.2f turns) not divided by the factor: %g -> %g", i, turns, base[i], scaled[i])
		case scaled[i] > base[i] || scaled[i] < base[i]/40*(1-1e-12):
			t.Errorf("pair %d outside [f/40, f]: %g", i, scaled[i])
		}
	}
	rope, sm := cfg.yarnScales()
	if want := (0.1*math.Log(40) + 1) * (0.1*math.Log(40) + 1); rope != 1 || math.Abs(sm-want) > 1e-12 {
		t.Errorf("scales rope %g softmax %g, want 1 and %g", rope, sm, want)
	}
	cfg.Yarn.MaxPositions = 4096 // no extension: no scaling
	if f := cfg.ropeFreqs(64); f[31] != base[31] {
		t.Error("scaling applied without a longer context")
	}
}

// chunkOf describes n new rows of one sequence as a prefill chunk.
func chunkOf(c *Cache, n int) *Seqs {
	return &Seqs{Cu: []int32{0, int32(n)}, Caches: []*Cache{c}}
}

// stepOf describes n new rows of one sequence as an exact run.
func stepOf(c *Cache, n int) *Seqs {
	return &Seqs{Cu: []int32{0, int32(n)}, Caches: []*Cache{c}, Exact: 1}
}
