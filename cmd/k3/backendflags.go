package main

import (
	"flag"
	"path/filepath"

	"k3/internal/backends"
	"k3/k3"
)

// backendFlags are the flags that choose and configure a compute backend,
// shared by every command that runs the model.
type backendFlags struct {
	name    string
	device  int
	libDirs string
	memory  int
	host    bool
	fused   bool
}

func addBackendFlags(fs *flag.FlagSet) *backendFlags {
	f := &backendFlags{}
	fs.StringVar(&f.name, "backend", "go", "compute backend: "+backends.Names())
	fs.IntVar(&f.device, "device", 0, "accelerator index of a device backend (a parallel layout's rank r uses device+r)")
	fs.StringVar(&f.libDirs, "lib-dirs", "", "directories (separated by "+string(filepath.ListSeparator)+") searched first for a device backend's vendor libraries")
	fs.IntVar(&f.memory, "device-mib", 0, "device memory a device backend takes at open, in MiB (0: its default)")
	fs.BoolVar(&f.host, "host-fallback", false, "run the operations a device backend has not mapped on the host (slow) instead of failing")
	fs.BoolVar(&f.fused, "fused-attention", false, "run DSA in bf16: a device backend's fused operators over bf16 copies of the caches, go-fastbf16's Lightning Indexer and sparse attention over rounded operands (not exact: near-tied picks may change)")
	return f
}

func (f *backendFlags) options() backends.Options {
	return backends.Options{Device: f.device, LibDirs: filepath.SplitList(f.libDirs), MemoryBytes: f.memory << 20, HostFallback: f.host,
		FusedAttention: f.fused}
}

// loadOptions are the k3.Load options of the flags.
func (f *backendFlags) loadOptions() []k3.Option {
	o := f.options()
	return []k3.Option{k3.WithBackend(f.name), k3.WithBackendOptions(k3.BackendOptions{Device: o.Device, LibDirs: o.LibDirs,
		MemoryBytes: o.MemoryBytes, HostFallback: o.HostFallback, FusedAttention: o.FusedAttention})}
}
