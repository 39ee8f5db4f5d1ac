package k3

import (
	"context"
	"testing"
)

func TestLogitsTensor(t *testing.T) {
	m := load(t)
	s, _ := m.NewSession()
	if s.Logits() != nil {
		t.Error("logits before any token")
	}
	out, err := s.Forward(context.Background(), []int32{1, 2, 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	lt := s.Logits()
	v := m.Config.VocabSize
	if lt.Shape()[0] != v {
		t.Fatalf("shape %v", lt.Shape())
	}
	data := lt.Data().([]float32)
	for i := 0; i < v; i++ {
		if data[i] != out[2*v+i] {
			t.Fatalf("logit %d: %v vs %v", i, data[i], out[2*v+i])
		}
	}
}
