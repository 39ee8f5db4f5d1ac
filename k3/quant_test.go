package k3

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/floatx"
	"k3/internal/safetensors"
)

// The quantised forms' values, written out from their definitions here
// rather than taken from the code under test.

// e4m3Value is an fp8 e4m3fn byte's value: bias 7, three mantissa bits,
// exponent 0 subnormal.
func e4m3Value(b uint8) float64 {
	e, m := int(b>>3&0xf), float64(b&7)
	v := (1 + m/8) * math.Ldexp(1, e-7)
	if e == 0 {
		v = m / 8 * math.Ldexp(1, -6)
	}
	if b&0x80 != 0 {
		v = -v
	}
	return v
}

// e2m1Value is an fp4 e2m1 nibble's value: bias 1, one mantissa bit.
func e2m1Value(n uint8) float64 {
	e, m := int(n>>1&3), float64(n&1)
	v := (1 + m/2) * math.Ldexp(1, e-1)
	if e == 0 {
		v = m / 2
	}
	if n&8 != 0 {
		v = -v
	}
	return v
}

// quantTensor is one matrix of the test checkpoint in a quantised form:
// the tensors stored, and the bf16 matrix they stand for.
type quantTensor struct {
	stored []safetensors.Tensor
	plain  safetensors.Tensor
}

// tensorFloats reads a float tensor's values.
func tensorFloats(t testing.TB, x safetensors.Tensor) []float32 {
	t.Helper()
	v, err := safetensors.DecodeFloat32(x.DType, x.Data)
	require.NoError(t, err, x.Name)
	return v
}

func bf16Tensor(name string, shape []int, v []float64) safetensors.Tensor {
	h := make([]uint16, len(v))
	for i, x := range v {
		h[i] = floatx.BF16(float32(x))
	}
	return safetensors.U16Tensor(name, safetensors.BF16, shape, h)
}

// fp8Form quantises x to e4m3 with scales of blockRows×blockCols tiles
// (the scale tensor named scaleName, of shape scaleShape, stored as
// scaleType).
func fp8Form(t testing.TB, x safetensors.Tensor, scaleName string, blockRows, blockCols int, scaleShape []int, scaleType safetensors.DType) quantTensor {
	w := tensorFloats(t, x)
	rows, cols := x.Shape[0], x.Shape[1]
	br, bc := (rows+blockRows-1)/blockRows, (cols+blockCols-1)/blockCols
	scale := make([]float32, br*bc)
	for i, v := range w {
		b := (i/cols/blockRows)*bc + i%cols/blockCols
		scale[b] = max(scale[b], float32(math.Abs(float64(v)))/floatx.MaxE4M3)
	}
	for i := range scale {
		if scale[i] == 0 {
			scale[i] = 1
		}
		if scaleType == safetensors.BF16 {
			scale[i] = floatx.FromBF16(floatx.BF16(scale[i]))
		}
	}
	codes := make([]byte, len(w))
	plain := make([]float64, len(w))
	for i, v := range w {
		s := scale[(i/cols/blockRows)*bc+i%cols/blockCols]
		codes[i] = floatx.E4M3(v / s)
		plain[i] = float64(float32(e4m3Value(codes[i])) * s) // the product in float32, then bf16
	}
	st := safetensors.F32Tensor(scaleName, scaleShape, scale)
	if scaleType == safetensors.BF16 {
		h := make([]uint16, len(scale))
		for i, s := range scale {
			h[i] = floatx.BF16(s)
		}
		st = safetensors.U16Tensor(scaleName, safetensors.BF16, scaleShape, h)
	}
	return quantTensor{
		stored: []safetensors.Tensor{{Name: x.Name, DType: safetensors.F8E4M3, Shape: x.Shape, Data: codes}, st},
		plain:  bf16Tensor(x.Name, x.Shape, plain),
	}
}

// mxfp4Form quantises x to MXFP4 (groups of 32 columns, the last partial),
// with a weight_shape tensor of dtype shapeType unless it is "".
func mxfp4Form(t testing.TB, x safetensors.Tensor, shapeType safetensors.DType) quantTensor {
	w := tensorFloats(t, x)
	rows, cols := x.Shape[0], x.Shape[1]
	groups := (cols + 31) / 32
	base := strings.TrimSuffix(x.Name, ".weight")
	packed := make([]byte, rows*cols/2)
	scale := make([]byte, rows*groups)
	plain := make([]float64, len(w))
	for r := range rows {
		for g := range groups {
			lo, hi := r*cols+g*32, r*cols+min((g+1)*32, cols)
			amax := 0.0
			for _, v := range w[lo:hi] {
				amax = max(amax, math.Abs(float64(v)))
			}
			e := -20
			if amax > 0 {
				e = int(math.Ceil(math.Log2(amax / 6)))
			}
			scale[r*groups+g] = uint8(e + 127)
			for i := lo; i < hi; i++ {
				var best uint8
				for n := range uint8(16) {
					if math.Abs(e2m1Value(n)*math.Ldexp(1, e)-float64(w[i])) < math.Abs(e2m1Value(best)*math.Ldexp(1, e)-float64(w[i])) {
						best = n
					}
				}
				packed[i/2] |= best << (4 * (i % 2))
				plain[i] = e2m1Value(best) * math.Ldexp(1, e)
			}
		}
	}
	stored := []safetensors.Tensor{
		{Name: base + ".weight_packed", DType: safetensors.U8, Shape: []int{rows, cols / 2}, Data: packed},
		{Name: base + ".weight_scale", DType: safetensors.U8, Shape: []int{rows, groups}, Data: scale},
	}
	switch shapeType {
	case safetensors.I32:
		stored = append(stored, safetensors.I32Tensor(base+".weight_shape", []int{2}, []int32{int32(rows), int32(cols)}))
	case safetensors.I64:
		b := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, uint64(rows)), uint64(cols))
		stored = append(stored, safetensors.Tensor{Name: base + ".weight_shape", DType: safetensors.I64, Shape: []int{2}, Data: b})
	}
	return quantTensor{stored: stored, plain: bf16Tensor(x.Name, x.Shape, plain)}
}

// quantisedTiny returns the embedded checkpoint's tensors with the routed
// experts in MXFP4 and the other matrices (but the embedding, lm_head and
// the routers) in fp8, cycling through the scale forms, and the same
// checkpoint with those matrices as the bf16 values they stand for.
func quantisedTiny(t testing.TB) (quant, plain []safetensors.Tensor) {
	fp8 := 0
	for _, x := range tinyTensors(t) {
		var q quantTensor
		switch {
		case len(x.Shape) != 2 || !strings.HasSuffix(x.Name, ".weight") ||
			strings.Contains(x.Name, "embed_tokens") || strings.Contains(x.Name, "lm_head") || strings.HasSuffix(x.Name, "block_sparse_moe.gate.weight"):
			quant, plain = append(quant, x), append(plain, x)
			continue
		case strings.Contains(x.Name, ".experts."):
			q = mxfp4Form(t, x, []safetensors.DType{"", safetensors.I32, safetensors.I64}[len(quant)%3])
		default:
			rows, cols := x.Shape[0], x.Shape[1]
			blocks := []int{(rows + 127) / 128, (cols + 127) / 128}
			switch fp8 % 4 {
			case 0:
				q = fp8Form(t, x, x.Name+"_scale_inv", 128, 128, blocks, safetensors.F32)
			case 1:
				q = fp8Form(t, x, x.Name+"_scale", 1, cols, []int{rows, 1}, safetensors.F32)
			case 2:
				q = fp8Form(t, x, x.Name+"_scale", rows, cols, []int{1}, safetensors.BF16)
			case 3:
				q = fp8Form(t, x, x.Name+"_scale", 1, cols, []int{rows}, safetensors.BF16)
			}
			fp8++
		}
		quant, plain = append(quant, q.stored...), append(plain, q.plain)
	}
	return quant, plain
}

// writeTiny writes the embedded checkpoint's other files and tensors ts
// into a new directory.
func writeTiny(t testing.TB, ts []safetensors.Tensor) string {
	dir := t.TempDir()
	for name, f := range tinyFS(t) {
		if name != "model.safetensors" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), f.Data, 0o644))
		}
	}
	require.NoError(t, safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil))
	return dir
}

// TestQuantisedWeights: a checkpoint with MXFP4 experts and fp8 matrices
// (every scale form) gives, bitwise, the logits of the bf16 checkpoint of
// the values they stand for, alone and split over ranks.
func TestQuantisedWeights(t *testing.T) {
	ctx := context.Background()
	quant, plain := quantisedTiny(t)
	var packed, fp8 int
	for _, x := range quant {
		packed += b2i(strings.HasSuffix(x.Name, ".weight_packed"))
		fp8 += b2i(x.DType == safetensors.F8E4M3)
	}
	require.Positive(t, packed)
	require.Positive(t, fp8)

	prompt := make([]int32, 37)
	for i := range prompt {
		prompt[i] = int32((i*131 + 7) % 512)
	}
	const steps = 6
	held := map[string]int64{}
	run := func(dir string) ([]float32, []int32) {
		m, err := Load(ctx, dir)
		require.NoError(t, err)
		defer m.Close()
		held[dir] = m.ShardBytes()
		s, err := m.NewSession()
		require.NoError(t, err)
		defer s.Close()
		return runAlone(t, s, prompt, steps)
	}
	qdir, pdir := writeTiny(t, quant), writeTiny(t, plain)
	got, gotToks := run(qdir)
	want, wantToks := run(pdir)
	assert.Equal(t, held[pdir], held[qdir], "ShardBytes counts the bf16 copies")
	require.Equal(t, wantToks, gotToks)
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, math.Float32bits(want[i]), math.Float32bits(got[i]), "logit %d: %g against %g", i, got[i], want[i])
	}
	// The quantisation moved the logits: the comparison is not between
	// two copies of the original.
	orig, _ := run(writeTiny(t, tinyTensors(t)))
	assert.NotEqual(t, orig, got)

	// Split over ranks, each rank's experts and the other ranks' (counted
	// as used without being read) load.
	g, err := LoadGroup(ctx, qdir, Layout{TP: 2, EP: 2})
	require.NoError(t, err)
	defer g.Close()
	gs, err := g.NewSession()
	require.NoError(t, err)
	defer gs.Close()
	row, err := gs.Forward(ctx, prompt)
	require.NoError(t, err)
	scale := maxAbsF(want)
	for i := range row {
		require.InDelta(t, want[i], row[i], 1e-4*scale, "rank group logit %d", i)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestQuantisedWeightErrors: a quantised tensor in a form k3 cannot read,
// or inconsistent with its companions, is an error naming it.
func TestQuantisedWeightErrors(t *testing.T) {
	quant, _ := quantisedTiny(t)
	index := func(pred func(safetensors.Tensor) bool) int {
		for i, x := range quant {
			if pred(x) {
				return i
			}
		}
		t.Fatal("no such tensor")
		return -1
	}
	scale := index(func(x safetensors.Tensor) bool {
		return strings.HasSuffix(x.Name, ".weight_scale") && x.DType == safetensors.U8
	})
	pk := index(func(x safetensors.Tensor) bool { return strings.HasSuffix(x.Name, ".weight_packed") })
	shape := index(func(x safetensors.Tensor) bool { return strings.HasSuffix(x.Name, ".weight_shape") })
	fp8 := index(func(x safetensors.Tensor) bool { return x.DType == safetensors.F8E4M3 })
	fp8Scale := index(func(x safetensors.Tensor) bool { return x.Name == quant[fp8].Name+"_scale_inv" })
	rowScale := index(func(x safetensors.Tensor) bool {
		return strings.HasSuffix(x.Name, ".weight_scale") && x.DType == safetensors.F32 && len(x.Shape) == 2 && x.Shape[0] >= 4 && x.Shape[0]%2 == 0
	})
	base := func(i int) string { return quant[i].Name[:strings.LastIndex(quant[i].Name, ".")] }
	cases := []struct {
		name string
		edit func(ts []safetensors.Tensor) []safetensors.Tensor
		want []string
	}{
		{"NaN scale", func(ts []safetensors.Tensor) []safetensors.Tensor {
			ts[scale].Data = slices.Clone(ts[scale].Data)
			ts[scale].Data[0] = 0xff
			return ts
		}, []string{base(scale) + ".weight_packed", "row 0", "NaN"}},
		{"overflow", func(ts []safetensors.Tensor) []safetensors.Tensor {
			ts[scale].Data = slices.Clone(ts[scale].Data)
			ts[scale].Data[0] = 254
			i := index(func(x safetensors.Tensor) bool { return x.Name == base(scale)+".weight_packed" })
			ts[i].Data = slices.Clone(ts[i].Data)
			ts[i].Data[0] = 0x77 // 6 and 6
			return ts
		}, []string{base(scale) + ".weight_packed", "overflows"}},
		{"scale missing", func(ts []safetensors.Tensor) []safetensors.Tensor {
			return slices.Delete(ts, scale, scale+1)
		}, []string{quant[scale].Name}},
		{"scale of the wrong shape", func(ts []safetensors.Tensor) []safetensors.Tensor {
			ts[scale].Shape = []int{1, len(ts[scale].Data)}
			return ts
		}, []string{quant[scale].Name, "shape"}},
		{"NVFP4", func(ts []safetensors.Tensor) []safetensors.Tensor {
			return append(ts, safetensors.F32Tensor(base(pk)+".weight_global_scale", []int{1}, []float32{1}))
		}, []string{quant[pk].Name, "NVFP4"}},
		{"int4 packs", func(ts []safetensors.Tensor) []safetensors.Tensor {
			ts[pk].DType, ts[pk].Shape = safetensors.I32, []int{ts[pk].Shape[0], ts[pk].Shape[1] / 4}
			return ts
		}, []string{quant[pk].Name, "I32", "not supported"}},
		{"weight_shape disagrees", func(ts []safetensors.Tensor) []safetensors.Tensor {
			ts[shape] = safetensors.I32Tensor(quant[shape].Name, []int{2}, []int32{3, 4})
			return ts
		}, []string{quant[shape].Name, "[3 4]"}},
		{"fp8 without a scale", func(ts []safetensors.Tensor) []safetensors.Tensor {
			return slices.Delete(ts, fp8Scale, fp8Scale+1)
		}, []string{quant[fp8].Name, "no " + quant[fp8].Name + "_scale_inv"}},
		{"fp8 block scale of the wrong shape", func(ts []safetensors.Tensor) []safetensors.Tensor {
			ts[fp8Scale].Shape = []int{len(ts[fp8Scale].Data) / 4}
			return ts
		}, []string{quant[fp8Scale].Name, "shape"}},
		{"fp8 scale of no known form", func(ts []safetensors.Tensor) []safetensors.Tensor {
			r := ts[rowScale].Shape[0]
			ts[rowScale] = safetensors.F32Tensor(quant[rowScale].Name, []int{r / 2, 2}, tensorFloats(t, ts[rowScale]))
			return ts
		}, []string{quant[rowScale].Name, fmt.Sprintf("[%d 2]", quant[rowScale].Shape[0]/2)}},
		{"fp8 vector", func(ts []safetensors.Tensor) []safetensors.Tensor {
			ts[fp8].Shape = []int{len(ts[fp8].Data)}
			return ts
		}, []string{quant[fp8].Name, "want a matrix"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeTiny(t, tc.edit(slices.Clone(quant)))
			_, err := Load(context.Background(), dir)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrCheckpoint)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}
