package k3

import (
	"context"
	"encoding/binary"
	"os"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/kernel"
	"k3/internal/tiny"
)

// residentPages counts the pages the process's page table maps
// (/proc/self/pagemap, bit 63) in the aligned blocks of block bytes (a
// multiple of the page size) that lie wholly inside b.
func residentPages(t *testing.T, pm *os.File, b []byte, block uintptr) int {
	page := uintptr(os.Getpagesize())
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	hi := lo + uintptr(len(b))
	n := 0
	var e [8]byte
	for a := (lo + block - 1) / block * block; a < hi/block*block; a += page {
		_, err := pm.ReadAt(e[:], int64(a/page)*8)
		require.NoError(t, err)
		if binary.LittleEndian.Uint64(e[:])>>63 == 1 {
			n++
		}
	}
	return n
}

// faultAround is how far around a faulting address Linux maps the pages
// of a file already in its page cache (fault_around_bytes).
func faultAround() uintptr {
	if b, err := os.ReadFile("/sys/kernel/debug/fault_around_bytes"); err == nil {
		var v uintptr
		for _, c := range b {
			if c >= '0' && c <= '9' {
				v = v*10 + uintptr(c-'0')
			}
		}
		if v >= uintptr(os.Getpagesize()) {
			return v
		}
	}
	return 64 << 10
}

// TestReleaseUnread: after Load, the mapped pages of the tensors no tensor
// of the backend reads (the weights laid out k-major) are out of the
// process's resident set and a prefill and decode steps bring none of
// them back, while the pages the run reads in place stay resident when
// the release runs again.
func TestReleaseUnread(t *testing.T) {
	if !kernel.KMajorFast() {
		t.Skip("weights keep their stored layout on this path: nothing to release")
	}
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skipf("no page map: %v", err)
	}
	defer pm.Close()
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir, "k31pro", tiny.Options{Seed: 12, BF16: true, Edit: func(text map[string]any) {
		text["hidden_size"] = 1032 // every matrix but the routers' is laid out k-major
	}}))
	ctx := context.Background()
	m, err := Load(ctx, dir)
	require.NoError(t, err)
	defer m.Close()
	hr, ok := m.b.(compute.HostReader)
	require.True(t, ok, "the default backend reports what it reads")

	var released, kept []string
	for _, name := range m.ck.Names() {
		data := m.ck.Mapped(name)
		if data == nil {
			t.Skip("the checkpoint is not memory-mapped here")
		}
		if hr.ReadsHost(data) {
			kept = append(kept, name)
		} else {
			released = append(released, name)
		}
	}
	// Independent of the backend's answer: a KDA layer's o_proj is laid
	// out anew, its expert router is read in place.
	require.Contains(t, released, "language_model.model.layers.1.self_attn.o_proj.weight")
	require.Contains(t, kept, "language_model.model.layers.1.block_sparse_moe.gate.weight")

	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32((i*13 + 5) % m.VocabSize())
	}
	_, err = s.Forward(ctx, prompt)
	require.NoError(t, err)
	for i := range 3 {
		_, err = s.Forward(ctx, []int32{int32(i + 7)})
		require.NoError(t, err)
	}
	// A read fault maps the cached pages around it too, so a released
	// tensor is checked in the aligned blocks of that size it holds whole.
	around, page := faultAround(), uintptr(os.Getpagesize())
	checked := 0
	for _, name := range released {
		data := m.ck.Mapped(name)
		require.Zero(t, residentPages(t, pm, data, around), "%s was released, yet the run read it", name)
		if uintptr(len(data)) >= 2*around {
			checked++
		}
	}
	require.NotZero(t, checked, "no released tensor holds a whole block of %d bytes", around)
	before := make([]int, len(kept))
	total := 0
	for i, name := range kept {
		before[i] = residentPages(t, pm, m.ck.Mapped(name), page)
		total += before[i]
	}
	require.NotZero(t, total, "the run read tensors in place")
	releaseUnread(m.ck, m.b, slices.Values(m.ck.Names()))
	for i, name := range kept {
		require.Equal(t, before[i], residentPages(t, pm, m.ck.Mapped(name), page), "%s is read in place, yet was released", name)
	}
}
