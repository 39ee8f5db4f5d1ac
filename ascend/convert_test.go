package ascend

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
)

func TestHostBytes(t *testing.T) {
	f32 := make([]byte, 8)
	binary.LittleEndian.PutUint32(f32, math.Float32bits(1.5))
	binary.LittleEndian.PutUint32(f32[4:], math.Float32bits(-3))
	bf, err := hostBytes(compute.BF16, compute.F32, f32, 2)
	require.NoError(t, err)
	assert.Equal(t, []byte{0xc0, 0x3f, 0x40, 0xc0}, bf) // 0x3fc0, 0xc040
	back, err := hostBytes(compute.F32, compute.BF16, bf, 2)
	require.NoError(t, err)
	assert.Equal(t, f32, back)
	same, err := hostBytes(compute.F32, compute.F32, f32, 2)
	require.NoError(t, err)
	assert.Equal(t, f32, same)

	_, err = hostBytes(compute.F32, compute.F32, f32, 3)
	assert.ErrorIs(t, err, compute.ErrShape)
	_, err = hostBytes(compute.F32, compute.I32, f32, 2)
	assert.ErrorIs(t, err, compute.ErrUnsupported)
}
