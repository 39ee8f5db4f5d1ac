package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestConformCommand(t *testing.T) {
	code, out, _ := runCLI("conform", "../../testdata/moe")
	if code != 0 || !strings.HasSuffix(out, "6 passed, 0 failed\n") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[:6] {
		if !strings.HasPrefix(line, "PASS ../../testdata/moe/") || !strings.Contains(line, " max_abs_err=") || !strings.Contains(line, " tol=") {
			t.Errorf("line %q", line)
		}
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "broken.safetensors"), []byte{1, 2, 3}, 0o644)
	code, out, _ = runCLI("conform", dir)
	if code != 1 || !strings.Contains(out, "FAIL "+filepath.Join(dir, "broken.safetensors")) || !strings.HasSuffix(out, "0 passed, 1 failed\n") {
		t.Errorf("broken case: exit %d, output:\n%s", code, out)
	}
	if code, _, _ := runCLI("conform", "-backend", "nope", dir); code == 0 {
		t.Error("unknown backend accepted")
	}
	if code, _, errOut := runCLI("conform", "-backend", "ascend", dir); code == 0 || !strings.Contains(errOut, "ascend") {
		t.Errorf("ascend backend: exit %d %s", code, errOut)
	}
	if code, _, _ := runCLI("conform"); code != 2 {
		t.Errorf("no arguments: exit %d", code)
	}
}

// The model cases under a parallel layout print the same lines; the layer
// cases are left out, and context parallelism is refused by name.
func TestConformLayout(t *testing.T) {
	code, out, _ := runCLI("conform", "-tp", "2", "-ep", "4", "../../testdata/model/tiny_k31pro", "../../testdata/moe")
	if code != 0 || out != "PASS ../../testdata/model/tiny_k31pro model.forward "+strings.SplitN(strings.SplitN(out, "model.forward ", 2)[1], "\n", 2)[0]+"\n1 passed, 0 failed\n" {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
	for _, cp := range []string{"2", "4"} {
		code, out, _ := runCLI("conform", "-cp", cp, "../../testdata/model")
		if code != 0 || !strings.Contains(out, "4 passed, 0 failed") {
			t.Errorf("-cp %s: exit %d, output:\n%s", cp, code, out)
		}
	}
	if code, out, _ := runCLI("conform", "-cp", "2", "-tp", "2", "../../testdata/model"); code != 0 || !strings.Contains(out, "4 passed, 0 failed") {
		t.Errorf("-cp 2 -tp 2: exit %d, output:\n%s", code, out)
	}
	if code, out, _ := runCLI("conform", "-cp", "2", "-ep", "2", "../../testdata/model"); code != 0 || !strings.Contains(out, "4 passed, 0 failed") {
		t.Errorf("-cp 2 -ep 2: exit %d, output:\n%s", code, out)
	}
	if code, _, errOut := runCLI("conform", "-cp", "2", "-ep", "4", "../../testdata/model/tiny_k31pro"); code == 0 || !strings.Contains(errOut, "EP must be the rank count") {
		t.Errorf("-cp 2 -ep 4: exit %d %s", code, errOut)
	}
	if code, _, errOut := runCLI("conform", "-tp", "3", "-ep", "2", "../../testdata/model/tiny_k31pro"); code == 0 || !strings.Contains(errOut, "does not divide") {
		t.Errorf("-tp 3 -ep 2: exit %d %s", code, errOut)
	}
	// A checkpoint the layout cannot split is skipped, naming why; a run
	// where nothing passed fails.
	if code, out, _ := runCLI("conform", "-ep", "16", "../../testdata/model/tiny_k31pro"); code == 0 || !strings.Contains(out, "SKIP") ||
		!strings.Contains(out, "8 experts over 16 ranks") || !strings.Contains(out, "0 passed, 0 failed, 1 skipped") {
		t.Errorf("-ep 16: exit %d %s", code, out)
	}
	// testdata/configs/case00 has 4 routed experts, case01 8.
	code, out, _ = runCLI("conform", "-ep", "8", "../../testdata/configs/case00", "../../testdata/configs/case01")
	if code != 0 || !strings.Contains(out, "SKIP ../../testdata/configs/case00") || !strings.Contains(out, "4 experts over 8 ranks") ||
		!strings.Contains(out, "PASS ../../testdata/configs/case01") || !strings.Contains(out, "1 passed, 0 failed, 1 skipped") {
		t.Errorf("-ep 8: exit %d %s", code, out)
	}
}

func TestInspectCommand(t *testing.T) {
	code, out, _ := runCLI("inspect", "../../testdata/model/tiny_k31pro")
	if code != 0 || !strings.Contains(out, "layers: kda kda dsa kda kda dsa") || !strings.Contains(out, "parameters") {
		t.Errorf("exit %d:\n%s", code, out)
	}
	code, out, _ = runCLI("inspect", "../../testdata/kda/decode_steps.safetensors")
	if code != 0 || !strings.Contains(out, "op: kda.decode") || !strings.Contains(out, "state_after_step") {
		t.Errorf("exit %d:\n%s", code, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.safetensors")
	os.WriteFile(bad, []byte("\x10\x00\x00\x00\x00\x00\x00\x00{}"), 0o644)
	code, _, errOut := runCLI("inspect", bad)
	if code == 0 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "past end of file") {
		t.Errorf("malformed file: exit %d, stderr %q", code, errOut)
	}
}

func TestNewTinyAndRun(t *testing.T) {
	dir := t.TempDir()
	for _, preset := range []string{"k31pro", "k3", "kimi_linear"} {
		out := filepath.Join(dir, preset)
		if code, _, errOut := runCLI("new-tiny", "-preset", preset, "-out", out, "-bf16"); code != 0 {
			t.Fatalf("new-tiny %s: exit %d: %s", preset, code, errOut)
		}
		code, stdout, stderr := runCLI("run", "-model", out, "-prompt", "Hi", "-max-tokens", "5", "-temperature", "0.8", "-seed", "1")
		if code != 0 || !strings.Contains(stderr, "decode:") || !strings.Contains(stderr, "memory:") || stdout == "" {
			t.Errorf("run %s: exit %d\nstdout %q\nstderr %q", preset, code, stdout, stderr)
		}
	}
	if code, _, stderr := runCLI("run", "-prompt", "Hi", "-max-tokens", "3"); code != 0 || !strings.Contains(stderr, "trained on Go source") {
		t.Errorf("run with the embedded model: exit %d, stderr %q", code, stderr)
	}
	if code, _, _ := runCLI("run", "-model", filepath.Join(dir, "missing")); code == 0 {
		t.Error("run with a missing model succeeded")
	}
	if code, _, _ := runCLI("run", "-top-p", "1.5"); code == 0 {
		t.Error("run with top-p 1.5 succeeded")
	}
	if code, _, _ := runCLI("new-tiny", "-preset", "nope", "-out", filepath.Join(dir, "x")); code == 0 {
		t.Error("unknown preset accepted")
	}
}

// TestNewTinySet writes a preset with config fields changed by -set:
// nested objects merge, null clears, and a value the config rejects or a
// -set that is not an object is an error naming it.
func TestNewTinySet(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m")
	code, _, errOut := runCLI("new-tiny", "-preset", "k31pro", "-out", out, "-set",
		`{"hidden_size": 48, "linear_attn_config": {"num_heads": 2}, "index_topk": null, "routed_expert_hidden_size": 48}`)
	require.Equal(t, 0, code, errOut)
	raw, err := os.ReadFile(filepath.Join(out, "config.json"))
	require.NoError(t, err)
	var cfg struct {
		Text map[string]any `json:"text_config"`
	}
	require.NoError(t, json.Unmarshal(raw, &cfg))
	assert.Equal(t, 48.0, cfg.Text["hidden_size"])
	assert.Nil(t, cfg.Text["index_topk"])
	lin := cfg.Text["linear_attn_config"].(map[string]any)
	assert.Equal(t, 2.0, lin["num_heads"])
	assert.Equal(t, 16.0, lin["head_dim"], "the other linear_attn_config fields stay")
	code, stdout, stderr := runCLI("run", "-model", out, "-prompt", "Hi", "-max-tokens", "3", "-seed", "1")
	assert.Equal(t, 0, code, stderr)
	assert.NotEmpty(t, stdout)

	code, _, errOut = runCLI("new-tiny", "-preset", "k31pro", "-out", filepath.Join(dir, "x"), "-set", `{"hidden_size": -3}`)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "hidden_size")
	code, _, errOut = runCLI("new-tiny", "-preset", "k31pro", "-out", filepath.Join(dir, "y"), "-set", `[1]`)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "-set")
	_, err = os.Stat(filepath.Join(dir, "x"))
	assert.True(t, os.IsNotExist(err), "a rejected config writes nothing")
}

func TestPlanCommand(t *testing.T) {
	code, out, errOut := runCLI("plan", "-config", "../../docs/plan/deepseek_v32.json", "-cards", "16", "-context", "8192", "-batch", "32", "-top", "2")
	if code != 0 || !strings.Contains(out, "671.9B parameters on 16 x a3") || strings.Count(out, " EP") != 2 {
		t.Errorf("exit %d, output:\n%s%s", code, out, errOut)
	}
	if code, _, _ := runCLI("plan"); code != 2 {
		t.Errorf("no -config: exit %d", code)
	}
	if code, _, errOut := runCLI("plan", "-config", "../../docs/plan/deepseek_v32.json", "-card", "nope"); code == 0 || !strings.Contains(errOut, "unknown card") {
		t.Errorf("unknown card: exit %d %s", code, errOut)
	}
}
