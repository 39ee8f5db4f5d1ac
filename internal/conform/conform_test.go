package conform

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
// each later area joins this list when it lands.
func TestImplementedAreas(t *testing.T) {
	for _, area := range []string{"attnres", "dsa", "kda", "model", "moe"} {
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
	if ops["model.forward"] != 4 || ops["kda.core"] != 2 || ops["moe.router"] != 5 || ops["dsa.indexer"] != 1 {
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

	res := runAll(t, dir)
	if len(res) != 4 {
		t.Fatalf("%d results: %v", len(res), res)
	}
	for _, r := range res {
		if r.Pass {
			t.Errorf("%s passed", r.Path)
		}
		if r.Reason == "" {
			t.Errorf("%s: no reason", r.Path)
		}
		if strings.HasSuffix(r.Path, "unknown.safetensors") && !strings.Contains(r.Reason, "unsupported op") {
			t.Errorf("unknown op reason: %s", r.Reason)
		}
		if strings.HasSuffix(r.Path, "bad_weight.safetensors") && !strings.Contains(r.Reason, "topk_weight") {
			t.Errorf("corrupted weight reason: %s", r.Reason)
		}
	}
}
