package kernel

import "fmt"

// Path names the kernel path chosen at start-up from the CPU's features:
// "go" (the plain-Go twins: no AVX2 and FMA, the purego build tag, or
// K3_KERNEL=go), "avx2", "avx512" (AVX-512VL's 32 registers, 256-bit
// lanes) or "avx512+bf16" (also the opt-in fast product on VDPBF16PS).
// The environment variable K3_KERNEL=go, avx2 or avx512 caps the path
// below what the CPU has; a value it does not understand is reported here
// and otherwise ignored.
func Path() string {
	p := "go"
	switch {
	case hasBF16Dot:
		p = "avx512+bf16"
	case useAVX512:
		p = "avx512"
	case useAVX2:
		p = "avx2"
	}
	switch forcedPath() {
	case "", "go", "avx2", "avx512":
		return p
	}
	return fmt.Sprintf("%s (K3_KERNEL=%q not understood: want go, avx2 or avx512)", p, forcedPath())
}
