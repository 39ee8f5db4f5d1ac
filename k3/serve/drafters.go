package serve

import (
	"context"
	"io"
	"iter"
	"sync"

	"k3/k3"
	"k3/specdec"
)

// drafters lends each generation a drafter of its own (Config.NewDrafter):
// one that a finished generation gave back, or a new one. A drafter such
// as k3.DSpark follows one sequence at a time, so the server holds as
// many as generations ran at once, up to limit (the sequences the
// scheduler runs: a DSpark holds a block of logits over the vocabulary,
// megabytes on a large model, outside the memory budget), and closes them
// with the server. A generation that finds none to take decodes plainly:
// the server does not sample by rejection, so its tokens are the same.
type drafters struct {
	make     func() (specdec.Drafter, error)
	depth    int
	adaptive bool
	limit    int

	mu     sync.Mutex
	free   []specdec.Drafter
	made   int
	closed bool

	// watch, when set (by tests), sees each drafter a generation takes
	// and gives back.
	watch func(d specdec.Drafter, taken bool)
}

// get takes a drafter given back, or makes one; nil when limit are out.
func (p *drafters) get() (specdec.Drafter, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		d := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return d, nil
	}
	if p.made >= p.limit {
		p.mu.Unlock()
		return nil, nil
	}
	p.made++
	p.mu.Unlock()
	d, err := p.make()
	if err != nil {
		p.mu.Lock()
		p.made--
		p.mu.Unlock()
	}
	return d, err
}

// put gives d back; after close it is closed instead.
func (p *drafters) put(d specdec.Drafter) {
	p.mu.Lock()
	if !p.closed {
		p.free = append(p.free, d)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	closeDrafter(d)
}

// close closes the drafters given back, and those given back later.
func (p *drafters) close() {
	p.mu.Lock()
	free := p.free
	p.free, p.closed = nil, true
	p.mu.Unlock()
	for _, d := range free {
		closeDrafter(d)
	}
}

func closeDrafter(d specdec.Drafter) {
	if c, ok := d.(io.Closer); ok {
		c.Close()
	}
}

// option is the speculation option of a generation that drafts with d.
func (p *drafters) option(d specdec.Drafter) k3.GenerateOption {
	if p.adaptive {
		return k3.WithAdaptiveSpeculation(d, p.depth)
	}
	return k3.WithSpeculation(d, p.depth)
}

// generate runs a generation of session ss in the batcher. With
// per-generation drafters it takes one when the generation starts (the
// batcher submits it when its tokens are first asked for) and gives it
// back when the generation ends, however it ends.
func (s *Server) generate(ctx context.Context, ss seq, prompt []int32, opts []k3.GenerateOption) iter.Seq2[k3.Token, error] {
	p := s.drafters
	if p == nil {
		return s.e.generate(ctx, ss, prompt, opts)
	}
	return func(yield func(k3.Token, error) bool) {
		d, err := p.get()
		if err != nil {
			yield(k3.Token{}, err)
			return
		}
		o := opts
		if d != nil { // else none is free: plain decoding
			if p.watch != nil {
				p.watch(d, true)
			}
			defer func() {
				if p.watch != nil {
					p.watch(d, false)
				}
				p.put(d)
			}()
			o = append(o[:len(o):len(o)], p.option(d))
		}
		for tok, err := range s.e.generate(ctx, ss, prompt, o) {
			if !yield(tok, err) {
				return
			}
		}
	}
}
