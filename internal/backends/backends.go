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

var names = []string{"go", "go-fastbf16", "ascend"}

// Names lists the backend names, for help texts.
func Names() string { return strings.Join(names, ", ") }

// Open returns the named backend.
func Open(name string) (compute.Backend, error) {
	switch name {
	case "go", "":
		return cpu.New(0), nil
	case "go-fastbf16":
		// Opt-in: prefill's bf16-weight products round x to bfloat16.
		return cpu.NewFastBF16(0), nil
	case "ascend":
		return ascend.Open(ascend.Options{})
	}
	return nil, fmt.Errorf("unknown backend %q (have %s)", name, Names())
}
