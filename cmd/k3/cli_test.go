package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/tiny"
	"k3/k3"
)

// TestHelp: every subcommand answers -h, -help and --help with its usage on
// stdout and exit 0, and runs nothing.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{"-h"}, {"--help"}, {"help"},
		{"run", "-h"}, {"chat", "--help"}, {"new-tiny", "-help"}, {"conform", "-h"}, {"inspect", "-h"},
		{"bench", "-h"}, {"bench", "dsa", "-h"}, {"bench", "kernels", "-h"}, {"bench", "model", "--help"}, {"bench", "spec", "-h"}, {"bench", "serve", "-h"},
		{"run", "-max-tokens", "3", "-h"},
	} {
		code, out, errOut := runCLI(args...)
		assert.Equal(t, 0, code, "%v", args)
		assert.Contains(t, out, "usage: k3", "%v", args)
		assert.Empty(t, errOut, "%v", args)
	}
	// Without -h, bad use still goes to stderr with exit 2.
	for _, args := range [][]string{{}, {"bench"}, {"bench", "nope"}, {"inspect"}, {"run", "-nope"}, {"bench", "kernels", "-x"}} {
		code, out, errOut := runCLI(args...)
		assert.Equal(t, 2, code, "%v", args)
		assert.Empty(t, out, "%v", args)
		assert.Contains(t, errOut, "usage", "%v", args)
	}
}

func TestRunCommand(t *testing.T) {
	// "func" is one token of the embedded model's vocabulary.
	code, out, errOut := runCLI("run", "-prompt", "func", "-max-tokens", "7", "-presence-penalty", "0.5",
		"-frequency-penalty", "0.25", "-stop", "\x00\x01never", "-no-default-stops")
	require.Equal(t, 0, code, errOut)
	assert.NotEmpty(t, out)
	assert.Contains(t, errOut, "stopped: token limit (-max-tokens 7)")
	assert.Contains(t, errOut, "prefill: 1 tokens")
	assert.Contains(t, errOut, "decode: 6 more tokens")
	assert.Contains(t, errOut, "7 generated in all")

	code, _, errOut = runCLI("run", "-prompt", "abc", "-frequency-penalty", "NaN")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "frequency_penalty = NaN")
}

// TestRunJSON: -json holds the embedded Go model's answer to JSON, with
// -speculate the same answer.
func TestRunJSON(t *testing.T) {
	code, out, errOut := runCLI("run", "-prompt", "func", "-max-tokens", "60", "-json")
	require.Equal(t, 0, code, errOut)
	assert.True(t, strings.HasPrefix(strings.TrimSpace(out), "{"), "%q", out)
	code, spec, errOut := runCLI("run", "-prompt", "func", "-max-tokens", "60", "-json", "-speculate", "ngram")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, out, spec)
}

func TestRunJSONSchema(t *testing.T) {
	dir := t.TempDir()
	schema := filepath.Join(dir, "answer.json")
	require.NoError(t, os.WriteFile(schema, []byte(`{"enum":["yes","no",7]}`), 0o644))
	code, out, errOut := runCLI("run", "-prompt", "func", "-max-tokens", "20", "-json-schema", schema)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, []string{`"yes"`, `"no"`, "7"}, strings.TrimSpace(out))
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"type":"string","format":"uri"}`), 0o644))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-json-schema", bad}, `bad.json: invalid option: jsonschema: not supported: #/format "uri"`},
		{[]string{"-json-schema", filepath.Join(dir, "missing.json")}, "missing.json"},
		{[]string{"-json-schema", schema, "-json"}, "-json and -json-schema"},
	} {
		code, _, errOut := runCLI(append([]string{"run", "-prompt", "func"}, tc.args...)...)
		assert.Equal(t, 1, code, tc.args)
		assert.Contains(t, errOut, tc.want)
	}
}

func TestConformNoCases(t *testing.T) {
	code, _, errOut := runCLI("conform", t.TempDir())
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "no conformance cases")
}

// interruptingWriter sends an interrupt the first time answer text
// arrives, as Ctrl-C during a reply would.
type interruptingWriter struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	prompts   int
	sent      bool
	interrupt chan os.Signal
}

func (w *interruptingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if string(p) == "> " {
		w.prompts++
	} else if w.prompts == 1 && !w.sent && len(p) > 0 && string(p) != "\n" {
		w.sent = true
		w.interrupt <- os.Interrupt
	}
	return w.buf.Write(p)
}

// newChat is a new session of m for chatLoop, closed with the test.
func newChat(t *testing.T, m *k3.Model) *k3.Session {
	t.Helper()
	s, err := m.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestChatInterrupt(t *testing.T) {
	ctx := context.Background()
	m, err := k3.LoadTiny(ctx)
	require.NoError(t, err)
	defer m.Close()
	g := &genFlags{maxTokens: 100000, noDefaultStops: true, topP: 1, repPen: 1}

	// Ctrl-C during the first answer stops it; the chat goes on.
	out := &interruptingWriter{interrupt: make(chan os.Signal, 1)}
	done := make(chan error, 1)
	go func() {
		done <- chatLoop(ctx, m, newChat(t, m), g, "sys", strings.NewReader("hello\n/help\n/exit\n"), out, out.interrupt)
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("Ctrl-C did not stop the answer")
	}
	text := out.buf.String()
	assert.Contains(t, text, "(answer stopped)")
	assert.Contains(t, text, "/reset", "the /help text after the stopped answer")

	// Ctrl-C at the prompt leaves cleanly.
	in, w := io.Pipe()
	defer w.Close()
	interrupts := make(chan os.Signal, 1)
	var buf bytes.Buffer
	go func() { done <- chatLoop(ctx, m, newChat(t, m), g, "sys", in, &buf, interrupts) }()
	time.Sleep(50 * time.Millisecond)
	interrupts <- os.Interrupt
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Ctrl-C at the prompt did not end the chat")
	}

	// An answer cut by the token limit closes its turn and says so.
	g = &genFlags{maxTokens: 3, noDefaultStops: true, topP: 1, repPen: 1}
	buf.Reset()
	require.NoError(t, chatLoop(ctx, m, newChat(t, m), g, "sys", strings.NewReader("a\nb\n"), &buf, make(chan os.Signal)))
	assert.Equal(t, 2, strings.Count(buf.String(), "(answer cut at 3 tokens)"))

	// An answer that fills the context says so and the chat goes on (on a
	// copy of the tiny model with a 96-token context, to stay quick).
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir, "k31pro", tiny.Options{Seed: 1, BF16: true, Edit: func(text map[string]any) {
		text["max_position_embeddings"] = 96
	}}))
	short, err := k3.Load(ctx, dir)
	require.NoError(t, err)
	defer short.Close()
	g = &genFlags{maxTokens: 100000, noDefaultStops: true, topP: 1, repPen: 1}
	buf.Reset()
	require.NoError(t, chatLoop(ctx, short, newChat(t, short), g, "sys", strings.NewReader("a\nb\n/reset\nc\n"), &buf, make(chan os.Signal)))
	assert.Equal(t, 3, strings.Count(buf.String(), "fills the model's context"), buf.String()[max(0, buf.Len()-300):])
}

// TestBenchSpecFlags: bad bench flags fail before any work, naming the flag.
func TestBenchSpecFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "spec", "-alpha", "1.5"}, "-alpha"},
		{[]string{"bench", "spec", "-depth", "0"}, "-depth"},
		{[]string{"bench", "spec", "-depth", "3,x"}, "-depth"},
		{[]string{"bench", "spec", "-tokens", "2"}, "-tokens"},
		{[]string{"bench", "model", "-backend", "ascend"}, "-backend"},
		{[]string{"bench", "model", "-presets", "7b"}, "-presets"},
		{[]string{"bench", "serve", "-prefix-cache-mb", "-1"}, "-prefix-cache-mb"},
		{[]string{"bench", "serve", "-clients", "0"}, "-clients"},
	} {
		code, _, errOut := runCLI(c.args...)
		assert.NotEqual(t, 0, code, "%v", c.args)
		assert.Contains(t, errOut, c.want, "%v", c.args)
	}
}

func TestRunSpeculate(t *testing.T) {
	code, out, errOut := runCLI("run", "-prompt", "x := 1\nx := 1\nx := 1\n", "-max-tokens", "24", "-no-default-stops", "-speculate", "ngram", "-draft-depth", "3")
	require.Equal(t, 0, code, errOut)
	assert.NotEmpty(t, out)
	assert.Contains(t, errOut, "speculation (ngram, depth 3):")
	assert.Contains(t, errOut, "plain decoding of the same 24 tokens")
	code, _, errOut = runCLI("run", "-prompt", "x := 1\nx := 1\n", "-max-tokens", "12", "-no-default-stops", "-speculate", "ngram")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, errOut, "speculation (ngram, depth auto):")
	// A smaller model as the drafter: here the same checkpoint, whose
	// greedy drafts are all right.
	code, _, errOut = runCLI("run", "-model", "../../testdata/model/tiny_k31pro", "-prompt", "the cat", "-max-tokens", "20",
		"-no-default-stops", "-speculate", "model:../../testdata/model/tiny_k31pro", "-draft-depth", "4")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, errOut, "accepted (100%)")
	// The embedded model's own first 4 layers.
	code, _, errOut = runCLI("run", "-prompt", "func main() {", "-max-tokens", "20", "-no-default-stops", "-speculate", "self:4", "-draft-depth", "3")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, errOut, "speculation (self:4, depth 3):")
	// The embedded checkpoint's own draft module.
	code, _, errOut = runCLI("run", "-prompt", "func main() {", "-max-tokens", "20", "-no-default-stops", "-speculate", "dspark", "-draft-depth", "4")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, errOut, "speculation (dspark, depth 4):")

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-speculate", "nope"}, `-speculate "nope"`},
		{[]string{"run", "-model", "../../testdata/model/tiny_k3", "-speculate", "dspark"}, "no DSpark draft module"},
		{[]string{"run", "-speculate", "ngram", "-draft-depth", "0"}, "-draft-depth 0"},
		{[]string{"run", "-speculate", "ngram", "-draft-depth", "many"}, "-draft-depth many"},
		{[]string{"run", "-speculate", "ngram", "-draft-depth", "16"}, "-draft-depth 16"},
		{[]string{"run", "-speculate", "model:/no/such/dir"}, "/no/such/dir"},
		{[]string{"run", "-speculate", "self:0"}, "want self:N"},
		{[]string{"run", "-speculate", "self:x"}, "want self:N"},
		{[]string{"run", "-speculate", "self:6"}, "drafter of 6 layers (the model has 6"},
		{[]string{"run", "-model", "../../testdata/model/tiny_k3", "-speculate", "model:"}, `-speculate "model:"`},
		{[]string{"run", "-speculate", "model:../../testdata/model/tiny_k3"}, "draft model scores 512 tokens"},
	} {
		code, _, errOut := runCLI(c.args...)
		assert.Equal(t, 1, code, "%v", c.args)
		assert.Contains(t, errOut, c.want, "%v", c.args)
	}
}

// TestRunGroup: k3 run -tp/-ep/-cp splits the checkpoint over ranks and
// prints the greedy completion one rank prints, with the ranks' shares;
// what a split model cannot do is refused by name.
func TestRunGroup(t *testing.T) {
	const model = "../../testdata/model/tiny_k31pro"
	args := []string{"run", "-model", model, "-prompt", "the cat", "-max-tokens", "12", "-temperature", "0", "-no-default-stops"}
	code, want, errOut := runCLI(args...)
	require.Equal(t, 0, code, errOut)
	for _, split := range [][]string{{"-tp", "2", "-ep", "2"}, {"-cp", "2"}, {"-tp", "2", "-speculate", "ngram", "-draft-depth", "3"}} {
		code, out, errOut := runCLI(append(slices.Clone(args), split...)...)
		require.Equal(t, 0, code, "%v: %s", split, errOut)
		assert.Equal(t, want, out, "%v", split)
		assert.Contains(t, errOut, "12 generated in all", "%v", split)
		assert.Contains(t, errOut, "ranks: ", "%v", split)
	}
	// A schema holds every rank's draws alike.
	schema := filepath.Join(t.TempDir(), "answer.json")
	require.NoError(t, os.WriteFile(schema, []byte(`{"enum":["yes","no",7]}`), 0o644))
	code, out, errOut := runCLI("run", "-model", model, "-tp", "2", "-prompt", "x", "-max-tokens", "20", "-json-schema", schema)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, []string{`"yes"`, `"no"`, "7"}, strings.TrimSpace(out))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-tp", "2"}, "give -model DIR"},
		{[]string{"run", "-model", model, "-tp", "2", "-speculate", "ngram"}, "at a fixed -draft-depth only"},
		{[]string{"run", "-model", model, "-ep", "2", "-speculate", "dspark", "-draft-depth", "2"}, "with ngram at a fixed -draft-depth only"},
		{[]string{"run", "-model", model, "-tp", "2", "-ep", "3"}, "layout tp2 ep3: 2 does not divide 3"},
	} {
		code, _, errOut := runCLI(c.args...)
		assert.Equal(t, 1, code, "%v", c.args)
		assert.Contains(t, errOut, c.want, "%v", c.args)
	}
}

// TestChatGroup: k3 chat on a split model holds the conversation as one
// rank does: the same answers turn after turn, /reset included.
func TestChatGroup(t *testing.T) {
	ctx := context.Background()
	const model = "../../testdata/model/tiny_k31pro"
	g := &genFlags{maxTokens: 6, noDefaultStops: true, topP: 1, repPen: 1}
	script := "the cat\nsat on\n/reset\nthe cat\n"
	one, err := k3.Load(ctx, model)
	require.NoError(t, err)
	defer one.Close()
	var want bytes.Buffer
	require.NoError(t, chatLoop(ctx, one, newChat(t, one), g, "sys", strings.NewReader(script), &want, make(chan os.Signal)))
	grp, err := k3.LoadGroup(ctx, model, k3.Layout{TP: 2, EP: 2})
	require.NoError(t, err)
	defer grp.Close()
	gs, err := grp.NewSession()
	require.NoError(t, err)
	defer gs.Close()
	var got bytes.Buffer
	require.NoError(t, chatLoop(ctx, grp.Ranks()[0], gs, g, "sys", strings.NewReader(script), &got, make(chan os.Signal)))
	assert.Equal(t, want.String(), got.String())
	assert.Equal(t, 3, strings.Count(got.String(), "(answer cut at 6 tokens)"), got.String())

	code, out, errOut := runCLI("chat", "-model", model, "-tp", "2")
	assert.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "over 2 ranks (tp2 ep1)")
	code, _, errOut = runCLI("chat", "-tp", "2")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "give -model DIR")
}
