//go:build !(ascend && cgo)

package acl

// Built reports whether this build has the cgo shim.
const Built = false

// Load fails: this build has no shim.
func Load(Options) (*Lib, error) { return nil, ErrNotBuilt }

// Lib is the loaded driver; a build without the shim never has one.
type Lib struct {
	Paths []string
}
