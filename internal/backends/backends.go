// Package backends opens a compute backend by name, so that the command
// line and the SDK share one list of what can be chosen.
package backends

import (
	"fmt"
	"strings"

	"k3/ascend"
	"k3/compute"
	"k3/internal/cpu"
)

var names = []string{"go", "go-fastbf16", "ascend", "ascend-host"}

// Names lists the backend names, for help texts.
func Names() string { return strings.Join(names, ", ") }

// Options carries what a device backend needs beyond its name. The Go
// backends ignore it but for FusedAttention on go-fastbf16.
type Options struct {
	// Device is the accelerator index.
	Device int
	// LibDirs are searched for the vendor's runtime libraries before the
	// dynamic loader's path.
	LibDirs []string
	// MemoryBytes is the device memory the backend takes at open (0: the
	// backend's default).
	MemoryBytes int
	// HostFallback lets a device backend run the operations it has not
	// mapped on the host (slowly) instead of failing with them.
	HostFallback bool
	// FusedAttention lets a device backend run its fused DSA operators
	// over bf16 copies of the caches (ascend.Options.FusedAttention), and
	// go-fastbf16 run the Lightning Indexer and index-sparse attention's
	// products in bf16 (cpu.NewFastBF16Indexer). Not exact: near-tied picks
	// may change.
	FusedAttention bool
}

// Open returns the named backend with default options.
func Open(name string) (compute.Backend, error) { return OpenWith(name, Options{}) }

// OpenWith returns the named backend.
func OpenWith(name string, o Options) (compute.Backend, error) {
	if o.Device < 0 || o.MemoryBytes < 0 {
		return nil, fmt.Errorf("backend %q: device %d, memory %d bytes: want non-negative values", name, o.Device, o.MemoryBytes)
	}
	switch name {
	case "go", "":
		return cpu.New(0), nil
	case "go-fastbf16":
		// Opt-in: bf16-weight products round x to bfloat16, and with
		// FusedAttention DSA's indexer and sparse attention are bf16.
		if o.FusedAttention {
			return cpu.NewFastBF16Indexer(0), nil
		}
		return cpu.NewFastBF16(0), nil
	case "ascend":
		return ascend.Open(ascend.Options{Device: o.Device, LibDirs: o.LibDirs, ArenaBytes: o.MemoryBytes, HostFallback: o.HostFallback,
			FusedAttention: o.FusedAttention})
	case "ascend-host":
		// The Ascend backend's orchestration with the host as its device:
		// for testing it without an NPU.
		return ascend.OpenHost(ascend.Options{ArenaBytes: o.MemoryBytes, HostFallback: o.HostFallback, FusedAttention: o.FusedAttention})
	}
	return nil, fmt.Errorf("unknown backend %q (have %s)", name, Names())
}
