package serve

import (
	"context"
	"io"
	"iter"

	"k3/k3"
)

// engine is what a Server runs on: one model (New) or a model split over
// the ranks of a group (NewGroup). It hands out sequences and runs their
// generations in its batcher's passes.
type engine interface {
	newSeq() (seq, error)
	loadSeq(r io.Reader) (seq, error)
	generate(ctx context.Context, s seq, prompt []int32, opts []k3.GenerateOption) iter.Seq2[k3.Token, error]
	prefill(ctx context.Context, s seq, prompt []int32) (cached int, err error)
	stats() k3.BatcherStats
	memory() k3.MemoryUsage
	start(ctx context.Context) error
	warm(ctx context.Context) error
	wait() error
}

// seq is one sequence of an engine: a *k3.Session, or a *k3.GroupSession
// on a group. An engine takes only its own.
type seq interface {
	Forward(ctx context.Context, tokens []int32) ([]float32, error)
	Truncate(ctx context.Context, n int) error
	Tokens() []int32
	Save(w io.Writer) error
	Close() error
	fork() (seq, error)
}

type lone struct{ *k3.Session }

func (s lone) fork() (seq, error) {
	f, err := s.Fork()
	if err != nil {
		return nil, err
	}
	return lone{f}, nil
}

type grouped struct{ *k3.GroupSession }

func (s grouped) fork() (seq, error) {
	f, err := s.Fork()
	if err != nil {
		return nil, err
	}
	return grouped{f}, nil
}

// loneEngine is one model and its Batcher.
type loneEngine struct {
	m *k3.Model
	b *k3.Batcher
}

func (e loneEngine) newSeq() (seq, error) {
	s, err := e.m.NewSession()
	if err != nil {
		return nil, err
	}
	return lone{s}, nil
}

func (e loneEngine) loadSeq(r io.Reader) (seq, error) {
	s, err := e.m.LoadSession(r)
	if err != nil {
		return nil, err
	}
	return lone{s}, nil
}

func (e loneEngine) generate(ctx context.Context, s seq, prompt []int32, opts []k3.GenerateOption) iter.Seq2[k3.Token, error] {
	return e.b.GenerateTokens(ctx, s.(lone).Session, prompt, opts...)
}

func (e loneEngine) prefill(ctx context.Context, s seq, prompt []int32) (int, error) {
	return e.b.Prefill(ctx, s.(lone).Session, prompt)
}

func (e loneEngine) stats() k3.BatcherStats          { return e.b.Stats() }
func (e loneEngine) memory() k3.MemoryUsage          { return e.m.MemoryUsage() }
func (e loneEngine) start(ctx context.Context) error { return e.b.Start(ctx) }
func (e loneEngine) warm(ctx context.Context) error  { return e.b.Warm(ctx) }
func (e loneEngine) wait() error                     { return e.b.Wait() }

// groupEngine is a group and its GroupBatcher.
type groupEngine struct {
	g *k3.Group
	b *k3.GroupBatcher
}

func (e groupEngine) newSeq() (seq, error) {
	s, err := e.g.NewSession()
	if err != nil {
		return nil, err
	}
	return grouped{s}, nil
}

func (e groupEngine) loadSeq(r io.Reader) (seq, error) {
	s, err := e.g.LoadSession(r)
	if err != nil {
		return nil, err
	}
	return grouped{s}, nil
}

func (e groupEngine) generate(ctx context.Context, s seq, prompt []int32, opts []k3.GenerateOption) iter.Seq2[k3.Token, error] {
	return e.b.GenerateTokens(ctx, s.(grouped).GroupSession, prompt, opts...)
}

func (e groupEngine) prefill(ctx context.Context, s seq, prompt []int32) (int, error) {
	return e.b.Prefill(ctx, s.(grouped).GroupSession, prompt)
}

func (e groupEngine) stats() k3.BatcherStats { return e.b.Stats() }

// memory is the usage of the rank nearest its budget (the first to
// refuse a pass), or without a budget rank 0's.
func (e groupEngine) memory() k3.MemoryUsage {
	var top k3.MemoryUsage
	for r, m := range e.g.Ranks() {
		u := m.MemoryUsage()
		if r == 0 || u.Budget > 0 && top.Budget > 0 && float64(u.Used)/float64(u.Budget) > float64(top.Used)/float64(top.Budget) {
			top = u
		}
	}
	return top
}

func (e groupEngine) start(ctx context.Context) error { return e.b.Start(ctx) }
func (e groupEngine) warm(ctx context.Context) error  { return e.b.Warm(ctx) }
func (e groupEngine) wait() error                     { return e.b.Wait() }
