package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
