// Package replay implements ReplaySSM for KDA layers: a checkpoint of the
// recurrent state and of the short-conv window, plus a ring of compact
// per-token records, so that rolling back a rejected speculation, or
// recovering the state at any recent position, replays a few cheap steps
// instead of keeping one state per draft position.
//
// A KDA step with decay α = e^g (per key channel), key k, value v and
// strength β is S_t = (I − β k kᵀ) Diag(α) S_{t−1} + β k vᵀ. With the
// corrected value u_t = β (v_t − (Diag(α_t) S_{t−1})ᵀ k_t) it is
//
//	S_t = Diag(α_t) S_{t−1} + k_t u_tᵀ
//
// which needs no dot product: a record (k, α, u) and the previous state
// give the next state, so replaying n records from a checkpoint is n
// decay-and-rank-1 passes. Storing u rather than v is what keeps replay
// this cheap (with v, each step would need S_{t−1}ᵀ k first).
//
// States are V-first, as k3 keeps them: [heads, DV, DK], row v of a head is
// column v of the equations' S. Replay updates each row with
// kernel.RowUpdateDot, the arithmetic of the decode step's state pass
// (kernel.KDARows) through kernel.ReplayRows, so a replayed state is
// bitwise the state the decode steps produced.
package replay

import (
	"errors"
	"fmt"

	"k3/internal/kernel"
)

// ErrRange is wrapped when a position lies outside what a Log can recover.
var ErrRange = errors.New("replay: position out of range")

// ErrFull is wrapped when appending would overflow the ring: more records
// are speculative at once than the Log was made for.
var ErrFull = errors.New("replay: ring full")

// Shape is the shape of one KDA layer's per-sequence state.
type Shape struct {
	Heads, DK, DV int // recurrent state [Heads, DV, DK], V-first
	// ConvChannels and ConvWidth describe the short convolution: its
	// window holds the last ConvWidth-1 inputs of ConvChannels channels.
	ConvChannels, ConvWidth int
}

// StateLen is the number of floats of a recurrent state.
func (s Shape) StateLen() int { return s.Heads * s.DV * s.DK }

// ConvLen is the number of floats of a conv window.
func (s Shape) ConvLen() int { return max(s.ConvWidth-1, 0) * s.ConvChannels }

// RecordLen is the number of floats of one record (k, α, u and the conv input).
func (s Shape) RecordLen() int { return 2*s.Heads*s.DK + s.Heads*s.DV + s.ConvChannels }

func (s Shape) validate() error {
	if s.Heads <= 0 || s.DK <= 0 || s.DV <= 0 || s.ConvChannels < 0 || s.ConvWidth < 0 || (s.ConvWidth > 1 && s.ConvChannels == 0) {
		return fmt.Errorf("replay: invalid shape %+v", s)
	}
	return nil
}

// Record is one token's replay inputs for one layer. Append copies it.
type Record struct {
	K []float32 // [Heads*DK] the key as the state update used it (after conv, norm)
	A []float32 // [Heads*DK] the decay factors α = exp(g)
	U []float32 // [Heads*DV] the corrected values β (v − (Diag(α) S)ᵀ k)
	X []float32 // [ConvChannels] the short conv's input at this token
}

// Config configures a Log.
type Config struct {
	// Interval is how many committed records the ring holds before the
	// checkpoint moves forward over them (ReplaySSM's L); default 16.
	Interval int
	// MaxSpeculative is the most records that may be appended beyond the
	// committed ones at once (a verification pass of K drafts appends K+1);
	// default 8.
	MaxSpeculative int
	// Keep is how many of the newest committed records stay in the ring
	// when the checkpoint moves forward, so that the state that many
	// positions back stays one replay away (Rewind, StateAt). Less than
	// Interval; default 0.
	Keep int
}

// Log is one sequence's ReplaySSM state for one KDA layer: a checkpoint
// (state and conv window at position Base) and the records of the tokens
// after it. The first Committed of them belong to the sequence; the rest
// are speculative until Commit keeps or drops them. A Log never writes
// its checkpoint except when it moves it forward over committed records.
// It is not safe for concurrent use.
type Log struct {
	shape    Shape
	interval int
	keep     int
	capacity int // records the ring holds

	base    int       // position of the checkpoint
	ckState []float32 // [StateLen]
	ckConv  []float32 // [ConvLen]
	// The ring, oldest record first, one array per field so that replay
	// reads a head's keys and decays at a short stride.
	k, a, u, x []float32
	n          int // records held (committed + speculative)
	committed  int
}

// NewLog returns a Log whose checkpoint is the zero state at position 0.
func NewLog(shape Shape, cfg Config) (*Log, error) {
	if err := shape.validate(); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = 16
	}
	if cfg.MaxSpeculative == 0 {
		cfg.MaxSpeculative = 8
	}
	if cfg.Interval < 1 || cfg.MaxSpeculative < 1 || cfg.Keep < 0 || cfg.Keep >= cfg.Interval {
		return nil, fmt.Errorf("replay: interval %d, max speculative %d and keep %d: want interval and max speculative positive, keep in [0, interval)",
			cfg.Interval, cfg.MaxSpeculative, cfg.Keep)
	}
	capacity := cfg.Interval + cfg.MaxSpeculative
	return &Log{
		shape: shape, interval: cfg.Interval, keep: cfg.Keep, capacity: capacity,
		ckState: make([]float32, shape.StateLen()), ckConv: make([]float32, shape.ConvLen()),
		k: make([]float32, capacity*shape.Heads*shape.DK), a: make([]float32, capacity*shape.Heads*shape.DK),
		u: make([]float32, capacity*shape.Heads*shape.DV), x: make([]float32, capacity*shape.ConvChannels),
	}, nil
}

// Shape returns the layer shape the Log was made for.
func (l *Log) Shape() Shape { return l.shape }

// Base is the position of the checkpoint: the number of tokens its state
// has absorbed.
func (l *Log) Base() int { return l.base }

// Pos is the committed position: Base plus the committed records.
func (l *Log) Pos() int { return l.base + l.committed }

// Speculative is the number of records appended but not yet committed.
func (l *Log) Speculative() int { return l.n - l.committed }

// Bytes is the memory the Log holds: the checkpoint and the ring.
func (l *Log) Bytes() int64 {
	return 4 * int64(len(l.ckState)+len(l.ckConv)+len(l.k)+len(l.a)+len(l.u)+len(l.x))
}

// Reset empties the Log: a zero checkpoint at position 0, no records.
func (l *Log) Reset() {
	clear(l.ckState)
	clear(l.ckConv)
	l.base, l.n, l.committed = 0, 0, 0
}

// SetCheckpoint replaces the checkpoint with a state and conv window at
// pos (a restored snapshot, or a state computed another way) and drops
// every record.
func (l *Log) SetCheckpoint(pos int, state, conv []float32) error {
	if len(state) != len(l.ckState) || len(conv) != len(l.ckConv) || pos < 0 {
		return fmt.Errorf("replay: checkpoint of %d+%d floats at %d, want %d+%d", len(state), len(conv), pos, len(l.ckState), len(l.ckConv))
	}
	copy(l.ckState, state)
	copy(l.ckConv, conv)
	l.base, l.n, l.committed = pos, 0, 0
	return nil
}

// Checkpoint returns the checkpoint's state and conv window (the Log's
// own slices: read only) and its position.
func (l *Log) Checkpoint() (state, conv []float32, pos int) { return l.ckState, l.ckConv, l.base }

func (l *Log) record(i int) Record {
	s := l.shape
	hk, hv, c := s.Heads*s.DK, s.Heads*s.DV, s.ConvChannels
	return Record{K: l.k[i*hk : (i+1)*hk], A: l.a[i*hk : (i+1)*hk], U: l.u[i*hv : (i+1)*hv], X: l.x[i*c : (i+1)*c]}
}

// Append adds a speculative record for the token at position
// Base+Committed+Speculative. It fails with ErrFull when MaxSpeculative
// records are already speculative.
func (l *Log) Append(r Record) error {
	s := l.shape
	if len(r.K) != s.Heads*s.DK || len(r.A) != s.Heads*s.DK || len(r.U) != s.Heads*s.DV || len(r.X) != s.ConvChannels {
		return fmt.Errorf("replay: record of %d+%d+%d+%d floats, want %d+%d+%d+%d",
			len(r.K), len(r.A), len(r.U), len(r.X), s.Heads*s.DK, s.Heads*s.DK, s.Heads*s.DV, s.ConvChannels)
	}
	// Commit leaves fewer than Interval records committed, so a ring of
	// Interval+MaxSpeculative always has room below this bound.
	if l.n-l.committed >= l.capacity-l.interval {
		return fmt.Errorf("%w: %d speculative records", ErrFull, l.n-l.committed)
	}
	d := l.record(l.n)
	copy(d.K, r.K)
	copy(d.A, r.A)
	copy(d.U, r.U)
	copy(d.X, r.X)
	l.n++
	return nil
}

// Commit keeps the first n speculative records, as part of the sequence,
// and drops the others: a cursor move. Once Interval records are
// committed, the checkpoint moves forward over all but the newest Keep.
func (l *Log) Commit(n int) error {
	if n < 0 || n > l.n-l.committed {
		return fmt.Errorf("%w: commit %d of %d speculative records", ErrRange, n, l.n-l.committed)
	}
	l.committed += n
	l.n = l.committed
	if l.committed >= l.interval {
		l.flush()
	}
	return nil
}

// Rewind drops the committed records beyond pos and every speculative
// one, so that Pos() == pos. pos must lie in [Base, Pos].
func (l *Log) Rewind(pos int) error {
	if pos < l.base || pos > l.Pos() {
		return fmt.Errorf("%w: rewind to %d, the log holds %d..%d", ErrRange, pos, l.base, l.Pos())
	}
	l.committed = pos - l.base
	l.n = l.committed
	return nil
}

// flush moves the checkpoint forward over the committed records but the
// newest keep of them; those and the speculative ones then start the ring.
func (l *Log) flush() {
	m := l.committed - l.keep
	if m <= 0 {
		return
	}
	l.replay(l.ckState, l.ckConv, m)
	s := l.shape
	for _, f := range []struct {
		buf []float32
		w   int
	}{{l.k, s.Heads * s.DK}, {l.a, s.Heads * s.DK}, {l.u, s.Heads * s.DV}, {l.x, s.ConvChannels}} {
		copy(f.buf, f.buf[m*f.w:l.n*f.w])
	}
	l.base += m
	l.n -= m
	l.committed -= m
}

// Rebase replaces the checkpoint with the state at pos, which fill writes
// into the checkpoint's buffers (the caller's live state, say, after a
// prefill the log has no records for), and drops every record.
func (l *Log) Rebase(pos int, fill func(state, conv []float32) error) error {
	if pos < 0 {
		return fmt.Errorf("%w: rebase to %d", ErrRange, pos)
	}
	if err := fill(l.ckState, l.ckConv); err != nil {
		return err
	}
	l.base, l.n, l.committed = pos, 0, 0
	return nil
}

// CopyFrom makes l hold src's checkpoint and records (same shape and
// configuration), for a forked sequence.
func (l *Log) CopyFrom(src *Log) error {
	if l.shape != src.shape || l.capacity != src.capacity || l.interval != src.interval || l.keep != src.keep {
		return errors.New("replay: CopyFrom between logs of different shapes or configurations")
	}
	copy(l.ckState, src.ckState)
	copy(l.ckConv, src.ckConv)
	copy(l.k, src.k)
	copy(l.a, src.a)
	copy(l.u, src.u)
	copy(l.x, src.x)
	l.base, l.n, l.committed = src.base, src.n, src.committed
	return nil
}

// AppendFlat is Append for a record laid out as one slice, K | A | U | X:
// the layout compute.KDAStepArgs.Records writes.
func (l *Log) AppendFlat(rec []float32) error {
	s := l.shape
	hk, hv := s.Heads*s.DK, s.Heads*s.DV
	if len(rec) != s.RecordLen() {
		return fmt.Errorf("replay: flat record of %d floats, want %d", len(rec), s.RecordLen())
	}
	return l.Append(Record{K: rec[:hk], A: rec[hk : 2*hk], U: rec[2*hk : 2*hk+hv], X: rec[2*hk+hv:]})
}

// StateAt writes the state and conv window after the token at position
// pos-1 (pos tokens absorbed) into state and conv. pos may be any position
// from Base to Base plus every record held, speculative ones included,
// which is what a verification pass reads. The checkpoint is unchanged.
func (l *Log) StateAt(pos int, state, conv []float32) error {
	if pos < l.base || pos > l.base+l.n {
		return fmt.Errorf("%w: state at %d, the log holds %d..%d", ErrRange, pos, l.base, l.base+l.n)
	}
	if len(state) != len(l.ckState) || len(conv) != len(l.ckConv) {
		return fmt.Errorf("replay: StateAt into %d+%d floats, want %d+%d", len(state), len(conv), len(l.ckState), len(l.ckConv))
	}
	copy(state, l.ckState)
	copy(conv, l.ckConv)
	l.replay(state, conv, pos-l.base)
	return nil
}

// replay applies the first n records to state and conv.
func (l *Log) replay(state, conv []float32, n int) {
	s := l.shape
	// A state row's updates depend only on that row, so each row takes all
	// n records while it sits in registers (kernel.ReplayRows); the order
	// of rows changes no result.
	hk, hv := s.Heads*s.DK, s.Heads*s.DV
	if n > 0 {
		for h := range s.Heads {
			k, a := l.k[h*s.DK:], l.a[h*s.DK:]
			for v := range s.DV {
				row := state[(h*s.DV+v)*s.DK : (h*s.DV+v+1)*s.DK]
				kernel.ReplayRows(row, a, k, hk, l.u[h*s.DV+v:], hv, n)
			}
		}
	}
	// The conv window is the last W-1 inputs: the newest n records after
	// the older rows of the window.
	c, w := s.ConvChannels, max(s.ConvWidth-1, 0)
	if w == 0 || n == 0 {
		return
	}
	keep := max(w-n, 0)
	copy(conv, conv[(w-keep)*c:w*c])
	for j := range w - keep {
		copy(conv[(keep+j)*c:(keep+j+1)*c], l.record(n-(w-keep)+j).X)
	}
}

// FlatRecord copies committed record i (0 is the token at Base) into dst
// in AppendFlat's layout, K | A | U | X: with Checkpoint, what a saved
// sequence needs to rebuild the Log.
func (l *Log) FlatRecord(i int, dst []float32) error {
	s := l.shape
	if i < 0 || i >= l.committed || len(dst) != s.RecordLen() {
		return fmt.Errorf("%w: record %d of %d committed into %d floats (want %d)", ErrRange, i, l.committed, len(dst), s.RecordLen())
	}
	r := l.record(i)
	hk, hv := s.Heads*s.DK, s.Heads*s.DV
	copy(dst[:hk], r.K)
	copy(dst[hk:2*hk], r.A)
	copy(dst[2*hk:2*hk+hv], r.U)
	copy(dst[2*hk+hv:], r.X)
	return nil
}
