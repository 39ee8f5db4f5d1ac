package serve

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/k3"
)

func TestSplitReasoning(t *testing.T) {
	for _, tc := range []struct {
		text               string
		cut                bool // by max_tokens or the context
		reasoning, content string
	}{
		{"<think>plan</think>answer", false, "plan", "answer"},
		{"plan</think>answer", false, "plan", "answer"},
		{"\n <think>x</think>", false, "x", ""},
		{"<think></think>hi", false, "", "hi"},
		{"<think>plan" + toolSectionBegin + "calls", false, "plan", toolSectionBegin + "calls"},
		{"plan</think>a " + toolSectionBegin + "b", false, "plan", "a " + toolSectionBegin + "b"},
		{"all reasoning, stopped </thi", false, "all reasoning, stopped </thi", ""},
		{"all reasoning, cut short </thi", true, "all reasoning, cut short ", ""},
		{"reasoning cut in a call's marker <|tool_ca", true, "reasoning cut in a call's marker ", ""},
		{"reasoning cut after a lone <", true, "reasoning cut after a lone <", ""},
		{"plan</think>answer cut </thi", true, "plan", "answer cut </thi"},
		{"<thi", false, "<thi", ""},
		{" <thi", true, "", ""},
		{"", true, "", ""},
		{"<thinking>x</think>y", false, "<thinking>x", "y"},
	} {
		r, c := splitReasoning(tc.text, tc.cut)
		assert.Equal(t, tc.reasoning, r, "%q cut %v", tc.text, tc.cut)
		assert.Equal(t, tc.content, c, "%q cut %v", tc.text, tc.cut)
	}
}

func FuzzSplitReasoning(f *testing.F) {
	f.Add("<think>a</think>b", 3)
	f.Add(" <thin", 1)
	f.Add("x<|tool_calls_section_begin|>y</think>", 5)
	f.Fuzz(func(t *testing.T, text string, step int) {
		cut := step%2 == 0
		step = max(1, step%8+1)
		r, c := splitReasoning(text, cut)
		var s reasoningStream
		var gr, gc strings.Builder
		for i := 0; i < len(text); i += step {
			a, b := s.next(text[i:min(i+step, len(text))])
			gr.WriteString(a)
			gc.WriteString(b)
		}
		a, b := s.end(cut)
		gr.WriteString(a)
		gc.WriteString(b)
		if gr.String() != r || gc.String() != c {
			t.Fatalf("%q in pieces of %d: %q + %q, whole %q + %q", text, step, gr.String(), gc.String(), r, c)
		}
	})
}

// TestReasoningAnswers: reasoning, content and tool calls come apart,
// whole and streamed (markers split over pieces never leak).
func TestReasoningAnswers(t *testing.T) {
	s, _, _ := newTestServer(t, Config{Name: "tiny", Reasoning: true})
	pieces := []string{"<thi", "nk>I should", " call it.</th", "ink>Sure. <|tool_calls_sec", "tion_begin|><|tool_call_begin|>functions.f:0",
		"<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"}
	job := func(stream bool) *job {
		return &job{chat: true, tools: true, reasoning: true, stream: stream, prompts: [][]int32{{1}}, n: 1}
	}
	var whole map[string]any
	require.NoError(t, json.Unmarshal(runJob(t, s, job(false), k3.FinishStop, pieces...), &whole))
	ch := whole["choices"].([]any)[0].(map[string]any)
	msg := ch["message"].(map[string]any)
	assert.Equal(t, "I should call it.", msg["reasoning_content"])
	assert.Equal(t, "Sure. ", msg["content"])
	assert.Len(t, msg["tool_calls"], 1)
	assert.Equal(t, "tool_calls", ch["finish_reason"])
	// "<thi", "nk>I should", " call it.</th" and "ink>Sure. ..." (which
	// closes the reasoning) are reasoning tokens.
	assert.Equal(t, map[string]any{"reasoning_tokens": 4.0}, whole["usage"].(map[string]any)["completion_tokens_details"])

	events, done := sse(t, strings.NewReader(string(runJob(t, s, job(true), k3.FinishStop, pieces...))))
	require.True(t, done)
	var reasoning, content strings.Builder
	calls := 0
	for _, ev := range events {
		d := ev["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
		if v, ok := d["reasoning_content"].(string); ok {
			reasoning.WriteString(v)
			assert.NotContains(t, v, "<", "a marker leaked into the reasoning")
		}
		if v, ok := d["content"].(string); ok {
			content.WriteString(v)
			assert.NotContains(t, v, "<")
		}
		if v, ok := d["tool_calls"].([]any); ok {
			calls += len(v)
		}
	}
	assert.Equal(t, "I should call it.", reasoning.String())
	assert.Equal(t, "Sure. ", content.String())
	assert.Equal(t, 1, calls)

	// Cut by max_tokens inside </think>: no part of the marker, whole or
	// streamed.
	cut := []string{"<think>I should", " call </th"}
	require.NoError(t, json.Unmarshal(runJob(t, s, job(false), k3.FinishLength, cut...), &whole))
	msg = whole["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	assert.Equal(t, "I should call ", msg["reasoning_content"])
	assert.Equal(t, "", msg["content"])
	events, _ = sse(t, strings.NewReader(string(runJob(t, s, job(true), k3.FinishLength, cut...))))
	reasoning.Reset()
	for _, ev := range events {
		d := ev["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
		if v, ok := d["reasoning_content"].(string); ok {
			reasoning.WriteString(v)
		}
		if v, ok := d["content"].(string); ok {
			assert.Empty(t, v)
		}
	}
	assert.Equal(t, "I should call ", reasoning.String())
}

// TestReasoningRequest: with Config.Reasoning the tiny model's text (no
// </think>) is all reasoning; chat_template_kwargs {"thinking": false}
// pre-fills an empty reasoning and leaves the text as content.
func TestReasoningRequest(t *testing.T) {
	_, hs, m := newTestServer(t, Config{Name: "tiny", Reasoning: true})
	msgs := []map[string]any{{"role": "user", "content": "func main() {"}}
	base := m.ChatPrompt([]k3.Message{{Role: "user", Content: "func main() {"}})

	code, out := post(t, hs.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 12, "temperature": 0})
	require.Equal(t, 200, code, "%v", out)
	want, _ := direct(t, m, m.Encode(base), k3.WithMaxTokens(12), k3.WithTemperature(0))
	msg := out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	assert.Equal(t, want, msg["reasoning_content"])
	assert.Equal(t, "", msg["content"])

	code, out = post(t, hs.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 12, "temperature": 0,
		"chat_template_kwargs": map[string]any{"thinking": false}})
	require.Equal(t, 200, code, "%v", out)
	prompt := m.Encode(base + "<think></think>")
	want, _ = direct(t, m, prompt, k3.WithMaxTokens(12), k3.WithTemperature(0))
	msg = out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	assert.Equal(t, want, msg["content"])
	assert.NotContains(t, msg, "reasoning_content")
	assert.EqualValues(t, len(prompt), out["usage"].(map[string]any)["prompt_tokens"])

	code, out = post(t, hs.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "chat_template_kwargs": map[string]any{"thinking": "no"}})
	require.Equal(t, 400, code)
	assert.Equal(t, "chat_template_kwargs", out["error"].(map[string]any)["param"])
}
