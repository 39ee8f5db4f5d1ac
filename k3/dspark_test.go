package k3

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/safetensors"
	"k3/specdec"
)

// The DSpark drafter runs the embedded model's draft module as the
// framework that trained it does (testdata/trained/draft_crosscheck,
// written by tools/train/draft_fixture.py): at each held-out anchor the
// hidden states it reads match PyTorch's within 1e-4 of their scale, the
// block's logits (with the Markov term) within 1e-4 of theirs, the
// confidences within 1e-4, and the greedy drafts exactly.
func TestDSparkMatchesTrainingFramework(t *testing.T) {
	f, err := safetensors.Open(filepath.Join("..", "testdata", "trained", "draft_crosscheck.safetensors"))
	require.NoError(t, err)
	defer f.Close()
	ids, _, err := f.Int32s("input_ids")
	require.NoError(t, err)
	anchors, _, err := f.Int32s("anchors")
	require.NoError(t, err)
	wantTaps, _, err := f.Float32s("taps")
	require.NoError(t, err)
	nexts, _, err := f.Int32s("next_ids")
	require.NoError(t, err)
	wantDrafts, _, err := f.Int32s("draft_ids")
	require.NoError(t, err)
	wantLogits, _, err := f.Float32s("draft_logits")
	require.NoError(t, err)
	wantConf, _, err := f.Float32s("confidence")
	require.NoError(t, err)

	ctx := context.Background()
	m, err := LoadTiny(ctx)
	require.NoError(t, err)
	defer m.Close()
	require.NotNil(t, m.draft)
	k, v, d := m.draft.block, m.VocabSize(), m.Config.HiddenSize
	n := len(m.draft.cfg.TargetLayers)
	ds, err := m.NewDSpark()
	require.NoError(t, err)
	for a, t0 := range anchors {
		s, err := m.NewSession()
		require.NoError(t, err)
		_, err = s.Forward(ctx, ids[:t0+1])
		require.NoError(t, err)
		require.Equal(t, nexts[a], argmax(s.Logits()), "anchor %d: the target's next token", t0)
		// The hidden states at the anchor, the session's last position.
		row := int(t0) - s.tapsPos
		require.True(t, row >= 0 && row < s.tapsRows)
		want := wantTaps[a*n*d : (a+1)*n*d]
		scale := maxAbsF(want)
		for i, tp := range s.taps {
			got := tp[row*d : (row+1)*d]
			for j := range d {
				require.InDelta(t, want[i*d+j], got[j], 1e-4*scale, "anchor %d, target layer %d, element %d", t0, m.draft.cfg.TargetLayers[i], j)
			}
		}
		ds.bind(s)
		history := append(append([]int32(nil), ids[:t0+1]...), nexts[a])
		drafts := ds.Draft(history, k, nil)
		require.Equal(t, wantDrafts[a*k:(a+1)*k], drafts, "anchor %d's drafts", t0)
		wl := wantLogits[a*k*v : (a+1)*k*v]
		ls := maxAbsF(wl)
		worst := 0.0
		for i := range wl {
			worst = max(worst, math.Abs(float64(wl[i]-ds.row[i])))
		}
		assert.LessOrEqual(t, worst, 1e-4*ls, "anchor %d: block logits, max |k3 - PyTorch| against a scale of %.3g", t0, ls)
		conf := ds.Confidences()
		for i := range k {
			assert.InDelta(t, wantConf[a*k+i], conf[i], 1e-4, "anchor %d position %d's confidence", t0, i)
		}
		s.Close()
	}
	// Without a bound session there is nothing to read: no drafts; nor
	// once closed.
	ds.bind(nil)
	assert.Empty(t, ds.Draft(ids, 4, nil))
	require.NoError(t, ds.Close())
	s, _ := m.NewSession()
	defer s.Close()
	_, err = s.Forward(ctx, ids[:10])
	require.NoError(t, err)
	ds.bind(s)
	assert.Empty(t, ds.Draft(append(ids[:10:10], 5), 4, nil))

	// A checkpoint without a draft module has no DSpark.
	plain, err := Load(ctx, "../testdata/model/tiny_k31pro")
	require.NoError(t, err)
	defer plain.Close()
	_, err = plain.NewDSpark()
	assert.ErrorIs(t, err, ErrInvalidOption)
}

// Speculation with the DSpark drafter gives plain decoding's tokens,
// greedy and sampled, at every depth up to the block and one beyond it
// (where the drafter proposes a block at most), alone and in a Batcher.
func TestDSparkExact(t *testing.T) {
	ctx := context.Background()
	m, err := LoadTiny(ctx, WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	prompt := m.Encode("package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfor i := 0; i < 10; i++ {\n\t\tfmt.Println(i)\n\t}\n}\n\nfunc add(a, b int) int {\n")
	depths := []int{1, 2, 3, 4, 5, 6, 7, 8} // the module's block is 7
	if raceEnabled || testing.Short() {
		depths = []int{4}
	}
	for _, depth := range depths {
		for _, sampled := range []bool{false, true} {
			opts := []GenerateOption{WithMaxTokens(40), WithoutDefaultStops()}
			if sampled {
				opts = append(opts, WithTemperature(0.7), WithSeed(uint64(depth)))
			}
			ds, err := m.NewDSpark()
			require.NoError(t, err)
			u := specMatchesPlain(t, m, prompt, opts, ds, depth, fmt.Sprintf("depth %d, sampled %v", depth, sampled))
			assert.Positive(t, u.DraftTokens, "depth %d", depth)
			if !sampled {
				t.Logf("depth %d: %d drafts, %d accepted", depth, u.DraftTokens, u.AcceptedTokens)
			}
		}
	}

	// The adaptive depth with DSpark's confidences choosing the prefix.
	for _, sampled := range []bool{false, true} {
		opts := []GenerateOption{WithMaxTokens(40), WithoutDefaultStops()}
		if sampled {
			opts = append(opts, WithTemperature(0.7), WithSeed(9))
		}
		plain, _ := m.NewSession()
		want, _ := genIDs(t, plain, prompt, opts...)
		plain.Close()
		ds, err := m.NewDSpark()
		require.NoError(t, err)
		s, _ := m.NewSession()
		got, u := genIDs(t, s, prompt, append(opts, WithAdaptiveSpeculation(ds, 7))...)
		s.Close()
		require.Equal(t, want, got, "adaptive, sampled %v", sampled)
		t.Logf("adaptive, sampled %v: %d drafts, %d accepted", sampled, u.DraftTokens, u.AcceptedTokens)
	}

	// In a Batcher, three sequences with a DSpark each: plain decoding's
	// tokens, and greedy, the drafts and acceptances of the sequence alone
	// (the anchor's hidden states come from its rows of the ragged pass).
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
			p := m.Encode(fmt.Sprint("func f", i, "(x int) int {\n\treturn x + ", i, "\n}\n\nfunc g", i, "("))
			opts := []GenerateOption{WithMaxTokens(24), WithoutDefaultStops()}
			alone, err := m.NewDSpark()
			if !assert.NoError(t, err) {
				return
			}
			s1, _ := m.NewSession()
			defer s1.Close()
			want, wantU := genIDs(t, s1, p, append(opts, WithSpeculation(alone, 4))...)
			ds, err := m.NewDSpark()
			if !assert.NoError(t, err) {
				return
			}
			s, _ := m.NewSession()
			defer s.Close()
			var got []int32
			var u Usage
			for tok, err := range br.GenerateTokens(ctx, s, p, append(opts, WithSpeculation(ds, 4))...) {
				if !assert.NoError(t, err) {
					return
				}
				got = append(got, tok.ID)
				if tok.Usage != nil {
					u = *tok.Usage
				}
			}
			assert.Equal(t, want, got, "sequence %d", i)
			assert.Equal(t, wantU.DraftTokens, u.DraftTokens, "sequence %d's drafts", i)
			assert.Equal(t, wantU.AcceptedTokens, u.AcceptedTokens, "sequence %d's accepted drafts", i)
		}()
	}
	wg.Wait()
}

// checkedDSpark drafts with a DSpark bound to the generating session and
// checks each block against a DSpark reading a fresh session fed the same
// history: the anchor is found after rollbacks too.
type checkedDSpark struct {
	t        *testing.T
	m        *Model
	ds       *DSpark
	calls    int
	mismatch int
}

func (c *checkedDSpark) bind(s *Session) { c.ds.bind(s) }

func (c *checkedDSpark) Draft(history []int32, n int, dst []int32) []int32 {
	start := len(dst)
	dst = c.ds.Draft(history, n, dst)
	got := append([]int32(nil), dst[start:]...)
	fresh, err := c.m.NewSession()
	require.NoError(c.t, err)
	defer fresh.Close()
	_, err = fresh.Forward(context.Background(), history[:len(history)-1])
	require.NoError(c.t, err)
	ref, err := c.m.NewDSpark()
	require.NoError(c.t, err)
	defer ref.Close()
	ref.bind(fresh)
	want := ref.Draft(history, n, nil)
	c.calls++
	if len(want) != len(got) || (len(want) > 0 && want[0] != got[0]) {
		c.mismatch++
	}
	return dst
}

func TestDSparkAnchorAfterRollback(t *testing.T) {
	checkDSparkAnchors(t, 32, 4, WithRollback(8))
}

// TestDSparkAnchorAcrossCuts: with the prefix cache a session's runs are
// cut at multiples of the prefill chunk, so a verify run may land in two
// passes, and a rollback into the first leaves its anchor outside the
// last pass; the drafter still finds it (found by TestRandomSpeculation:
// such a DSpark drafted nothing there, and with rejection sampling drew
// other tokens than in a Batcher, which does not cut verify runs).
func TestDSparkAnchorAcrossCuts(t *testing.T) {
	checkDSparkAnchors(t, 48, 5, WithRollback(8), WithPrefixCache(16<<20), WithPrefillChunk(3))
}

// checkDSparkAnchors generates maxTokens tokens of the embedded model
// loaded with opts, speculating depth deep with a checkedDSpark, and
// requires drafts rejected and every block a fresh session's.
func checkDSparkAnchors(t *testing.T, maxTokens, depth int, opts ...Option) {
	ctx := context.Background()
	m, err := LoadTiny(ctx, opts...)
	require.NoError(t, err)
	defer m.Close()
	ds, err := m.NewDSpark()
	require.NoError(t, err)
	c := &checkedDSpark{t: t, m: m, ds: ds}
	s, _ := m.NewSession()
	defer s.Close()
	_, u := genIDs(t, s, m.Encode("func (b *Buffer) Write(p []byte) (n int, err error) {\n"), WithMaxTokens(maxTokens), WithoutDefaultStops(), WithSpeculation(c, depth))
	require.Positive(t, c.calls)
	assert.Less(t, u.AcceptedTokens, u.DraftTokens, "some drafts were rejected, so the session rolled back")
	assert.Zero(t, c.mismatch, "blocks that differ from a fresh session's, of %d", c.calls)
}

// confidentOracle drafts a plain run's continuation with confidences that
// fall along the block, as DSpark's head would.
type confidentOracle struct {
	perfect
	conf    []float32
	drafted int // tokens drafted in all
}

func (c *confidentOracle) Draft(history []int32, n int, dst []int32) []int32 {
	k := len(dst)
	dst = c.perfect.Draft(history, n, dst)
	c.drafted += len(dst) - k
	c.conf = c.conf[:0]
	for i := range n {
		c.conf = append(c.conf, 0.99-0.2*float32(i))
	}
	return dst
}

func (c *confidentOracle) blockConfidences() []float32 { return c.conf }

// With confidences, the adaptive depth verifies the prefix they pay for:
// plain decoding's tokens, drafts accepted, and fewer drafts verified than
// drafted blocks would hold.
func TestConfidenceScheduledPrefix(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, "../testdata/model/tiny_k31pro", WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	// Pass costs of a fast machine, so that the choices do not depend on
	// this one's (under the race detector a pass of 8 rows can cost 8
	// steps, and then speculation never pays), and a step of 1,000 s, so
	// that the oracle's drafting time costs nothing: with a 1 ms step a
	// draft call that a loaded machine (the race detector beside other
	// packages' tests) stretched past a millisecond priced every draft
	// above its pass, and no draft was verified.
	pass := make([]float64, 9)
	for n := 1; n < len(pass); n++ {
		pass[n] = 1 + 0.05*float64(n-1)
	}
	m.specCosts = specdec.Costs{Pass: pass, Rollback: 0.2, Step: 1e3}
	prompt := m.Encode("the cat sat on the mat")
	plain, _ := m.NewSession()
	want, _ := genIDs(t, plain, prompt, WithMaxTokens(32), WithoutDefaultStops())
	plain.Close()
	d := &confidentOracle{perfect: perfect{append(append([]int32(nil), prompt...), want...)}}
	s, _ := m.NewSession()
	defer s.Close()
	got, u := genIDs(t, s, prompt, WithMaxTokens(32), WithoutDefaultStops(), WithAdaptiveSpeculation(d, 7))
	require.Equal(t, want, got)
	assert.Positive(t, u.AcceptedTokens)
	assert.Equal(t, u.DraftTokens, u.AcceptedTokens, "perfect drafts")
	assert.Less(t, u.DraftTokens, d.drafted-d.drafted/4, "the prefixes cut the blocks")
	t.Logf("%d drafts verified of %d drafted, all accepted", u.DraftTokens, d.drafted)
}

// TestDSparkFork: a fork continues as the session it copies, DSpark's
// drafts included: the same tokens under rejection sampling for a seed,
// and as many drafts (a fork once started without the module's rows, so
// its first draft was empty and its draws went another way).
func TestDSparkFork(t *testing.T) {
	_, ds, s := dsparkSession(t)
	f, err := s.Fork()
	require.NoError(t, err)
	defer f.Close()
	requireSameDraws(t, ds, s, f)
}

// dsparkSession loads the embedded model with a DSpark drafter and returns
// them with a session that has speculated through a prompt; the test's
// cleanup closes them.
func dsparkSession(t *testing.T) (*Model, *DSpark, *Session) {
	t.Helper()
	m, err := LoadTiny(context.Background(), WithRollback(8))
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	ds, err := m.NewDSpark()
	require.NoError(t, err)
	s, err := m.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	genIDs(t, s, m.Encode("func (b *Buffer) Write(p []byte) (n int, err error) {\n"), WithMaxTokens(9), WithoutDefaultStops(), WithSpeculation(ds, 4))
	return m, ds, s
}

// requireSameDraws generates under rejection sampling, whose draws follow
// the drafts, with one seed on a and on b: the same tokens, drafts and
// acceptances.
func requireSameDraws(t *testing.T, ds *DSpark, a, b *Session) {
	t.Helper()
	opts := []GenerateOption{WithMaxTokens(24), WithoutDefaultStops(), WithSpeculation(ds, 4), WithRejectionSampling(), WithTemperature(1), WithSeed(5)}
	want, wantUsage := genIDs(t, a, nil, opts...)
	got, gotUsage := genIDs(t, b, nil, opts...)
	require.Equal(t, want, got)
	require.Positive(t, wantUsage.DraftTokens)
	require.Equal(t, wantUsage.DraftTokens, gotUsage.DraftTokens)
	require.Equal(t, wantUsage.AcceptedTokens, gotUsage.AcceptedTokens)
}

// TestDSparkSaveLoad: a session file holds the rows a DSpark drafter
// reads, so a loaded session drafts as the saved one does: under
// rejection sampling, whose draws follow the drafts, a seed gives the
// same tokens, drafts and acceptances. A file without the rows (format
// version 1) still loads, and then drafts nothing at first.
func TestDSparkSaveLoad(t *testing.T) {
	// Speculating leaves rows past the session's position behind (a
	// rejected draft's), which the file leaves out.
	m, ds, s := dsparkSession(t)
	require.NotZero(t, s.tapsRows)
	var buf bytes.Buffer
	require.NoError(t, s.Save(&buf))
	f, err := s.Fork()
	require.NoError(t, err)
	defer f.Close()
	loaded, err := m.LoadSession(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	defer loaded.Close()
	require.Equal(t, s.tapsPos, loaded.tapsPos)
	rows := min(s.tapsRows, s.pos-s.tapsPos)
	require.Equal(t, rows, loaded.tapsRows)
	for i := range s.taps {
		require.Equal(t, s.taps[i][:rows*m.Config.HiddenSize], loaded.taps[i], "target layer %d", i)
	}

	requireSameDraws(t, ds, s, loaded)

	// The same file in format version 1: no rows, so the first draft is
	// empty; greedy decoding, which does not follow the drafts, gives the
	// saved session's tokens.
	d := m.Config.HiddenSize
	v1 := rewriteSession(t, buf.Bytes(), 1, func(body []byte) []byte {
		return body[:len(body)-16-4*len(s.taps)*rows*d]
	})
	old, err := m.LoadSession(bytes.NewReader(v1))
	require.NoError(t, err)
	defer old.Close()
	require.Zero(t, old.tapsRows)
	again, err := m.LoadSession(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	defer again.Close()
	greedy := []GenerateOption{WithMaxTokens(12), WithoutDefaultStops(), WithSpeculation(ds, 4)}
	want, _ := genIDs(t, again, nil, greedy...)
	got, _ := genIDs(t, old, nil, greedy...)
	require.Equal(t, want, got)

	// Rolled back after loading (through the replay logs), a loaded session
	// drafts as the original rolled back as far.
	back, err := m.LoadSession(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	defer back.Close()
	require.NoError(t, f.Truncate(context.Background(), f.Len()-3))
	require.NoError(t, back.Truncate(context.Background(), back.Len()-3))
	requireSameDraws(t, ds, f, back)

	// A section forged for another module, or cut short, is refused.
	section := 16 + 4*len(s.taps)*rows*d
	for _, c := range []struct {
		what string
		file []byte
		want string
	}{
		{"another module", forgeTaps(t, buf.Bytes(), section, 1, len(s.taps)+1, d, 0, (len(s.taps)+1)*d), fmt.Sprintf("reads %d", len(s.taps))},
		{"rows cut short", forgeTaps(t, buf.Bytes(), section, 2, len(s.taps), d, 0, 3*d), "DSpark rows of target layer 1"},
	} {
		_, err := m.LoadSession(bytes.NewReader(c.file))
		require.ErrorIs(t, err, ErrSessionFile, c.what)
		assert.Contains(t, err.Error(), c.want, c.what)
	}
	// A Group's rank has the module's config but not the module: it reads
	// the rows and drops them.
	draft := m.draft
	m.draft = nil
	rank, err := m.LoadSession(bytes.NewReader(buf.Bytes()))
	m.draft = draft
	require.NoError(t, err)
	defer rank.Close()
	assert.Nil(t, rank.taps)
	assert.Equal(t, s.Tokens()[:len(rank.Tokens())], rank.Tokens())
}
