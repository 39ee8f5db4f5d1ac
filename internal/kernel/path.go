package kernel

import "fmt"

// Path names the kernel path chosen at start-up from the CPU's features:
// "go" (the plain-Go twins: no AVX2 and FMA, the purego build tag, or
// K3_KERNEL=go), "avx2", or "avx512" (AVX-512VL's 32 registers, 256-bit
// lanes in the dot-form tiles, and the 512-bit kernels that pay at any FMA
// width: bf16 weights laid out k-major for the k-major tiles, KMajorFast,
// the exponentials, the indexer's tile and MatAccumulate's), or
// "avx512-ymm" where K3_KERNEL=avx512 keeps every kernel off the zmm
// registers, then "+zmm" where the packed GEMM, the dot-form tiles and the
// state passes run 512-bit FMAs too (WideFMA: the CPU runs them at about
// twice the 256-bit rate, or K3_KERNEL=zmm forces them) and "+bf16" where the opt-in fast
// product has VDPBF16PS, then "+amx" where the AMX tiles run the long
// products of bf16 weights (AMXAvailable: the CPU has AMX-BF16 and the
// path is not capped), or "+amx-emulated" where K3_AMX=emulate stands the
// tiles' plain-Go twin in for them (AMXEmulated). K3_KERNEL=go, avx2 or avx512 caps the path below
// what the CPU has; zmm forces the 512-bit tile on any AVX-512 CPU and
// keeps the AMX tiles off; halfzmm keeps the 512-bit kernels that pay at
// any FMA width and takes the 256-bit ones where the choice follows it
// (wideFMA false: what a CPU that runs 512-bit FMAs as two halves, such
// as the Zen 4, chooses, so that a full-width CPU can test that path); amx (opt-in) lays bf16 weights out for the
// tiles, so that every product runs there ("+amxweights", AMXPreferred).
// A value it does not understand is reported here and otherwise ignored;
// a path the CPU (or a purego build) cannot run is reported too, so that
// a run under K3_KERNEL says which path it exercised.
func Path() string {
	p := "go"
	switch {
	case useAVX512 && !hasZMM:
		p = "avx512-ymm"
	case useAVX512:
		p = "avx512"
	case useAVX2:
		p = "avx2"
	}
	if wideFMA() {
		p += "+zmm"
	}
	if hasBF16Dot {
		p += "+bf16"
	}
	switch {
	case amxEmulated:
		p += "+amx-emulated"
	case hasAMX:
		p += "+amx"
	}
	if amxPreferred {
		p += "+amxweights"
	}
	runs := true
	switch f := forcedPath(); f {
	case "", "go":
	case "avx2":
		runs = useAVX2
	case "avx512", "zmm", "halfzmm":
		runs = useAVX512
	case "amx":
		runs = hasAMX
	default:
		return fmt.Sprintf("%s (K3_KERNEL=%q not understood: want go, avx2, avx512, zmm, halfzmm or amx)", p, f)
	}
	if !runs {
		return fmt.Sprintf("%s (K3_KERNEL=%s does not run here)", p, forcedPath())
	}
	return p
}
