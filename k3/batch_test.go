package k3

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
)

// TestBatchEqualsSolo decodes sessions at different positions together and
// compares every step's logits, bit for bit, with each session decoding
// alone; sessions join and leave between steps.
func TestBatchEqualsSolo(t *testing.T) {
	for _, dir := range []string{tinyDir, "../testdata/model/tiny_kimi_linear", "../testdata/model/tiny_rope_dsa"} {
		ctx := context.Background()
		m, err := Load(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		prompts := [][]int32{{1, 5, 9, 200}, {1, 7}, {1, 30, 31, 32, 33, 34, 35, 36, 37}}
		var batched, solo []*Session
		for _, p := range prompts {
			s, _ := m.NewSession()
			if _, err := s.Forward(ctx, p); err != nil {
				t.Fatal(err)
			}
			c, _ := s.Clone()
			batched, solo = append(batched, s), append(solo, c)
		}
		bt, err := m.NewBatch(3)
		if err != nil {
			t.Fatal(err)
		}
		for step := 0; step < 6; step++ {
			// Session 1 sits out step 2; session 2 joins at step 1.
			var active []int
			for i := range batched {
				if (i == 1 && step == 2) || (i == 2 && step == 0) {
					continue
				}
				active = append(active, i)
			}
			var ss []*Session
			var toks []int32
			for _, i := range active {
				ss = append(ss, batched[i])
				toks = append(toks, int32(40+7*i+step))
			}
			if err := bt.Step(ctx, ss, toks); err != nil {
				t.Fatal(err)
			}
			for k, i := range active {
				want, err := solo[i].Forward(ctx, []int32{toks[k]})
				if err != nil {
					t.Fatal(err)
				}
				for j, w := range want {
					if batched[i].last[j] != w {
						t.Fatalf("%s step %d session %d: logit %d = %v batched, %v alone", dir, step, i, j, batched[i].last[j], w)
					}
				}
			}
		}
		m.Close()
	}
}

// TestBatcherMatchesSolo runs concurrent generations through the batcher
// and checks each against the same generation run alone.
func TestBatcherMatchesSolo(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := load(t)
	bat, err := m.NewBatcher(4)
	if err != nil {
		t.Fatal(err)
	}
	require.NoError(t, bat.Start(ctx))
	prompts := []string{"alpha", "be", "gamma ray", "delta", "epsilon!", "z"}
	want := make([][]int32, len(prompts))
	for i, p := range prompts {
		want[i] = collect(t, m.Generate(ctx, p, WithMaxTokens(6+i), WithoutDefaultStops()))
	}
	got := make([][]int32, len(prompts))
	errs := make(chan error, len(prompts))
	done := make(chan int)
	for i, p := range prompts {
		go func() {
			s, err := m.NewSession()
			if err != nil {
				errs <- err
				done <- i
				return
			}
			for tok, err := range bat.Generate(ctx, s, p, WithMaxTokens(6+i), WithoutDefaultStops()) {
				if err != nil {
					errs <- err
					break
				}
				if tok.ID >= 0 {
					got[i] = append(got[i], tok.ID)
				}
			}
			done <- i
		}()
	}
	for range prompts {
		<-done
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range prompts {
		if fmt.Sprint(got[i]) != fmt.Sprint(want[i]) {
			t.Errorf("prompt %q: batched %v, alone %v", prompts[i], got[i], want[i])
		}
	}
}

// TestLargeBatchEqualsSolo steps more sessions than compute.InvariantRows
// (and than the CPU backend's packed-product threshold) at once: every
// session must still get its solo logits to the bit.
func TestLargeBatchEqualsSolo(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const n = 2*compute.InvariantRows + 7
	var batched, solo []*Session
	toks := make([]int32, n)
	for i := range n {
		s, _ := m.NewSession()
		if _, err := s.Forward(ctx, []int32{1, int32(10 + i%50)}); err != nil {
			t.Fatal(err)
		}
		c, _ := s.Clone()
		batched, solo = append(batched, s), append(solo, c)
		toks[i] = int32(100 + 3*i)
	}
	bt, err := m.NewBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	if err := bt.Step(ctx, batched, toks); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		want, err := solo[i].Forward(ctx, toks[i:i+1])
		if err != nil {
			t.Fatal(err)
		}
		for j, w := range want {
			if batched[i].last[j] != w {
				t.Fatalf("session %d: logit %d = %v batched, %v alone", i, j, batched[i].last[j], w)
			}
		}
	}
}
