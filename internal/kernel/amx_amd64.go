//go:build !purego

package kernel

import (
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/cpu"
)

// amxCPU reports that the CPU has AMX-BF16 (with AVX512_BF16, which every
// AMX CPU has) and K3_KERNEL does not cap the path below AVX-512.
var amxCPU = cpu.X86.HasAMXTile && cpu.X86.HasAMXBF16 && hasBF16Dot

// hasAMX reports that the AMX product runs here: the CPU has AMX-BF16,
// Linux granted the process the tile data state, and K3_KERNEL does not
// cap the path (go, avx2, avx512 and zmm all do).
var hasAMX = amxCPU && forced != "zmm" && amxPermission() || amxEmulated

// amxEmulated reports that the AMX paths run here without AMX tiles
// (K3_AMX=emulate, on a CPU with AVX512_BF16 and BW, which the paths'
// other kernels use): the backends choose them as on an AMX CPU and every
// tile product runs its plain-Go twin (amxTilesGo), so that the tests and
// k3 conform check the AMX paths' callers on a machine without AMX. It is
// slow, a correctness mode only; K3_KERNEL caps it as it caps the tiles.
var amxEmulated = os.Getenv("K3_AMX") == "emulate" && !amxCPU && hasBF16Dot && hasAVX512BW && forced != "zmm"

// amxPreferred reports that the backend lays bf16 weights out for the
// tiles, so that every product runs there: opt-in, with K3_KERNEL=amx.
// It is not the default because the tiles stall at their first
// instructions after a while unused, which each of a decode step's many
// short products pays, so batch-1 decode would regress (ARCHITECTURE,
// docs/bench); by default only long products take the tiles.
var amxPreferred = hasAMX && forced == "amx"

// Linux enables the tile data state (XTILEDATA, 8 KB per thread) only for
// processes that ask: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA),
// once, for every thread of the process. Go's signal stacks (32 KB) hold
// the larger signal frame this brings. An AMX kernel loads its tile
// configuration on entry and releases it on return, and Go never preempts
// inside assembly, so no goroutine sees another's tiles.
const (
	archReqXcompPerm  = 0x1023
	xfeatureXtiledata = 18
)

var amxPermission = sync.OnceValue(func() bool {
	_, _, errno := syscall.RawSyscall(syscall.SYS_ARCH_PRCTL, archReqXcompPerm, xfeatureXtiledata, 0)
	return errno == 0
})

//go:noescape
func amxTiles2(cfg *amxConfig, a *uint16, astride int, b *uint16, kb int, c *float32, cstride, groups, pstride, acc, stream int)

//go:noescape
func amxTiles1(cfg *amxConfig, a *uint16, astride int, b *uint16, kb int, c *float32, cstride, groups int)

//go:noescape
func repackKMajorAMXAVX512(dst, src *uint16, pairs, pstride int, idx *[32]uint16)

//go:noescape
func amxPeakLoop(cfg *amxConfig, n int)

//go:noescape
func amxStepLoop(cfg *amxConfig, n int, a, b *uint16, c *float32, mode int)

//go:noescape
func splitBF16AVX512(hi, mid, lo *uint16, x *float32, n int)

//go:noescape
func sum3AVX512(dst, a, b, c *float32, n int)

//go:noescape
func roundBF16AVX512(dst *uint16, x *float32, n int)
