package k3

import "gorgonia.org/tensor"

// Logits returns the session's next-token logits (after its last token) as
// a gorgonia tensor of shape [vocab], for applications that post-process
// them with gorgonia. It is a copy; nil before the session holds a token.
func (s *Session) Logits() *tensor.Dense {
	if s.last == nil {
		return nil
	}
	v := append([]float32(nil), s.last...)
	return tensor.New(tensor.WithShape(len(v)), tensor.WithBacking(v))
}
