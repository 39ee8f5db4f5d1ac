package k3

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/specdec"
)

const groupTestDir = "../testdata/model/tiny_k31pro"

// groupSession feeds prompt to a new session of g.
func groupSession(t *testing.T, g *Group, prompt []int32) *GroupSession {
	t.Helper()
	gs, err := g.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { gs.Close() })
	_, err = gs.Forward(context.Background(), prompt)
	require.NoError(t, err)
	return gs
}

// saveGroup returns gs's file.
func saveGroup(t *testing.T, gs *GroupSession) []byte {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, gs.Save(&buf))
	return buf.Bytes()
}

// groupRanks splits a group file into its header and its ranks' files.
func groupRanks(t *testing.T, file []byte) (head []byte, ranks [][]byte) {
	t.Helper()
	const headLen = 8 + 2 + 12 + 1 + 4
	head, rest := file[:headLen], file[headLen:]
	for len(rest) > 0 {
		n := int(binary.LittleEndian.Uint64(rest))
		ranks = append(ranks, rest[8:8+n])
		rest = rest[8+n:]
	}
	return head, ranks
}

// refusal is a group file LoadSession must refuse with ErrSessionFile,
// its error containing want.
type refusal struct {
	what, want string
	file       []byte
}

func refused(t *testing.T, g *Group, cases []refusal) {
	t.Helper()
	for _, c := range cases {
		gs, err := g.LoadSession(bytes.NewReader(c.file))
		assert.Nil(t, gs, c.what)
		assert.ErrorIs(t, err, ErrSessionFile, c.what)
		assert.ErrorContains(t, err, c.want, c.what)
	}
}

// bitsOf returns v's bits, so that equal means bitwise equal (NaN too).
func bitsOf(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = math.Float32bits(x)
	}
	return out
}

// joinGroup is groupRanks' inverse.
func joinGroup(head []byte, ranks ...[]byte) []byte {
	out := append([]byte(nil), head...)
	for _, r := range ranks {
		out = binary.LittleEndian.AppendUint64(out, uint64(len(r)))
		out = append(out, r...)
	}
	return out
}

// TestGroupSaveLoad: a TP, an EP and a TP×EP group's sequence saved and
// loaded gives the saved one's logits bitwise, step after step, and the
// same generation; a file of another layout, with its ranks swapped or
// taken from two sequences, cut short or padded, or a lone session's
// file, is refused with ErrSessionFile naming the problem.
func TestGroupSaveLoad(t *testing.T) {
	ctx := context.Background()
	prompt := []int32{5, 9, 17, 33, 65, 129, 257, 3, 11, 200, 7}
	files := map[string][]byte{}
	for _, l := range []Layout{{TP: 2}, {EP: 2}, {TP: 2, EP: 2, Dispatch: true}, {CP: 2}, {TP: 2, CP: 2}} {
		g, err := LoadGroup(ctx, groupTestDir, l)
		require.NoError(t, err, "%v", l)
		defer g.Close()
		gs := groupSession(t, g, prompt)
		file := saveGroup(t, gs)
		files[l.String()] = file
		loaded, err := g.LoadSession(bytes.NewReader(file))
		require.NoError(t, err, "%v", l)
		defer loaded.Close()
		for _, tok := range []int32{4, 300, 19} {
			want, err := gs.Forward(ctx, []int32{tok})
			require.NoError(t, err)
			got, err := loaded.Forward(ctx, []int32{tok})
			require.NoError(t, err)
			require.Equal(t, bitsOf(want), bitsOf(got), "%v: logits after %d", l, tok)
		}
		var want, got []int32
		for tok, err := range gs.GenerateTokens(ctx, nil, WithMaxTokens(5), WithTemperature(0), WithoutDefaultStops()) {
			require.NoError(t, err)
			want = append(want, tok.ID)
		}
		for tok, err := range loaded.GenerateTokens(ctx, nil, WithMaxTokens(5), WithTemperature(0), WithoutDefaultStops()) {
			require.NoError(t, err)
			got = append(got, tok.ID)
		}
		require.Len(t, want, 5)
		require.Equal(t, want, got, "%v", l)
	}

	g, err := LoadGroup(ctx, groupTestDir, Layout{TP: 2})
	require.NoError(t, err)
	defer g.Close()
	tp2 := files["tp2 ep1"]
	head, ranks := groupRanks(t, tp2)
	require.Len(t, ranks, 2)
	other := saveGroup(t, groupSession(t, g, prompt[:4]))
	_, otherRanks := groupRanks(t, other)
	lone, err := g.Ranks()[0].NewSession()
	require.NoError(t, err)
	defer lone.Close()
	var loneFile bytes.Buffer
	require.NoError(t, lone.Save(&loneFile))
	version := bytes.Clone(head)
	version[8] = 2
	refused(t, g, []refusal{
		{"another layout", "saved by a group of layout tp1 ep2; this group is tp2 ep1", files["tp1 ep2"]},
		{"a lone session", `not a k3 group session (it starts "K3SESSN\n")`, loneFile.Bytes()},
		{"a later version", "group format version 2", joinGroup(version, ranks...)},
		{"ranks swapped", "rank 0: k3: bad session file: saved from another model", joinGroup(head, ranks[1], ranks[0])},
		{"two sequences", "rank 1 holds another sequence than rank 0", joinGroup(head, ranks[0], otherRanks[1])},
		{"one rank", "rank 1's length", joinGroup(head, ranks[0])},
		{"a rank cut short", "rank 1:", joinGroup(head, ranks[0], ranks[1][:len(ranks[1])-3])},
		{"a rank padded", "rank 0:", joinGroup(head, append(bytes.Clone(ranks[0]), 0, 0, 0, 0), ranks[1])},
		{"the header cut short", "the layout and rank count", tp2[:15]},
		{"nothing", "10-byte header", nil},
	})
	// Every cut of a file fails, and a failed load leaves the group
	// usable.
	for n := 0; n < len(tp2); n += 1 + len(tp2)/97 {
		_, err := g.LoadSession(bytes.NewReader(tp2[:n]))
		require.ErrorIs(t, err, ErrSessionFile, "cut at %d of %d", n, len(tp2))
	}
	gs, err := g.LoadSession(bytes.NewReader(tp2))
	require.NoError(t, err)
	require.NoError(t, gs.Close())

	// Under CP the ranks are whole models alike: each share names its
	// rank, and all must place the positions alike.
	cp, err := LoadGroup(ctx, groupTestDir, Layout{CP: 2})
	require.NoError(t, err)
	defer cp.Close()
	cpFile := files["tp1 ep1 cp2"]
	cpHead, cpRanks := groupRanks(t, cpFile)
	require.Len(t, cpRanks, 2)
	longer := saveGroup(t, groupSession(t, cp, append(slices.Clone(prompt), 1, 2)))
	_, longerRanks := groupRanks(t, longer)
	refused(t, cp, []refusal{
		{"a TP file", "saved by a group of layout tp2 ep1; this group is tp1 ep1 cp2", tp2},
		{"CP ranks swapped", "rank 0: k3: bad session file: the share of CP rank 1, read by rank 0", joinGroup(cpHead, cpRanks[1], cpRanks[0])},
		{"CP ranks of two sequences", "rank 1", joinGroup(cpHead, cpRanks[0], longerRanks[1])},
		{"a CP rank cut short", "rank 1:", joinGroup(cpHead, cpRanks[0], cpRanks[1][:len(cpRanks[1])/2])},
	})
	_, err = g.LoadSession(bytes.NewReader(cpFile))
	assert.ErrorContains(t, err, "saved by a group of layout tp1 ep1 cp2; this group is tp2 ep1")
}

// FuzzLoadGroupSession: any bytes either load as a group session that
// runs, or fail with ErrSessionFile; nothing panics.
func FuzzLoadGroupSession(f *testing.F) {
	ctx := context.Background()
	var groups []*Group
	for _, l := range []Layout{{TP: 2}, {CP: 2}} {
		g, err := LoadGroup(ctx, groupTestDir, l)
		if err != nil {
			f.Fatal(err)
		}
		defer g.Close()
		groups = append(groups, g)
		gs, err := g.NewSession()
		if err != nil {
			f.Fatal(err)
		}
		if _, err := gs.Forward(ctx, []int32{1, 2, 3}); err != nil {
			f.Fatal(err)
		}
		var buf bytes.Buffer
		if err := gs.Save(&buf); err != nil {
			f.Fatal(err)
		}
		gs.Close()
		file := buf.Bytes()
		f.Add(file)
		f.Add(file[:8+2+12+1+4])
		f.Add(file[:len(file)/2])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, g := range groups {
			got, err := g.LoadSession(bytes.NewReader(b))
			if err != nil {
				checkLoadFailed(t, got == nil, err)
				continue
			}
			if _, err := got.Forward(ctx, []int32{1}); err != nil {
				t.Fatalf("a loaded session cannot run: %v", err)
			}
			got.Close()
		}
	})
}

// TestGroupBadInput: what a session refuses (no tokens, a token outside
// the vocabulary, more than the context, bad options, speculation a group
// cannot run) a TP group refuses with the same sentinel, and stays usable:
// no rank aborted the group's collectives.
func TestGroupBadInput(t *testing.T) {
	ctx := context.Background()
	g, err := LoadGroup(ctx, groupTestDir, Layout{TP: 2}, WithRollback(4))
	require.NoError(t, err)
	defer g.Close()
	gs := groupSession(t, g, []int32{5, 9, 17})
	_, err = gs.Forward(ctx, nil)
	assert.ErrorIs(t, err, ErrEmptyPrompt)
	_, err = gs.Forward(ctx, []int32{1, -1})
	assert.ErrorIs(t, err, ErrBadToken)
	_, err = gs.Forward(ctx, make([]int32, g.Ranks()[0].ContextLength()))
	assert.ErrorIs(t, err, ErrContextFull)
	gen := func(prompt []int32, opts ...GenerateOption) error {
		for _, err := range gs.GenerateTokens(ctx, prompt, opts...) {
			if err != nil {
				return err
			}
		}
		return nil
	}
	assert.ErrorIs(t, gen(nil, WithTemperature(-1)), ErrInvalidOption)
	assert.ErrorIs(t, gen([]int32{512}), ErrBadToken)
	assert.ErrorIs(t, gen(nil, WithSpeculation(specdec.NGram{}, 8)), ErrInvalidOption, "deeper than the rollback")
	assert.ErrorIs(t, gen(nil, WithAdaptiveSpeculation(specdec.NGram{}, 2)), compute.ErrUnsupported)
	assert.ErrorIs(t, gen(nil, WithSpeculation(&DSpark{}, 2)), compute.ErrUnsupported)
	assert.ErrorIs(t, gs.Truncate(ctx, 4), ErrOutOfRange)
	_, err = LoadGroup(ctx, groupTestDir, Layout{TP: 2}, WithPrefixCache(1<<20))
	assert.ErrorIs(t, err, ErrInvalidOption, "no prefix cache on a group")
	assert.Equal(t, 3, gs.Len(), "nothing changed")

	_, err = gs.Forward(ctx, []int32{7})
	require.NoError(t, err, "the group still runs")
	n := 0
	for _, err := range gs.GenerateTokens(ctx, []int32{3}, WithMaxTokens(3)) {
		require.NoError(t, err)
		n++
	}
	assert.Equal(t, 3, n)

	// The text form encodes as the model does.
	var text, ids []int32
	for tok, err := range groupSession(t, g, []int32{5}).Generate(ctx, "ab c", WithMaxTokens(4), WithTemperature(0)) {
		require.NoError(t, err)
		text = append(text, tok.ID)
	}
	for tok, err := range groupSession(t, g, []int32{5}).GenerateTokens(ctx, g.Ranks()[0].Encode("ab c"), WithMaxTokens(4), WithTemperature(0)) {
		require.NoError(t, err)
		ids = append(ids, tok.ID)
	}
	assert.Len(t, text, 4)
	assert.Equal(t, ids, text)
}

// TestGroupSpeculation: a TP×EP group speculating at a fixed depth gives
// the tokens its plain generation gives, greedy and sampled with a seed,
// with drafts that are partly right (so that ranks roll back alike), and
// with a draft model outside the group; a self-draft is refused.
func TestGroupSpeculation(t *testing.T) {
	ctx := context.Background()
	g, err := LoadGroup(ctx, groupTestDir, Layout{TP: 2, EP: 2}, WithRollback(4))
	require.NoError(t, err)
	defer g.Close()
	prompt := []int32{5, 9, 17, 33, 65, 129}
	alone, err := Load(ctx, groupTestDir, WithRollback(4))
	require.NoError(t, err)
	defer alone.Close()
	dm, err := g.Ranks()[0].NewDraftModel(alone)
	require.NoError(t, err)
	defer dm.Close()
	// A self-draft takes the state of the session it drafts for: refused.
	self, err := alone.NewSelfDraft(1)
	require.NoError(t, err)
	defer self.Close()
	gs, err := g.NewSession()
	require.NoError(t, err)
	defer gs.Close()
	for _, err := range gs.GenerateTokens(ctx, prompt, WithSpeculation(self, 2)) {
		require.ErrorIs(t, err, compute.ErrUnsupported)
	}
	for _, opts := range [][]GenerateOption{
		{WithMaxTokens(14), WithTemperature(0), WithoutDefaultStops()},
		{WithMaxTokens(14), WithTemperature(0.9), WithSeed(7), WithoutDefaultStops()},
	} {
		run := func(more ...GenerateOption) ([]int32, Usage) {
			gs, err := g.NewSession()
			require.NoError(t, err)
			defer gs.Close()
			var ids []int32
			var u Usage
			for tok, err := range gs.GenerateTokens(ctx, prompt, append(slices.Clone(opts), more...)...) {
				require.NoError(t, err)
				ids = append(ids, tok.ID)
				if tok.Usage != nil {
					u = *tok.Usage
				}
			}
			return ids, u
		}
		want, _ := run()
		require.Len(t, want, 14)
		got, u := run(WithSpeculation(oracle{append(slices.Clone(prompt), want...)}, 3))
		require.Equal(t, want, got)
		assert.Positive(t, u.AcceptedTokens, "drafts were kept")
		assert.Less(t, u.AcceptedTokens, u.DraftTokens, "drafts were rejected")
		// A model outside the group as the drafter, which every rank
		// calls: here the same checkpoint alone.
		got, u = run(WithSpeculation(dm, 3))
		require.Equal(t, want, got, "a draft model")
		assert.Positive(t, u.AcceptedTokens, "a draft model's drafts were kept")
	}
}

// TestGroupConcurrentSessions: sessions of one group used from several
// goroutines at once (a Forward beside generations, speculating or not)
// give what each gives alone, bitwise, under TP×EP and CP: the ranks'
// collectives of two sessions never pair up (they once did: the group
// aborted, or summed one session's partials with another's).
func TestGroupConcurrentSessions(t *testing.T) {
	ctx := context.Background()
	for _, l := range []Layout{{TP: 2, EP: 2}, {CP: 2}} {
		g, err := LoadGroup(ctx, groupTestDir, l, WithRollback(4))
		require.NoError(t, err)
		defer g.Close()
		prompts := [][]int32{{1, 2, 3, 4, 5}, {9, 8, 7, 6, 5}, {40, 41, 42, 43, 44, 45, 46, 47}}
		opts := func(i int) []GenerateOption {
			o := []GenerateOption{WithMaxTokens(6), WithTemperature(0.8), WithSeed(uint64(i)), WithoutDefaultStops()}
			if i == 2 && l.CP == 0 {
				o = append(o, WithSpeculation(specdec.NGram{}, 2))
			}
			return o
		}
		// What each does alone: the prompt's logits, then a generation.
		type result struct {
			logits []float32
			ids    []int32
		}
		run := func(i int) (result, error) {
			gs, err := g.NewSession()
			if err != nil {
				return result{}, err
			}
			defer gs.Close()
			var r result
			if r.logits, err = gs.Forward(ctx, prompts[i]); err != nil {
				return r, err
			}
			for tok, err := range gs.GenerateTokens(ctx, nil, opts(i)...) {
				if err != nil {
					return r, err
				}
				r.ids = append(r.ids, tok.ID)
			}
			return r, nil
		}
		want := make([]result, len(prompts))
		for i := range prompts {
			want[i], err = run(i)
			require.NoError(t, err, "%v", l)
			require.Len(t, want[i].ids, 6)
		}
		for round := range 4 {
			got := make([]result, len(prompts))
			errs := make([]error, len(prompts))
			var wg sync.WaitGroup
			for i := range prompts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[i], errs[i] = run(i)
				}()
			}
			wg.Wait()
			for i := range prompts {
				require.NoError(t, errs[i], "%v round %d session %d", l, round, i)
				require.Equal(t, bitsOf(want[i].logits), bitsOf(got[i].logits), "%v round %d session %d", l, round, i)
				require.Equal(t, want[i].ids, got[i].ids, "%v round %d session %d", l, round, i)
			}
		}
	}
}

// TestGroupClosed: a closed group session, and a session of a closed
// group, fail every call with ErrSessionClosed or ErrClosed, and
// nothing touches
// the ranks' freed weights (a CP session's pass once did: a fault).
func TestGroupClosed(t *testing.T) {
	ctx := context.Background()
	for _, l := range []Layout{{TP: 2}, {CP: 2}} {
		g, err := LoadGroup(ctx, groupTestDir, l)
		require.NoError(t, err)
		closed := groupSession(t, g, []int32{1, 2})
		require.NoError(t, closed.Close())
		orphan := groupSession(t, g, []int32{1, 2})
		require.NoError(t, g.Close())
		for _, c := range []struct {
			gs   *GroupSession
			want error
		}{{closed, ErrSessionClosed}, {orphan, ErrClosed}} {
			_, err := c.gs.Forward(ctx, []int32{1})
			assert.ErrorIs(t, err, c.want, "%v Forward", l)
			for _, err := range c.gs.GenerateTokens(ctx, []int32{1}) {
				assert.ErrorIs(t, err, c.want, "%v Generate", l)
			}
			assert.ErrorIs(t, c.gs.Reset(), c.want, "%v Reset", l)
			assert.ErrorIs(t, c.gs.Truncate(ctx, 1), c.want, "%v Truncate", l)
			_, err = c.gs.Fork()
			assert.ErrorIs(t, err, c.want, "%v Fork", l)
			assert.ErrorIs(t, c.gs.Save(&bytes.Buffer{}), c.want, "%v Save", l)
		}
		_, err = g.NewSession()
		assert.ErrorIs(t, err, ErrClosed, "%v NewSession", l)
		assert.NoError(t, orphan.Close())
	}
}
