package tensor

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/k3"
)

func TestLogits(t *testing.T) {
	m, err := k3.LoadTiny(context.Background())
	require.NoError(t, err)
	defer m.Close()
	s, err := m.NewSession()
	require.NoError(t, err)
	assert.Nil(t, Logits(s), "before any token")
	out, err := s.Forward(context.Background(), []int32{1, 2, 3})
	require.NoError(t, err)
	v := m.VocabSize()
	lt := Logits(s)
	require.Equal(t, []int{v}, []int(lt.Shape()))
	assert.Equal(t, out[2*v:], lt.Data().([]float32), "the last position's logits")

	rows, err := Rows(out, v)
	require.NoError(t, err)
	assert.Equal(t, []int{3, v}, []int(rows.Shape()))
	got, err := rows.At(2, 7)
	require.NoError(t, err)
	assert.Equal(t, out[2*v+7], got)
	_, err = Rows(out[1:], v)
	assert.Error(t, err)
}
