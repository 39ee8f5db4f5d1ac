package kernel

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPathForced re-runs this test binary under K3_KERNEL and checks that
// the path it reports is capped there (never above what this CPU has).
func TestPathForced(t *testing.T) {
	if os.Getenv("K3_PATH_CHILD") != "" {
		os.Stdout.WriteString("path=" + Path() + "\n")
		return
	}
	if os.Getenv("K3_KERNEL") != "" {
		t.Skip("run without K3_KERNEL: the test compares capped paths with the CPU's own")
	}
	// What each cap gives on this CPU: never more than it has.
	bf16 := ""
	if hasBF16Dot {
		bf16 = "+bf16"
	}
	want := map[string]string{"go": "go", "avx2": "go", "avx512": "go", "zmm": "go", "halfzmm": "go", "": Path(), "amx": Path()}
	if hasAMX {
		want["amx"] = Path() + "+amxweights" // opt-in: the uncapped path runs only the long products on the tiles
	}
	if useAVX2 {
		want["avx2"], want["avx512"], want["zmm"], want["halfzmm"] = "avx2", "avx2", "avx2", "avx2"
	}
	if useAVX512 {
		want["avx512"], want["zmm"] = "avx512-ymm", "avx512+zmm"+bf16
		// The half-width choices keep the AMX tiles (emulated or not).
		want["halfzmm"] = "avx512" + bf16
		switch {
		case amxEmulated:
			want["halfzmm"] += "+amx-emulated"
		case hasAMX:
			want["halfzmm"] += "+amx"
		}
	}
	// A cap the CPU cannot run is said so.
	for env, runs := range map[string]bool{"avx2": useAVX2, "avx512": useAVX512, "zmm": useAVX512, "halfzmm": useAVX512, "amx": hasAMX} {
		if !runs {
			want[env] += " (K3_KERNEL=" + env + " does not run here)"
		}
	}
	for _, env := range []string{"go", "avx2", "avx512", "zmm", "halfzmm", "", "amx"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPathForced$")
		cmd.Env = append(os.Environ(), "K3_PATH_CHILD=1", "K3_KERNEL="+env)
		out, err := cmd.Output()
		require.NoError(t, err)
		_, got, ok := strings.Cut(string(out), "path=")
		require.True(t, ok, "%s", out)
		got, _, _ = strings.Cut(got, "\n")
		if env == "" || env == "amx" {
			// Uncapped, "+zmm" is a timing probe's answer (wideFMA), which
			// a loaded machine can flip between processes; the rest is
			// fixed by the CPU.
			assert.Equal(t, strings.Replace(want[env], "+zmm", "", 1), strings.Replace(got, "+zmm", "", 1), "K3_KERNEL=%s", env)
			assert.True(t, hasZMM || !strings.Contains(got, "+zmm"), "+zmm without 512-bit kernels: %s", got)
			continue
		}
		assert.Equal(t, want[env], got, "K3_KERNEL=%s", env)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPathForced$")
	cmd.Env = append(os.Environ(), "K3_PATH_CHILD=1", "K3_KERNEL=avx-2")
	out, err := cmd.Output()
	require.NoError(t, err)
	assert.Contains(t, string(out), `K3_KERNEL="avx-2" not understood`)
}

// TestAMXEmulate: K3_AMX=emulate turns the AMX paths on where the CPU has
// AVX512_BF16 and BW but no AMX (and K3_KERNEL does not cap them), and
// changes nothing on a CPU with AMX or without AVX-512 BF16.
func TestAMXEmulate(t *testing.T) {
	if os.Getenv("K3_PATH_CHILD") != "" || os.Getenv("K3_KERNEL") != "" || os.Getenv("K3_AMX") != "" {
		t.Skip("run without K3_KERNEL and K3_AMX: the test sets them in child processes")
	}
	emulates := !amxCPU && hasBF16Dot && hasAVX512BW
	for _, env := range []string{"", "amx", "halfzmm", "zmm", "avx512"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPathForced$")
		cmd.Env = append(os.Environ(), "K3_PATH_CHILD=1", "K3_KERNEL="+env, "K3_AMX=emulate")
		out, err := cmd.Output()
		require.NoError(t, err)
		_, got, ok := strings.Cut(string(out), "path=")
		require.True(t, ok, "%s", out)
		got, _, _ = strings.Cut(got, "\n")
		on := emulates && (env == "" || env == "amx" || env == "halfzmm")
		assert.Equal(t, on, strings.Contains(got, "+amx-emulated"), "K3_KERNEL=%q K3_AMX=emulate: %s", env, got)
		assert.Equal(t, on && env == "amx", emulates && strings.Contains(got, "+amxweights"), "K3_KERNEL=%q K3_AMX=emulate: %s", env, got)
		if !emulates {
			assert.NotContains(t, got, "emulated", "K3_KERNEL=%q: nothing to emulate here", env)
		}
	}
}

// TestAMXEmulated: under K3_AMX=emulate the backends see the AMX paths
// and nothing probes the tiles' peak.
func TestAMXEmulated(t *testing.T) {
	if !amxEmulated {
		t.Skip("K3_AMX=emulate is not in effect")
	}
	assert.True(t, AMXAvailable())
	p := NewPool(1)
	defer p.Close()
	assert.Zero(t, p.PeakAMXFLOPS(), "no peak to probe on the twin")
}
