// Package tensor hands k3's results to gorgonia.org/tensor, for
// applications that post-process logits with gorgonia. It is the SDK's one
// dependency on gorgonia: programs that import only k3/k3 neither download
// nor link it.
package tensor

import (
	"fmt"

	"gorgonia.org/tensor"

	"k3/k3"
)

// Logits returns the session's next-token logits (after its last token) as
// a gorgonia tensor of shape [vocab]. It is a copy; nil before the session
// holds a token.
func Logits(s *k3.Session) *tensor.Dense {
	v := s.Logits()
	if v == nil {
		return nil
	}
	return tensor.New(tensor.WithShape(len(v)), tensor.WithBacking(v))
}

// Rows returns logits of several positions ([n*vocab] row-major, as
// Session.Forward returns them) as a gorgonia tensor of shape [n, vocab],
// sharing the slice.
func Rows(logits []float32, vocab int) (*tensor.Dense, error) {
	if vocab <= 0 || len(logits)%vocab != 0 {
		return nil, fmt.Errorf("tensor: %d logits are not rows of a vocabulary of %d", len(logits), vocab)
	}
	return tensor.New(tensor.WithShape(len(logits)/vocab, vocab), tensor.WithBacking(logits)), nil
}
