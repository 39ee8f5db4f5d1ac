package safetensors

import "syscall"

// dropPages tells the kernel that a page-aligned range of a read-only shared
// mapping is not needed for now: its pages leave the process's resident
// set, and come back from the file if touched again, so nothing is lost.
func dropPages(b []byte) { _ = syscall.Madvise(b, syscall.MADV_DONTNEED) }
