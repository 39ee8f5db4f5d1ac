package ascend

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/ascend/internal/acl"
)

// The host driver refuses what ACL refuses, with the same error classes.
func TestHostDriverChecks(t *testing.T) {
	d := newHostDriver()
	p, err := d.malloc(1024)
	require.NoError(t, err)
	s, err := d.newStream()
	require.NoError(t, err)
	pin, err := d.mallocHost(64)
	require.NoError(t, err)

	// Host memory that is not pinned, and addresses outside the device.
	other := &hostPinned{d: d, b: make([]byte, 64)}
	require.ErrorIs(t, s.upload(p, other, 0, 64), ErrInvalidArgument)
	require.ErrorIs(t, s.upload(p.Add(1000), pin, 0, 64), ErrInvalidArgument)
	require.ErrorIs(t, s.download(pin, 8, p, 64), ErrInvalidArgument)

	// Queued work runs only at a synchronisation.
	copy(pin.Bytes(), []byte{1, 2, 3, 4})
	require.NoError(t, s.upload(p, pin, 0, 4))
	require.NoError(t, s.Memset(p.Add(4), 9, 4))
	mem, err := d.mem(p, 8, "test")
	require.NoError(t, err)
	assert.NotEqual(t, []byte{1, 2, 3, 4, 9, 9, 9, 9}, mem)
	require.NoError(t, s.Sync())
	assert.Equal(t, []byte{1, 2, 3, 4, 9, 9, 9, 9}, mem)

	// Two phases: a workspace smaller than asked for, a consumed executor.
	x, err := d.newTensor(acl.TensorDesc{DType: acl.Float, Dims: []int64{2, 3}, Data: p})
	require.NoError(t, err)
	w, err := d.newTensor(acl.TensorDesc{DType: acl.Float, Dims: []int64{3, 4}, Data: p.Add(64)})
	require.NoError(t, err)
	o, err := d.newTensor(acl.TensorDesc{DType: acl.Float, Dims: []int64{2, 4}, Data: p.Add(128)})
	require.NoError(t, err)
	_, err = d.matmul("aclnnMatmul", x, x, o, 0)
	require.ErrorIs(t, err, ErrInvalidArgument)
	op, err := d.matmul("aclnnMatmul", x, w, o, 0)
	require.NoError(t, err)
	require.Equal(t, 16, op.workspace())
	require.ErrorIs(t, op.launch(s, p.Add(1020)), ErrInvalidArgument)
	op, err = d.matmul("aclnnMatmul", x, w, o, 0)
	require.NoError(t, err)
	require.NoError(t, op.launch(s, p.Add(512)))
	require.ErrorIs(t, op.launch(s, p.Add(512)), ErrInvalidArgument)
	require.NoError(t, s.Sync())

	// A destroyed descriptor, a view past its storage, foreign memory.
	require.NoError(t, x.Destroy())
	_, err = d.unary("aclnnSilu", x, o)
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = d.newTensor(acl.TensorDesc{DType: acl.Float, Dims: []int64{300}, Data: p})
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = d.newTensor(acl.TensorDesc{DType: acl.Float, Dims: []int64{4}, Data: acl.HostDevPtr(make([]byte, 16))})
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = d.unary("aclnnErfinv", o, o)
	require.ErrorIs(t, err, ErrKernelMissing)

	// A capturing stream cannot be synchronised.
	_, err = s.capture(func() error { return s.Sync() })
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.NoError(t, d.free(p))
	require.ErrorIs(t, d.free(p), ErrInvalidArgument)
}
