//go:build ascend && cgo

package acl

import (
	"fmt"
	"os/exec"
	"path/filepath"
)

// BuildFake compiles the fake CANN of testdata/fakecann (srcDir) with the
// system C compiler into dir, as the libraries Load looks for. It is for
// tests on machines without CANN; see the sources for what it checks.
func BuildFake(dir, srcDir string) error {
	for _, lib := range []struct{ out, src, extra string }{
		{"libascendcl.so", "acl.c", "-lpthread"},
		{"libnnopbase.so", "nnopbase.c", ""},
		{"libopapi.so", "opapi.c", "-lm"},
		{"libhccl.so", "hccl.c", "-lpthread"},
	} {
		args := []string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", filepath.Join(dir, lib.out), filepath.Join(srcDir, lib.src)}
		if lib.extra != "" {
			args = append(args, lib.extra)
		}
		if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("building the fake CANN (%s): %v\n%s", lib.src, err, out)
		}
	}
	return nil
}
