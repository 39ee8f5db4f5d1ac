//go:build unix

package safetensors

import (
	"os"
	"syscall"
)

func mapFile(f *os.File, size int64) ([]byte, func() error, error) {
	if size == 0 {
		return []byte{}, func() error { return nil }, nil
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return b, func() error { return syscall.Munmap(b) }, nil
}

// dropPages tells the kernel that a page-aligned range of a read-only shared
// mapping is not needed for now: its pages leave the process's resident
// set, and come back from the file if touched again, so nothing is lost.
func dropPages(b []byte) { _ = syscall.Madvise(b, syscall.MADV_DONTNEED) }

// mapsFiles reports whether Open maps files (else it reads them).
const mapsFiles = true
