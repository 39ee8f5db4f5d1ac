package k3

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/specdec"
)

// testDepths are the draft depths (or stopping points) the speculation
// tests try: 1 to 8, or three of them under the race detector, which
// checks the loop's concurrency and not its arithmetic.
func testDepths() []int {
	if raceEnabled || testing.Short() {
		return []int{1, 4, 8}
	}
	return []int{1, 2, 3, 4, 5, 6, 7, 8}
}

// genIDs runs a generation and returns its token ids and final usage.
func genIDs(t *testing.T, s *Session, prompt []int32, opts ...GenerateOption) ([]int32, Usage) {
	t.Helper()
	var ids []int32
	var u Usage
	for tok, err := range s.GenerateTokens(context.Background(), prompt, opts...) {
		require.NoError(t, err)
		ids = append(ids, tok.ID)
		if tok.Usage != nil {
			u = *tok.Usage
		}
	}
	return ids, u
}

// specMatchesPlain generates from prompt on two new sessions of m, plainly
// and speculating with d at depth, requires the same tokens (what names
// the case) and returns the speculating run's usage.
func specMatchesPlain(t *testing.T, m *Model, prompt []int32, opts []GenerateOption, d specdec.Drafter, depth int, what string) Usage {
	t.Helper()
	plain, _ := m.NewSession()
	want, _ := genIDs(t, plain, prompt, opts...)
	plain.Close()
	s, _ := m.NewSession()
	got, u := genIDs(t, s, prompt, append(opts, WithSpeculation(d, depth))...)
	s.Close()
	require.Equal(t, want, got, what)
	return u
}

// oracle proposes the continuation a plain run produced (then a wrong
// token), so that speculation meets long accepted runs and rejections.
type oracle struct{ want []int32 }

func (o oracle) Draft(history []int32, n int, dst []int32) []int32 {
	for i := 0; i < n; i++ {
		p := len(history) + i
		if p < len(o.want) && i < n-1 {
			dst = append(dst, o.want[p])
		} else {
			dst = append(dst, 3)
		}
	}
	return dst
}

// perfect proposes exactly the continuation a plain run produced.
type perfect struct{ want []int32 }

func (p perfect) Draft(history []int32, n int, dst []int32) []int32 {
	for i := 0; i < n && len(history)+i < len(p.want); i++ {
		dst = append(dst, p.want[len(history)+i])
	}
	return dst
}

// wrong proposes tokens a plain run never draws at those positions.
type wrong struct {
	want  []int32
	vocab int32
}

func (w wrong) Draft(history []int32, n int, dst []int32) []int32 {
	for i := 0; i < n && len(history)+i < len(w.want); i++ {
		dst = append(dst, (w.want[len(history)+i]+1)%w.vocab)
	}
	return dst
}

// TestAdaptiveSpeculation: the adaptive depth never verifies the drafts
// of a drafter that is always wrong (its estimate stays at 0: plain
// decoding, with the drafts only compared to the draws), and soon
// speculates deep with one that is always right; the tokens are plain
// decoding's either way.
func TestAdaptiveSpeculation(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, "../testdata/model/tiny_k31pro", WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	// The depth choice must not hang on this machine's timing: a cost
	// table as the 100M preset measures one (passes of 1 + 0.2 steps a
	// draft, rollbacks of 0.2).
	m.specCosts = specdec.Costs{Pass: make([]float64, ExactTokens+1), Rollback: 0.2}
	for n := 1; n <= ExactTokens; n++ {
		m.specCosts.Pass[n] = 1 + 0.2*float64(n-1)
	}
	prompt := m.Encode("the adaptive depth")
	opts := []GenerateOption{WithMaxTokens(60), WithoutDefaultStops()}
	plain, _ := m.NewSession()
	want, _ := genIDs(t, plain, prompt, opts...)
	plain.Close()
	full := append(append([]int32(nil), prompt...), want...)

	s, _ := m.NewSession()
	got, u := genIDs(t, s, prompt, append(opts, WithAdaptiveSpeculation(wrong{full, int32(m.VocabSize())}, 8))...)
	s.Close()
	assert.Equal(t, want, got)
	assert.Zero(t, u.DraftTokens, "an always-wrong drafter's drafts were verified")

	// The last speculation option wins: a fixed depth verifies every draft.
	s, _ = m.NewSession()
	got, u = genIDs(t, s, prompt, append(opts, WithAdaptiveSpeculation(wrong{full, int32(m.VocabSize())}, 8), WithSpeculation(wrong{full, int32(m.VocabSize())}, 2))...)
	s.Close()
	assert.Equal(t, want, got)
	assert.Positive(t, u.DraftTokens)
	assert.Zero(t, u.AcceptedTokens)

	s, _ = m.NewSession()
	got, u = genIDs(t, s, prompt, append(opts, WithAdaptiveSpeculation(perfect{full}, 8))...)
	s.Close()
	assert.Equal(t, want, got)
	assert.Equal(t, u.DraftTokens, u.AcceptedTokens)
	assert.Greater(t, u.AcceptedTokens, len(want)/2, "a perfect drafter's drafts were not used")
}

// TestAdaptiveSpeculationUnderBudget: where the memory budget leaves no
// room for the scratch sessions that measure verify passes' costs, an
// adaptive generation does not fail: it takes the costs measured before
// (a lone session's, here set by hand) or, with none, decodes plainly; the
// tokens are plain decoding's either way (found by a random HTTP traffic
// run: requests failed mid-stream with ErrMemoryBudget).
func TestAdaptiveSpeculationUnderBudget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := []GenerateOption{WithMaxTokens(24), WithoutDefaultStops()}
	plain := load(t, WithRollback(8))
	prompt := plain.Encode("the adaptive depth under a budget")
	probe, err := plain.NewSession()
	require.NoError(t, err)
	want, _ := genIDs(t, probe, prompt, opts...)
	full := append(slices.Clone(prompt), want...)
	// Two sessions that have generated fit; a third, fresh, does not.
	state := probe.StateBytes()
	budget := 2*state + state/4
	require.NoError(t, probe.Close())

	for _, measured := range []bool{false, true} {
		m := load(t, WithRollback(8), WithMemoryBudget(budget))
		if measured {
			m.specCosts = specdec.Costs{Pass: make([]float64, ExactTokens+1), Rollback: 0.2}
			for n := 1; n <= ExactTokens; n++ {
				m.specCosts.Pass[n] = 1 + 0.2*float64(n-1)
			}
		}
		// Alone: a scratch session beside the generation's fits, but not
		// one beside two sessions.
		other, err := m.NewSession()
		require.NoError(t, err)
		s, err := m.NewSession()
		require.NoError(t, err)
		got, u := genIDs(t, s, prompt, append(opts, WithAdaptiveSpeculation(perfect{full}, 4))...)
		assert.Equal(t, want, got, "measured %v", measured)
		if measured {
			assert.Positive(t, u.AcceptedTokens, "the costs measured before chose a depth")
		} else {
			assert.Zero(t, u.DraftTokens, "nothing measured: plain decoding")
		}
		require.NoError(t, s.Close())
		require.NoError(t, other.Close())

		// In a Batcher of two: batch costs need two scratch sessions.
		br, err := m.NewBatcher(2)
		require.NoError(t, err)
		bctx, stop := context.WithCancel(ctx)
		require.NoError(t, br.Start(bctx))
		var wg sync.WaitGroup
		for range 2 {
			s, err := m.NewSession()
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer s.Close()
				var got []int32
				for tok, err := range br.GenerateTokens(ctx, s, prompt, append(opts, WithAdaptiveSpeculation(perfect{full}, 4))...) {
					if !assert.NoError(t, err, "measured %v", measured) {
						return
					}
					got = append(got, tok.ID)
				}
				assert.Equal(t, want, got, "in the Batcher, measured %v", measured)
			}()
		}
		wg.Wait()
		stop()
		_ = br.Wait()
	}
}

func TestSpeculationCosts(t *testing.T) {
	ctx := context.Background()
	plain, err := Load(ctx, tinyDir)
	require.NoError(t, err)
	defer plain.Close()
	_, err = plain.SpeculationCosts(ctx)
	require.ErrorIs(t, err, ErrInvalidOption)

	m, err := Load(ctx, tinyDir, WithRollback(4))
	require.NoError(t, err)
	defer m.Close()
	c, err := m.SpeculationCosts(ctx)
	require.NoError(t, err)
	require.Len(t, c.Pass, 4+2) // passes of 1 to WithRollback(4)+1 tokens
	assert.Equal(t, 1.0, c.Pass[1])
	for n := 2; n < len(c.Pass); n++ {
		assert.Positive(t, c.Pass[n], "pass of %d", n)
	}
	assert.GreaterOrEqual(t, c.Rollback, 0.0)
	again, err := m.SpeculationCosts(ctx)
	require.NoError(t, err)
	assert.Equal(t, c, again, "measured once per model")
	// The scratch session is gone: what the ledger holds is free pages
	// and kept states.
	u := m.MemoryUsage()
	assert.Equal(t, u.FreePages+u.FreeStates, u.Used)

	// Batch shapes: by powers of two, measured once each, the lone
	// session's rollback, and the same depths.
	at1, err := m.SpeculationCostsAt(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, c, at1)
	b6, err := m.SpeculationCostsAt(ctx, 6)
	require.NoError(t, err)
	require.Len(t, b6.Pass, len(c.Pass))
	assert.Equal(t, 1.0, b6.Pass[1])
	for n := 2; n < len(b6.Pass); n++ {
		assert.Positive(t, b6.Pass[n], "batch 4, pass of %d", n)
	}
	assert.Equal(t, c.Rollback, b6.Rollback)
	b4, err := m.SpeculationCostsAt(ctx, 4)
	require.NoError(t, err)
	assert.Equal(t, b6, b4, "6 measures as 4")
	u = m.MemoryUsage()
	assert.Equal(t, u.FreePages+u.FreeStates, u.Used, "the batch's sessions are gone")
}

// speculationModels are the testdata checkpoints and the embedded model,
// loaded with the replay logs speculation needs.
func speculationModels(t *testing.T) map[string]*Model {
	t.Helper()
	ctx := context.Background()
	dirs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	require.NotEmpty(t, dirs)
	models := map[string]*Model{}
	for _, c := range dirs {
		m, err := Load(ctx, filepath.Dir(c), WithRollback(8))
		require.NoError(t, err)
		models[filepath.Base(filepath.Dir(c))] = m
		t.Cleanup(func() { m.Close() })
	}
	m, err := LoadTiny(ctx, WithRollback(8))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	models["embedded"] = m
	return models
}

// TestSpeculationGreedyEqualsPlain: greedy speculative decoding gives the
// tokens of plain greedy decoding, and leaves the session with the same
// tokens, logits and KDA states, for depths 1 to 8, with the n-gram
// drafter and with drafts that are partly right, on every testdata model
// and the embedded one.
func TestSpeculationGreedyEqualsPlain(t *testing.T) {
	for name, m := range speculationModels(t) {
		t.Run(name, func(t *testing.T) {
			prompt := m.Encode("abcabcabcabc the cat the cat the cat, abcabc")
			opts := []GenerateOption{WithMaxTokens(40), WithoutDefaultStops()}
			plain, _ := m.NewSession()
			defer plain.Close()
			want, _ := genIDs(t, plain, prompt, opts...)
			accepted := 0
			for _, depth := range testDepths() {
				full := append(append([]int32(nil), prompt...), want...)
				for i, spec := range []GenerateOption{WithSpeculation(specdec.NGram{}, depth), WithSpeculation(oracle{full}, depth),
					WithAdaptiveSpeculation(perfect{full}, depth), WithAdaptiveSpeculation(oracle{full}, depth)} {
					d := fmt.Sprint("speculation ", i)
					s, _ := m.NewSession()
					got, u := genIDs(t, s, prompt, append(opts, spec)...)
					require.Equal(t, want, got, "depth %d, %s", depth, d)
					require.Equal(t, plain.Tokens(), s.Tokens(), "depth %d, %s: the session's tokens", depth, d)
					require.Equal(t, plain.Logits(), s.Logits(), "depth %d, %s: the session's logits", depth, d)
					require.Equal(t, kdaStates(t, plain), kdaStates(t, s), "depth %d, %s: KDA states", depth, d)
					require.LessOrEqual(t, u.AcceptedTokens, u.DraftTokens)
					accepted += u.AcceptedTokens
					s.Close()
				}
			}
			assert.Positive(t, accepted, "no draft was ever accepted: the test did not exercise acceptance")
		})
	}
}

// TestSpeculationSamplingEqualsPlain: with sampling (temperature, top-k,
// top-p, min-p and penalties) a speculating generation draws the tokens
// plain sampling draws with the same seed, over 1,000 seeds (the coupled
// mode, for any drafter).
func TestSpeculationSamplingEqualsPlain(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir, WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	prompt := m.Encode("abab abab abab")
	seeds := 1000
	if testing.Short() || raceEnabled {
		seeds = 100 // the race run covers the loop's concurrency, not its statistics
	}
	accepted := 0
	for seed := range seeds {
		opts := []GenerateOption{WithMaxTokens(12), WithoutDefaultStops(), WithSeed(uint64(seed)),
			WithTemperature(0.9), WithTopK(40), WithTopP(0.95), WithMinP(0.01), WithPresencePenalty(0.2), WithFrequencyPenalty(0.1)}
		plain, _ := m.NewSession()
		want, _ := genIDs(t, plain, prompt, opts...)
		plain.Close()
		// Even seeds: the n-gram drafter; odd ones: drafts of the plain
		// run's own tokens, the last of each wrong, so that every run
		// meets acceptances and rejections.
		var d specdec.Drafter = specdec.NGram{}
		if seed%2 == 1 {
			d = oracle{append(append([]int32(nil), prompt...), want...)}
		}
		s, _ := m.NewSession()
		got, u := genIDs(t, s, prompt, append(opts, WithSpeculation(d, 1+seed%6))...)
		s.Close()
		require.Equal(t, want, got, "seed %d", seed)
		accepted += u.AcceptedTokens
	}
	assert.Positive(t, accepted)
}

// TestSpeculationLeavesSessionExact: a generation cancelled between a
// verify pass and the draws that would confirm its drafts, or stopped
// early by its caller, leaves the session holding exactly the tokens it
// yielded (the drafts in flight dropped), usable as if it had never
// speculated.
func TestSpeculationLeavesSessionExact(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir, WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	prompt := m.Encode("one two one two one two")
	opts := []GenerateOption{WithMaxTokens(30), WithoutDefaultStops()}
	plain, _ := m.NewSession()
	want, _ := genIDs(t, plain, prompt, opts...)
	plain.Close()
	// Drafts right but for their last token: some are always in flight.
	drafter := oracle{append(append([]int32(nil), prompt...), want...)}
	check := func(t *testing.T, s *Session, yielded []int32) {
		t.Helper()
		require.Equal(t, append(append([]int32(nil), prompt...), yielded...), s.Tokens())
		r, _ := m.NewSession()
		defer r.Close()
		_, err := r.Forward(ctx, prompt) // as the generation fed it: one prefill pass
		require.NoError(t, err)
		for _, tok := range yielded {
			_, err := r.Forward(ctx, []int32{tok})
			require.NoError(t, err)
		}
		require.Equal(t, r.Logits(), s.Logits())
		require.Equal(t, kdaStates(t, r), kdaStates(t, s))
		// And it goes on like a session that never speculated.
		a, _ := genIDs(t, s, nil, WithMaxTokens(8), WithoutDefaultStops())
		b, _ := genIDs(t, r, nil, WithMaxTokens(8), WithoutDefaultStops())
		require.Equal(t, b, a)
	}
	for _, stop := range testDepths() {
		t.Run(fmt.Sprintf("cancelled after %d", stop), func(t *testing.T) {
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			s, _ := m.NewSession()
			defer s.Close()
			var yielded []int32
			var gotErr error
			for tok, err := range s.GenerateTokens(cctx, prompt, append(opts, WithSpeculation(drafter, 4))...) {
				if err != nil {
					gotErr = err
					break
				}
				yielded = append(yielded, tok.ID)
				if len(yielded) == stop {
					cancel()
				}
			}
			require.ErrorIs(t, gotErr, context.Canceled)
			check(t, s, yielded)
		})
		t.Run(fmt.Sprintf("caller stops after %d", stop), func(t *testing.T) {
			s, _ := m.NewSession()
			defer s.Close()
			var yielded []int32
			for tok, err := range s.GenerateTokens(ctx, prompt, append(opts, WithSpeculation(drafter, 4))...) {
				require.NoError(t, err)
				yielded = append(yielded, tok.ID)
				if len(yielded) == stop {
					break
				}
			}
			check(t, s, yielded)
		})
	}
}

type badDrafter struct{}

func (badDrafter) Draft(history []int32, n int, dst []int32) []int32 { return append(dst, 1<<20) }

func TestSpeculationErrors(t *testing.T) {
	ctx := context.Background()
	plain, err := Load(ctx, tinyDir)
	require.NoError(t, err)
	defer plain.Close()
	m, err := Load(ctx, tinyDir, WithRollback(4))
	require.NoError(t, err)
	defer m.Close()
	prompt := m.Encode("hello")
	run := func(m *Model, opts ...GenerateOption) error {
		s, _ := m.NewSession()
		defer s.Close()
		for _, err := range s.GenerateTokens(ctx, prompt, append(opts, WithMaxTokens(4))...) {
			if err != nil {
				return err
			}
		}
		return nil
	}
	err = run(plain, WithSpeculation(specdec.NGram{}, 2))
	require.ErrorIs(t, err, ErrInvalidOption)
	assert.ErrorContains(t, err, "WithRollback(2)")
	err = run(m, WithSpeculation(specdec.NGram{}, 5))
	assert.ErrorContains(t, err, "WithRollback(5)")
	assert.ErrorIs(t, run(m, WithSpeculation(specdec.NGram{}, 0)), ErrInvalidOption)
	assert.ErrorIs(t, run(m, WithSpeculation(specdec.NGram{}, ExactTokens)), ErrInvalidOption)
	assert.ErrorIs(t, run(m, WithSpeculation(nil, 2)), ErrInvalidOption)
	err = run(m, WithSpeculation(badDrafter{}, 2))
	assert.ErrorContains(t, err, "outside the vocabulary")

	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	bctx, cancel := context.WithCancel(ctx)
	require.NoError(t, br.Start(bctx))
	s, _ := m.NewSession()
	var berr error
	for _, err := range br.Generate(ctx, s, "hi", WithSpeculation(badDrafter{}, 2)) {
		if err != nil {
			berr = err
			break
		}
	}
	cancel()
	br.Wait()
	assert.ErrorContains(t, berr, "outside the vocabulary", "batcher")
}

// TestBatcherSpeculationWithinBudget: under a token budget smaller than a
// verify run (one sequence, budget 3, depth 8), a speculating generation
// in the Batcher drafts at most two tokens a pass instead of failing the
// pass (and every generation in it), and still draws plain decoding's
// tokens and log-probabilities.
func TestBatcherSpeculationWithinBudget(t *testing.T) {
	ctx := context.Background()
	m, err := LoadTiny(ctx, WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	prompt := m.Encode("func main() { fmt.Println(")
	opts := []GenerateOption{WithMaxTokens(24), WithoutDefaultStops(), WithLogprobs(1)}
	plain, err := m.NewSession()
	require.NoError(t, err)
	defer plain.Close()
	var want []Token
	for tok, err := range plain.GenerateTokens(ctx, prompt, opts...) {
		require.NoError(t, err)
		tok.Usage = nil
		want = append(want, tok)
	}
	full := append(slices.Clone(prompt), idsOf(want)...)

	br, err := m.NewBatcher(1, WithTokenBudget(3))
	require.NoError(t, err)
	bctx, stop := context.WithCancel(ctx)
	require.NoError(t, br.Start(bctx))
	defer func() { stop(); br.Wait() }()
	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	var got []Token
	var usage Usage
	for tok, err := range br.GenerateTokens(ctx, s, prompt, append(opts, WithSpeculation(perfect{full}, 8))...) {
		require.NoError(t, err)
		if tok.Usage != nil {
			usage = *tok.Usage
		}
		tok.Usage = nil
		got = append(got, tok)
	}
	require.Equal(t, want, got)
	// 23 tokens after the first draw, at most two drafts a pass: at least
	// eight verify passes, every draft right.
	assert.Equal(t, usage.DraftTokens, usage.AcceptedTokens)
	assert.GreaterOrEqual(t, usage.AcceptedTokens, 15, "usage %+v", usage)
	assert.LessOrEqual(t, usage.DraftTokens, 2*(len(want)-1)/3+2, "usage %+v", usage)
}

// TestBatcherSpeculation: generations that speculate inside the Batcher,
// beside plain ones and a prefilling prompt, each with its own drafter
// and depth (fixed or adaptive), draw exactly the tokens and
// log-probabilities of plain Session.Generate alone, greedy and sampled,
// and leave their sessions with the same tokens, logits and KDA states.
func TestBatcherSpeculation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	models := speculationModels(t)
	if raceEnabled || testing.Short() {
		// The loop's concurrency, on two models.
		for name := range models {
			if name != "embedded" && name != "tiny_k31pro" {
				delete(models, name)
			}
		}
	}
	for name, m := range models {
		t.Run(name, func(t *testing.T) {
			br, err := m.NewBatcher(6)
			require.NoError(t, err)
			bctx, stop := context.WithCancel(ctx)
			defer stop()
			require.NoError(t, br.Start(bctx))
			prompts := []string{"abcabcabcabc the cat the cat", "func main() { fmt.Println(", "the cat the cat the cat the", "x := []int{1, 2, 3, 1, 2, 3, 1, 2",
				strings.Repeat("a long prompt that prefills in chunks beside the others ", 4), "abcabcabc"}
			type run struct {
				opts   []GenerateOption
				prompt []int32
				want   []Token
				plain  *Session
			}
			runs := make([]run, len(prompts))
			for i, p := range prompts {
				r := &runs[i]
				r.prompt = m.Encode(p)
				base := []GenerateOption{WithMaxTokens(30), WithoutDefaultStops(), WithLogprobs(1)}
				if i%2 == 1 {
					base = append(base, WithTemperature(0.9), WithTopK(40), WithSeed(uint64(i)))
				}
				r.plain, _ = m.NewSession()
				defer r.plain.Close()
				for tok, err := range r.plain.GenerateTokens(ctx, r.prompt, base...) {
					require.NoError(t, err)
					tok.Usage = nil
					r.want = append(r.want, tok)
				}
				full := append(append([]int32(nil), r.prompt...), idsOf(r.want)...)
				switch i {
				case 0:
					r.opts = append(base, WithSpeculation(specdec.NGram{}, 3))
				case 1:
					r.opts = append(base, WithSpeculation(oracle{full}, 5))
				case 2:
					r.opts = append(base, WithAdaptiveSpeculation(perfect{full}, 8))
				case 3:
					r.opts = append(base, WithSpeculation(perfect{full}, 8))
				default:
					r.opts = base // plain, beside the speculating ones
				}
			}
			var wg sync.WaitGroup
			got := make([][]Token, len(runs))
			sessions := make([]*Session, len(runs))
			accepted := make([]int, len(runs))
			for i := range runs {
				sessions[i], _ = m.NewSession()
				defer sessions[i].Close()
				wg.Add(1)
				go func() {
					defer wg.Done()
					for tok, err := range br.GenerateTokens(ctx, sessions[i], runs[i].prompt, runs[i].opts...) {
						if !assert.NoError(t, err) {
							return
						}
						if tok.Usage != nil {
							accepted[i] = tok.Usage.AcceptedTokens
						}
						tok.Usage = nil
						got[i] = append(got[i], tok)
					}
				}()
			}
			wg.Wait()
			for i, r := range runs {
				require.Equal(t, r.want, got[i], "run %d", i)
				require.Equal(t, r.plain.Tokens(), sessions[i].Tokens(), "run %d: tokens", i)
				require.Equal(t, r.plain.Logits(), sessions[i].Logits(), "run %d: logits", i)
				require.Equal(t, kdaStates(t, r.plain), kdaStates(t, sessions[i]), "run %d: KDA states", i)
			}
			assert.Positive(t, accepted[3], "the perfect drafter's drafts were never accepted")
		})
	}
}

// TestDraftModel: a smaller model as the drafter (here the same
// checkpoint, whose greedy drafts are all right, and another checkpoint
// of the vocabulary, whose drafts mostly are not) leaves greedy and
// sampled outputs exactly those of plain decoding, alone and in the
// Batcher, and keeps its own session in step with the history.
func TestDraftModel(t *testing.T) {
	ctx := context.Background()
	dirs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	other := map[string]string{}
	for i, c := range dirs {
		other[filepath.Dir(c)] = filepath.Dir(dirs[(i+1)%len(dirs)])
	}
	depths := []int{1, 2, 3, 4, 5, 6, 7, 8}
	if raceEnabled || testing.Short() {
		// The race detector checks the drafter's locking, not its
		// arithmetic: one model, one depth.
		depths = []int{3}
		for dir := range other {
			if dir != filepath.Dir(dirs[0]) {
				delete(other, dir)
			}
		}
	}
	for dir, otherDir := range other {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m, err := Load(ctx, dir, WithRollback(8))
			require.NoError(t, err)
			defer m.Close()
			for _, dd := range []struct {
				dir  string
				same bool
			}{{dir, true}, {otherDir, false}} {
				draft, err := Load(ctx, dd.dir, WithRollback(8))
				require.NoError(t, err)
				defer draft.Close()
				checkDraftModel(t, m, draft, filepath.Base(dd.dir), dd.same, depths)
			}
		})
	}
	// The trained model shares its vocabulary with no testdata checkpoint:
	// it drafts for itself.
	t.Run("trained", func(t *testing.T) {
		m, err := LoadTiny(ctx, WithRollback(8))
		require.NoError(t, err)
		defer m.Close()
		draft, err := LoadTiny(ctx, WithRollback(8))
		require.NoError(t, err)
		defer draft.Close()
		checkDraftModel(t, m, draft, "trained", true, depths)
	})

	m, err := Load(ctx, tinyDir, WithRollback(4))
	require.NoError(t, err)
	defer m.Close()
	tiny, err := LoadTiny(ctx)
	require.NoError(t, err)
	defer tiny.Close()
	_, err = m.NewDraftModel(tiny)
	assert.ErrorIs(t, err, ErrInvalidOption, "another vocabulary")
	_, err = m.NewDraftModel(nil)
	assert.ErrorIs(t, err, ErrInvalidOption)

	// In the Batcher, each sequence with a draft model of its own.
	draft, err := Load(ctx, tinyDir, WithRollback(4))
	require.NoError(t, err)
	defer draft.Close()
	br, err := m.NewBatcher(3)
	require.NoError(t, err)
	bctx, stop := context.WithCancel(ctx)
	defer stop()
	require.NoError(t, br.Start(bctx))
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prompt := m.Encode(fmt.Sprint("sequence ", i, " the cat the cat"))
			opts := []GenerateOption{WithMaxTokens(20), WithoutDefaultStops(), WithTemperature(0.7), WithSeed(uint64(i))}
			plain, _ := m.NewSession()
			defer plain.Close()
			want, _ := genIDs(t, plain, prompt, opts...)
			dm, err := m.NewDraftModel(draft)
			if !assert.NoError(t, err) {
				return
			}
			defer dm.Close()
			s, _ := m.NewSession()
			defer s.Close()
			var got []int32
			for tok, err := range br.GenerateTokens(ctx, s, prompt, append(opts, WithSpeculation(dm, 4))...) {
				if !assert.NoError(t, err) {
					return
				}
				got = append(got, tok.ID)
			}
			assert.Equal(t, want, got, "sequence %d", i)
		}()
	}
	wg.Wait()
}

// checkDraftModel checks that speculation with draft as a model drafter
// gives m's plain tokens, greedy and sampled, at each depth; same says
// draft is m's own checkpoint, whose greedy drafts are all accepted.
func checkDraftModel(t *testing.T, m, draft *Model, name string, same bool, depths []int) {
	t.Helper()
	prompt := m.Encode("the cat sat on the mat, the cat sat on")
	for _, depth := range depths {
		for _, sampled := range []bool{false, true} {
			opts := []GenerateOption{WithMaxTokens(24), WithoutDefaultStops()}
			if sampled {
				opts = append(opts, WithTemperature(0.8), WithSeed(uint64(depth)))
			}
			dm, err := m.NewDraftModel(draft)
			require.NoError(t, err)
			u := specMatchesPlain(t, m, prompt, opts, dm, depth, fmt.Sprintf("draft %s, depth %d, sampled %v", name, depth, sampled))
			require.NoError(t, dm.Err())
			if same && !sampled {
				assert.Equal(t, u.DraftTokens, u.AcceptedTokens, "the same model's greedy drafts are all right (depth %d)", depth)
				assert.Positive(t, u.AcceptedTokens)
			}
			require.NoError(t, dm.Close())
		}
	}
}

// The self-speculative drafter (the target's first n layers and its head)
// keeps every generation plain decoding's, greedy and sampled, at every
// depth, on every checkpoint and the trained model.
func TestSelfDraft(t *testing.T) {
	ctx := context.Background()
	dirs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	type target struct {
		name string
		load func() (*Model, error)
	}
	var targets []target
	for _, c := range dirs {
		dir := filepath.Dir(c)
		targets = append(targets, target{filepath.Base(dir), func() (*Model, error) { return Load(ctx, dir, WithRollback(8)) }})
	}
	targets = append(targets, target{"trained", func() (*Model, error) { return LoadTiny(ctx, WithRollback(8)) }})
	depths := []int{1, 2, 3, 4, 5, 6, 7, 8}
	if raceEnabled || testing.Short() {
		depths, targets = []int{3}, targets[:1]
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			m, err := tg.load()
			require.NoError(t, err)
			defer m.Close()
			prompt := m.Encode("the cat sat on the mat, the cat sat on")
			layers := len(m.Config.Layers)
			for _, n := range []int{1, layers / 2, layers - 1} {
				ds := depths
				if n != layers/2 && len(ds) > 1 {
					ds = []int{3} // every depth at one n; the others at one depth
				}
				for _, depth := range ds {
					for _, sampled := range []bool{false, true} {
						opts := []GenerateOption{WithMaxTokens(24), WithoutDefaultStops()}
						if sampled {
							opts = append(opts, WithTemperature(0.8), WithSeed(uint64(depth+n)))
						}
						dm, err := m.NewSelfDraft(n)
						require.NoError(t, err)
						u := specMatchesPlain(t, m, prompt, opts, dm, depth, fmt.Sprintf("self:%d, depth %d, sampled %v", n, depth, sampled))
						require.NoError(t, dm.Err())
						assert.Positive(t, u.DraftTokens)
						require.NoError(t, dm.Close())
					}
				}
			}
			for _, n := range []int{0, -1, layers} {
				_, err := m.NewSelfDraft(n)
				assert.ErrorIs(t, err, ErrInvalidOption, "self:%d", n)
			}
			// A prompt longer than catchUp: the drafter takes the target
			// session's state for its layers, and drafts what it drafts
			// when it runs the prompt itself.
			long := make([]int32, 0, 64)
			for len(long) < 3*catchUp {
				long = append(long, prompt...)
			}
			usage := func(adopt bool) Usage {
				dm, err := m.NewSelfDraft(layers / 2)
				require.NoError(t, err)
				defer dm.Close()
				dm.self = adopt
				s, _ := m.NewSession()
				defer s.Close()
				_, u := genIDs(t, s, long, WithMaxTokens(16), WithoutDefaultStops(), WithSpeculation(dm, 3))
				if adopt {
					assert.Positive(t, dm.adopted, "the drafter took the target's state")
				}
				return u
			}
			assert.Equal(t, usage(false), usage(true), "drafts with the target's state against drafts run alone")
			// The view of every layer is the model itself: its greedy
			// drafts are all accepted.
			dm, err := m.NewDraftModel(m.earlyExit(layers))
			require.NoError(t, err)
			s, _ := m.NewSession()
			_, u := genIDs(t, s, prompt, WithMaxTokens(24), WithoutDefaultStops(), WithSpeculation(dm, 4))
			s.Close()
			assert.Positive(t, u.DraftTokens)
			assert.Equal(t, u.DraftTokens, u.AcceptedTokens, "the whole model's drafts")
			require.NoError(t, dm.Close())
		})
	}
}

// Self-speculative drafters of one depth share one early-exit view, so a
// new drafter's first draft reuses the workspace the last one released
// instead of allocating and clearing another.
func TestSelfDraftSharesView(t *testing.T) {
	ctx := context.Background()
	m, err := LoadTiny(ctx, WithRollback(4))
	require.NoError(t, err)
	defer m.Close()
	require.Same(t, m.earlyExit(2), m.earlyExit(2))
	require.NotSame(t, m.earlyExit(2), m.earlyExit(3))
	prompt := m.Encode("func main() {")
	for i := range 3 {
		d, err := m.NewSelfDraft(2)
		require.NoError(t, err)
		got := d.Draft(prompt, 2, nil)
		require.Len(t, got, 2)
		require.NoError(t, d.Close())
		v := m.earlyExit(2)
		v.wsMu.Lock()
		free := len(v.wsFree)
		v.wsMu.Unlock()
		require.Equal(t, 1, free, "drafter %d: the view holds one workspace, lent and returned", i)
	}
}
