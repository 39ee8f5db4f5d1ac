package floatx

import (
	"math"
	"testing"
)

// next16 returns the value of the 16-bit pattern after h in the positive
// finite range, treating the first infinity as the power of two it stands
// for, so that midpoints next to the overflow threshold are tested too.
func checkRounding16(t *testing.T, name string, widen func(uint16) float32, narrow func(float32) uint16, infBits uint16, infValue float64) {
	t.Helper()
	for p := 0; p < 1<<16; p++ {
		h := uint16(p)
		f := widen(h)
		if f != f {
			if g := narrow(f); widen(g) == widen(g) {
				t.Fatalf("%s: NaN %#04x narrowed to non-NaN %#04x", name, h, g)
			}
			continue
		}
		if g := narrow(f); g != h {
			t.Fatalf("%s: round trip %#04x -> %g -> %#04x", name, h, f, g)
		}
	}
	for _, sign := range []uint16{0, 0x8000} {
		for h := uint16(0); h < infBits; h++ {
			a := float64(widen(h))
			b := infValue
			if h+1 < infBits {
				b = float64(widen(h + 1))
			}
			mid := float32((a + b) / 2)
			if float64(mid) != (a+b)/2 {
				t.Fatalf("%s: midpoint of %#04x not exact in float32", name, h)
			}
			even := h
			if h&1 == 1 {
				even = h + 1
			}
			s := float32(1)
			if sign != 0 {
				s = -1
			}
			if g := narrow(s * mid); g != sign|even {
				t.Fatalf("%s: tie %g between %#04x and %#04x gave %#04x, want %#04x", name, s*mid, h, h+1, g, sign|even)
			}
			below := float32(math.Nextafter32(mid, 0))
			above := float32(math.Nextafter32(mid, float32(math.Inf(1))))
			if g := narrow(s * below); g != sign|h {
				t.Fatalf("%s: %g just below the midpoint gave %#04x, want %#04x", name, s*below, g, sign|h)
			}
			if g := narrow(s * above); g != sign|(h+1) {
				t.Fatalf("%s: %g just above the midpoint gave %#04x, want %#04x", name, s*above, g, sign|(h+1))
			}
		}
	}
}

func TestBF16AllPatterns(t *testing.T) {
	checkRounding16(t, "bf16", FromBF16, BF16, 0x7f80, math.Ldexp(1, 128))
}

func TestF16AllPatterns(t *testing.T) {
	checkRounding16(t, "f16", FromF16, F16, 0x7c00, 65536)
}

func TestSpecialValues(t *testing.T) {
	inf := float32(math.Inf(1))
	cases := []struct {
		name string
		got  uint16
		want uint16
	}{
		{"bf16 +Inf", BF16(inf), 0x7f80},
		{"bf16 -Inf", BF16(-inf), 0xff80},
		{"bf16 -0", BF16(float32(math.Copysign(0, -1))), 0x8000},
		{"bf16 1", BF16(1), 0x3f80},
		{"bf16 max float32 overflows", BF16(math.MaxFloat32), 0x7f80},
		{"bf16 NaN low payload", BF16(math.Float32frombits(0x7f800001)) & 0x7fc0, 0x7fc0},
		{"f16 1", F16(1), 0x3c00},
		{"f16 65504", F16(65504), 0x7bff},
		{"f16 65520 ties to Inf", F16(65520), 0x7c00},
		{"f16 smallest subnormal", F16(float32(math.Ldexp(1, -24))), 0x0001},
		{"f16 half smallest subnormal ties to 0", F16(float32(math.Ldexp(1, -25))), 0x0000},
		{"f16 largest subnormal", F16(float32(math.Ldexp(1023, -24))), 0x03ff},
		{"f16 -Inf", F16(-inf), 0xfc00},
		{"f16 tiny float32", F16(math.SmallestNonzeroFloat32), 0},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s: got %#04x want %#04x", c.name, c.got, c.want)
		}
	}
	if v := FromF16(0x0001); float64(v) != math.Ldexp(1, -24) {
		t.Errorf("f16 0x0001 = %g", v)
	}
	if v := FromF16(0x7e00); v == v {
		t.Errorf("f16 0x7e00 is not NaN")
	}
}

func TestE4M3Table(t *testing.T) {
	want := map[uint8]float64{
		0x00: 0, 0x01: math.Ldexp(1, -9), 0x07: 7 * math.Ldexp(1, -9), 0x08: math.Ldexp(1, -6),
		0x38: 1, 0x3c: 1.5, 0x7e: 448, 0xfe: -448, 0x40: 2, 0xb8: -1,
	}
	for b, v := range want {
		if float64(FromE4M3(b)) != v {
			t.Errorf("e4m3 %#02x = %g, want %g", b, FromE4M3(b), v)
		}
	}
	for _, b := range []uint8{0x7f, 0xff} {
		if v := FromE4M3(b); v == v {
			t.Errorf("e4m3 %#02x should be NaN, got %g", b, v)
		}
	}
	for i := 0; i < 256; i++ {
		b := uint8(i)
		if b&0x7f == 0x7f {
			continue
		}
		if g := E4M3(FromE4M3(b)); g != b {
			t.Errorf("e4m3 round trip %#02x -> %g -> %#02x", b, FromE4M3(b), g)
		}
	}
	// Ties to even, and saturation.
	for b := uint8(0); b < 0x7e; b++ {
		a, c := float64(FromE4M3(b)), float64(FromE4M3(b+1))
		even := b
		if b&1 == 1 {
			even = b + 1
		}
		if g := E4M3(float32((a + c) / 2)); g != even {
			t.Errorf("e4m3 tie between %#02x and %#02x gave %#02x", b, b+1, g)
		}
	}
	if g := E4M3(1e6); g != 0x7e {
		t.Errorf("e4m3 saturation gave %#02x", g)
	}
	if g := E4M3(-1e6); g != 0xfe {
		t.Errorf("e4m3 negative saturation gave %#02x", g)
	}
}

func TestBlockDequant(t *testing.T) {
	rows, cols, block := 5, 7, 4
	w := make([]uint8, rows*cols)
	for i := range w {
		w[i] = uint8(0x30 + i%20)
	}
	scale := []float32{1, 2, 3, 4} // 2×2 blocks
	dst := make([]float32, rows*cols)
	if err := DequantE4M3Weight(dst, w, scale, rows, cols, block, block); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < rows; r++ {
		for c := 0; c < cols; c++ {
			want := FromE4M3(w[r*cols+c]) * scale[(r/block)*2+c/block]
			if dst[r*cols+c] != want {
				t.Fatalf("(%d,%d) = %g want %g", r, c, dst[r*cols+c], want)
			}
		}
	}
	if err := DequantE4M3Weight(dst, w, scale[:3], rows, cols, block, block); err == nil {
		t.Fatal("short scale accepted")
	}

	x := []float32{0.1, -3, 200, 1e-3, 0, 0, 0, 0, 7, -7, 0.5}
	q := make([]uint8, len(x))
	s := make([]float32, 3)
	if err := QuantE4M3Act(q, s, x, 1, len(x), 4); err != nil {
		t.Fatal(err)
	}
	back := make([]float32, len(x))
	if err := DequantE4M3Act(back, q, s, 1, len(x), 4); err != nil {
		t.Fatal(err)
	}
	for i := range x {
		if d := math.Abs(float64(back[i] - x[i])); d > math.Abs(float64(x[i]))/16+float64(s[i/4])*math.Ldexp(1, -10) {
			t.Errorf("act %d: %g -> %g", i, x[i], back[i])
		}
	}
	if s[1] != 1 {
		t.Errorf("zero group scale %g, want 1", s[1])
	}
}
