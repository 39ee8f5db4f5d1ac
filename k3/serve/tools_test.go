package serve

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/k3"
)

var weatherTool = map[string]any{"type": "function", "function": map[string]any{
	"name": "get_weather", "description": "Weather of a city <b>&</b>",
	"parameters": json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","minLength":1.50}},"required":["city"]}`),
}}

// TestToolPrompt: tools, an assistant's tool calls and a tool's result
// render as the Kimi chat template does (written out here by hand).
func TestToolPrompt(t *testing.T) {
	_, hs, m := newTestServer(t, Config{Name: "tiny"})
	code, out := post(t, hs.URL+"/tokenize", map[string]any{
		"tools": []any{weatherTool},
		"messages": []map[string]any{
			{"role": "user", "content": "Weather in Paris?"},
			{"role": "assistant", "content": nil, "tool_calls": []map[string]any{
				{"id": "functions.get_weather:0", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": `{"city": "Paris"}`}},
			}},
			{"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18 C"},
			{"role": "tool", "tool_call_id": "functions.get_weather:1", "name": "get_weather", "content": "19 C"},
		},
	})
	require.Equal(t, 200, code, "%v", out)
	var ids []int32
	for _, v := range out["tokens"].([]any) {
		ids = append(ids, int32(v.(float64)))
	}
	want := `<|im_system|>tool_declare<|im_middle|>[{"function":{"description":"Weather of a city <b>&</b>","name":"get_weather",` +
		`"parameters":{"properties":{"city":{"minLength":1.50,"type":"string"}},"required":["city"],"type":"object"}},"type":"function"}]<|im_end|>` +
		`<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>` +
		`<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>` +
		"<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n18 C<|im_end|>" +
		"<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:1\n19 C<|im_end|>" +
		`<|im_assistant|>assistant<|im_middle|>`
	assert.Equal(t, want, m.Decode(ids))
}

func TestParseToolCalls(t *testing.T) {
	call := func(id, args string) string {
		return toolCallBegin + id + toolArgsBegin + args + toolCallEnd
	}
	for _, tc := range []struct {
		name, text string
		cut        bool // by max_tokens or the context
		content    string
		ok         bool
		ids, names []string
		args       []string
		cutLast    bool // the last call's arguments were cut short
	}{
		{"none", "plain <|tool text", false, "plain <|tool text", false, nil, nil, nil, false},
		{"none, cut", "plain <|tool text", true, "plain <|tool text", false, nil, nil, nil, false},
		{"one", "Let me look." + toolSectionBegin + call("functions.get_weather:0", ` {"city": "Paris"} `) + toolSectionEnd, false,
			"Let me look.", true, []string{"functions.get_weather:0"}, []string{"get_weather"}, []string{`{"city": "Paris"}`}, false},
		{"two, no prefix", toolSectionBegin + "\n" + call("a_b:0", "{}") + "\n" + call("functions.c-d:1", `{"x":1}`) + "\n" + toolSectionEnd + "after", false,
			"", true, []string{"a_b:0", "functions.c-d:1"}, []string{"a_b", "c-d"}, []string{"{}", `{"x":1}`}, false},
		{"stopped inside a call", "x" + toolSectionBegin + call("functions.f:0", "{}") + toolCallBegin + "functions.g:1" + toolArgsBegin + `{"y"`, false,
			"x", true, []string{"functions.f:0"}, []string{"f"}, []string{"{}"}, false},
		{"cut inside a call", "x" + toolSectionBegin + call("functions.f:0", "{}") + toolCallBegin + "functions.g:1" + toolArgsBegin + ` {"y": "a `, true,
			"x", true, []string{"functions.f:0", "functions.g:1"}, []string{"f", "g"}, []string{"{}", `{"y": "a `}, true},
		{"stopped, nothing complete", "x" + toolSectionBegin + toolCallBegin + "functions.g:1" + toolArgsBegin, false,
			"x" + toolSectionBegin + toolCallBegin + "functions.g:1" + toolArgsBegin, false, nil, nil, nil, false},
		{"cut as the arguments begin", "x" + toolSectionBegin + toolCallBegin + "functions.g:1" + toolArgsBegin, true,
			"x", true, []string{"functions.g:1"}, []string{"g"}, []string{""}, true},
		{"cut inside the end marker", "x" + toolSectionBegin + toolCallBegin + "functions.g:1" + toolArgsBegin + ` {"y"  : "a/m"   }` + toolCallEnd[:4], true,
			"x", true, []string{"functions.g:1"}, []string{"g"}, []string{`{"y"  : "a/m"   }`}, false},
		{"cut after whole arguments", "x" + toolSectionBegin + toolCallBegin + "functions.g:1" + toolArgsBegin + "{\"y\": [1]}\n\t", true,
			"x", true, []string{"functions.g:1"}, []string{"g"}, []string{`{"y": [1]}`}, false},
		{"cut in a string ending as the marker begins", "x" + toolSectionBegin + toolCallBegin + "functions.g:1" + toolArgsBegin + `{"y": "a ` + toolCallEnd[:3], true,
			"x", true, []string{"functions.g:1"}, []string{"g"}, []string{`{"y": "a ` + toolCallEnd[:3]}, true},
		{"cut in a number", "x" + toolSectionBegin + toolCallBegin + "functions.g:1" + toolArgsBegin + `{"y": 12`, true,
			"x", true, []string{"functions.g:1"}, []string{"g"}, []string{`{"y": 12`}, true},
		{"cut inside the id", "x" + toolSectionBegin + toolCallBegin + "functions.g", true, "x", true, nil, nil, nil, false},
		{"cut after the marker", "x" + toolSectionBegin, true, "x", true, nil, nil, nil, false},
		{"cut in the marker", "x" + toolSectionBegin[:9], true, "x", true, nil, nil, nil, false},
		{"cut in the marker, nothing before", toolSectionBegin[:2], true, "", true, nil, nil, nil, false},
		{"stopped in the marker", "x" + toolSectionBegin[:9], false, "x" + toolSectionBegin[:9], false, nil, nil, nil, false},
		{"cut after a lone <", "a <", true, "a <", false, nil, nil, nil, false},
		{"cut after a closed section", "x" + toolSectionBegin + toolCallBegin + "functions.g:1" + toolArgsBegin + "{" + toolSectionEnd + "more", true,
			"x", true, nil, nil, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			content, calls, ok := parseToolCalls(tc.text, tc.cut)
			assert.Equal(t, tc.content, content)
			assert.Equal(t, tc.ok, ok)
			require.Len(t, calls, len(tc.ids))
			for i, c := range calls {
				assert.Equal(t, tc.ids[i], c.ID)
				assert.Equal(t, "function", c.Type)
				assert.Equal(t, tc.names[i], c.Function.Name)
				assert.Equal(t, tc.args[i], c.Function.Arguments)
				assert.Equal(t, tc.cutLast && i == len(calls)-1, c.cut, "call %d's cut", i)
			}
		})
	}
}

// runAnswer feeds pieces of generated text (the last one finishing with
// finish) through a chat answer with tools, whole or streamed, and
// returns what the client reads.
func runAnswer(t *testing.T, s *Server, stream bool, finish k3.FinishReason, pieces ...string) []byte {
	t.Helper()
	return runJob(t, s, &job{chat: true, tools: true, stream: stream, prompts: [][]int32{{1, 2, 3}}, n: 1}, finish, pieces...)
}

func runJob(t *testing.T, s *Server, j *job, finish k3.FinishReason, pieces ...string) []byte {
	t.Helper()
	stream := j.stream
	id := "chatcmpl-test"
	if j.resp != nil {
		id = "resp_test"
	}
	a := &answer{j: j, s: s, id: id, choices: make([]choice, 1), cached: []int{-1}}
	events := make(chan event, len(pieces))
	for i, p := range pieces {
		tok := k3.Token{ID: int32(i + 5), Text: p}
		if i == len(pieces)-1 {
			tok.Finish = finish
			tok.Usage = &k3.Usage{PromptTokens: 3, GeneratedTokens: len(pieces)}
		}
		events <- event{tok: tok}
	}
	close(events)
	w := httptest.NewRecorder()
	switch {
	case j.resp != nil && stream:
		a.responseStream(context.Background(), w, events)
	case j.resp != nil:
		a.responseWhole(w, events)
	case stream:
		a.stream(context.Background(), w, events)
	default:
		a.whole(w, events)
	}
	require.Equal(t, 200, w.Code, w.Body.String())
	return w.Body.Bytes()
}

// TestToolCallAnswers: the calls in generated text come back as the
// message's tool_calls, whole and streamed (the marker split over pieces
// never shows in the content), with finish_reason tool_calls; text without
// a complete call stays content.
func TestToolCallAnswers(t *testing.T) {
	s, _, _ := newTestServer(t, Config{Name: "tiny"})
	pieces := []string{"Let me ", "check <|", "tool_calls_sec", "tion_begin|>", "<|tool_call_begin|>functions.get_weather:0",
		"<|tool_call_argument_begin|>", `{"city": `, `"Paris"}`, "<|tool_call_end|>", "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>", "<|tool_calls_section_end|>"}
	wantCalls := []any{
		map[string]any{"id": "functions.get_weather:0", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": `{"city": "Paris"}`}},
		map[string]any{"id": "functions.get_time:1", "type": "function", "function": map[string]any{"name": "get_time", "arguments": "{}"}},
	}

	var whole map[string]any
	require.NoError(t, json.Unmarshal(runAnswer(t, s, false, k3.FinishStop, pieces...), &whole))
	ch := whole["choices"].([]any)[0].(map[string]any)
	assert.Equal(t, "tool_calls", ch["finish_reason"])
	msg := ch["message"].(map[string]any)
	assert.Equal(t, "Let me check ", msg["content"])
	assert.Equal(t, wantCalls, msg["tool_calls"])

	events, done := sse(t, strings.NewReader(string(runAnswer(t, s, true, k3.FinishStop, pieces...))))
	require.True(t, done)
	var content strings.Builder
	var calls []any
	var finishes []any
	for _, ev := range events {
		c := ev["choices"].([]any)[0].(map[string]any)
		d := c["delta"].(map[string]any)
		if v, ok := d["content"].(string); ok {
			content.WriteString(v)
			assert.NotContains(t, v, "|", "a marker's start leaked into the content")
		}
		if v, ok := d["tool_calls"].([]any); ok {
			for k, x := range v {
				call := x.(map[string]any)
				assert.EqualValues(t, k, call["index"])
				delete(call, "index")
				calls = append(calls, call)
			}
		}
		if c["finish_reason"] != nil {
			finishes = append(finishes, c["finish_reason"])
		}
	}
	assert.Equal(t, "Let me check ", content.String())
	assert.Equal(t, wantCalls, calls)
	assert.Equal(t, []any{"tool_calls"}, finishes)

	// Cut short by max_tokens inside the only call: the call with the
	// arguments so far, length, and no markup in the content.
	cut := []string{"x <|tool_calls_section_begin|>", "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>", ` {"a": "b `}
	wantCut := []any{map[string]any{"id": "functions.f:0", "type": "function", "function": map[string]any{"name": "f", "arguments": `{"a": "b `}}}
	require.NoError(t, json.Unmarshal(runAnswer(t, s, false, k3.FinishLength, cut...), &whole))
	ch = whole["choices"].([]any)[0].(map[string]any)
	assert.Equal(t, "length", ch["finish_reason"])
	assert.Equal(t, "x ", ch["message"].(map[string]any)["content"])
	assert.Equal(t, wantCut, ch["message"].(map[string]any)["tool_calls"])
	events, _ = sse(t, strings.NewReader(string(runAnswer(t, s, true, k3.FinishLength, cut...))))
	content.Reset()
	calls, finishes = nil, nil
	for _, ev := range events {
		c := ev["choices"].([]any)[0].(map[string]any)
		d := c["delta"].(map[string]any)
		if v, ok := d["content"].(string); ok {
			content.WriteString(v)
		}
		if v, ok := d["tool_calls"].([]any); ok {
			for _, x := range v {
				delete(x.(map[string]any), "index")
				calls = append(calls, x)
			}
		}
		if c["finish_reason"] != nil {
			finishes = append(finishes, c["finish_reason"])
		}
	}
	assert.Equal(t, "x ", content.String())
	assert.Equal(t, wantCut, calls)
	assert.Equal(t, []any{"length"}, finishes)

	// Cut before a call's arguments begin, or inside the section's first
	// marker: no call, and the section's markup dropped from the content.
	for _, cutEarly := range [][]string{
		{"x <|tool_calls_section_begin|>", "<|tool_call_begin|>functions.f"},
		{"x <|tool_", "calls_sec"},
	} {
		require.NoError(t, json.Unmarshal(runAnswer(t, s, false, k3.FinishLength, cutEarly...), &whole))
		ch = whole["choices"].([]any)[0].(map[string]any)
		assert.Equal(t, "length", ch["finish_reason"])
		assert.Equal(t, "x ", ch["message"].(map[string]any)["content"], "%q", cutEarly)
		assert.NotContains(t, ch["message"].(map[string]any), "tool_calls")
		events, _ = sse(t, strings.NewReader(string(runAnswer(t, s, true, k3.FinishLength, cutEarly...))))
		content.Reset()
		for _, ev := range events {
			d := ev["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
			if v, ok := d["content"].(string); ok {
				content.WriteString(v)
			}
			assert.NotContains(t, d, "tool_calls")
		}
		assert.Equal(t, "x ", content.String(), "%q streamed", cutEarly)
	}

	// The same text ended by a stop token is all content: the model
	// stopped without a call.
	require.NoError(t, json.Unmarshal(runAnswer(t, s, false, k3.FinishStop, cut...), &whole))
	ch = whole["choices"].([]any)[0].(map[string]any)
	assert.Equal(t, "stop", ch["finish_reason"])
	assert.Equal(t, strings.Join(cut, ""), ch["message"].(map[string]any)["content"])
	assert.NotContains(t, ch["message"].(map[string]any), "tool_calls")

	// A marker's start that never completes is content, at the end.
	events, _ = sse(t, strings.NewReader(string(runAnswer(t, s, true, k3.FinishStop, "a <|tool_calls", "_sec"))))
	content.Reset()
	for _, ev := range events {
		c := ev["choices"].([]any)[0].(map[string]any)
		if v, ok := c["delta"].(map[string]any)["content"].(string); ok {
			content.WriteString(v)
		}
		if f := c["finish_reason"]; f != nil {
			assert.Equal(t, "stop", f)
		}
	}
	assert.Equal(t, "a <|tool_calls_sec", content.String())
}

// TestToolsRequest: a chat request with tools runs the prompt with the
// tools declared; the tiny model writes Go, not calls, so the answer is
// the same text as that prompt run directly.
func TestToolsRequest(t *testing.T) {
	_, hs, m := newTestServer(t, Config{Name: "tiny"})
	msgs := []map[string]any{{"role": "user", "content": "func main() {"}}
	for _, choice := range []any{nil, "auto", "none"} {
		body := map[string]any{"messages": msgs, "tools": []any{weatherTool}, "max_tokens": 16, "temperature": 0}
		if choice != nil {
			body["tool_choice"] = choice
		}
		code, out := post(t, hs.URL+"/v1/chat/completions", body)
		require.Equal(t, 200, code, "%v", out)
		decl, _, err := toolDeclaration(mustJSON(t, []any{weatherTool}))
		require.NoError(t, err)
		prompt := m.Encode(m.ChatPrompt([]k3.Message{{Role: "tool_declare", Content: decl}, {Role: "user", Content: "func main() {"}}))
		want, _ := direct(t, m, prompt, k3.WithMaxTokens(16), k3.WithTemperature(0))
		ch := out["choices"].([]any)[0].(map[string]any)
		assert.Equal(t, want, ch["message"].(map[string]any)["content"], "tool_choice %v", choice)
		assert.NotEqual(t, "tool_calls", ch["finish_reason"])
		assert.EqualValues(t, len(prompt), out["usage"].(map[string]any)["prompt_tokens"])
	}
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func FuzzParseToolCalls(f *testing.F) {
	f.Add("a"+toolSectionBegin+toolCallBegin+"functions.f:0"+toolArgsBegin+"{}"+toolCallEnd+toolSectionEnd, false)
	f.Add("<|tool_calls_sec", true)
	f.Add("x"+toolSectionBegin+toolCallBegin+"functions.f:0"+toolArgsBegin+`{"a": `, true)
	f.Fuzz(func(t *testing.T, text string, cut bool) {
		content, calls, ok := parseToolCalls(text, cut)
		if !ok && (content != text || calls != nil) {
			t.Fatalf("no calls, but content %q of %q", content, text)
		}
		if ok && !strings.HasPrefix(text, content) {
			t.Fatalf("content %q is not the start of %q", content, text)
		}
		// The stream releases the same content, whatever the pieces.
		var ts toolStream
		var got strings.Builder
		for i := 0; i < len(text); i += 3 {
			got.WriteString(ts.next(text[i:min(i+3, len(text))]))
		}
		rest, scalls := ts.end(cut)
		got.WriteString(rest)
		if got.String() != content || len(scalls) != len(calls) {
			t.Fatalf("streamed %q and %d calls, whole %q and %d", got.String(), len(scalls), content, len(calls))
		}
	})
}

// TestJSONMode: response_format json_object answers what the same
// generation held to JSON gives directly: a JSON object, or its prefix
// when max_tokens cut it.
func TestJSONMode(t *testing.T) {
	_, hs, m := newTestServer(t, Config{Name: "tiny"})
	msgs := []map[string]any{{"role": "user", "content": "func main() {"}}
	code, out := post(t, hs.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 100, "temperature": 0,
		"response_format": map[string]any{"type": "json_object"}})
	require.Equal(t, 200, code, "%v", out)
	prompt := m.Encode(m.ChatPrompt([]k3.Message{{Role: "user", Content: "func main() {"}}))
	want, toks := direct(t, m, prompt, k3.WithMaxTokens(100), k3.WithTemperature(0), k3.WithJSONObject())
	ch := out["choices"].([]any)[0].(map[string]any)
	assert.Equal(t, want, ch["message"].(map[string]any)["content"])
	if toks[len(toks)-1].Finish == k3.FinishStop {
		assert.True(t, json.Valid([]byte(want)), "%q", want)
	}
	assert.True(t, strings.HasPrefix(strings.TrimSpace(want), "{"), "%q", want)
}

// TestJSONSchemaFormat: response_format json_schema answers what the
// same generation held to the schema gives directly; an answer that
// stopped is a value of the schema (read back by Go types with unknown
// fields refused). Completions take it too.
func TestJSONSchemaFormat(t *testing.T) {
	_, hs, m := newTestServer(t, Config{Name: "tiny"})
	schema := map[string]any{"type": "object", "additionalProperties": false, "required": []string{"city", "days"},
		"properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 12}, "days": map[string]any{"type": "integer"},
			"unit": map[string]any{"enum": []string{"C", "F"}}}}
	compiled, err := k3.CompileJSONSchema(mustJSON(t, schema))
	require.NoError(t, err)
	msgs := []map[string]any{{"role": "user", "content": "func main() {"}}
	prompt := m.Encode(m.ChatPrompt([]k3.Message{{Role: "user", Content: "func main() {"}}))
	format := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "forecast", "strict": true, "schema": schema}}
	stopped := 0
	for seed := range uint64(4) {
		code, out := post(t, hs.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 120, "temperature": 1, "seed": seed,
			"response_format": format})
		require.Equal(t, 200, code, "%v", out)
		want, toks := direct(t, m, prompt, k3.WithMaxTokens(120), k3.WithTemperature(1), k3.WithSeed(seed), k3.WithJSONSchema(compiled))
		ch := out["choices"].([]any)[0].(map[string]any)
		assert.Equal(t, want, ch["message"].(map[string]any)["content"])
		if toks[len(toks)-1].Finish != k3.FinishStop {
			continue
		}
		stopped++
		assert.Equal(t, "stop", ch["finish_reason"])
		d := json.NewDecoder(strings.NewReader(want))
		d.DisallowUnknownFields()
		var v struct {
			City *string
			Days *int64
			Unit *string
		}
		require.NoError(t, d.Decode(&v), "%q", want)
		require.NotNil(t, v.City, want)
		require.NotNil(t, v.Days, want)
		assert.LessOrEqual(t, len([]rune(*v.City)), 12, want)
		if v.Unit != nil {
			assert.Contains(t, []string{"C", "F"}, *v.Unit, want)
		}
	}
	assert.Positive(t, stopped, "no answer finished its value")
	code, out := post(t, hs.URL+"/v1/completions", map[string]any{"prompt": "x", "max_tokens": 30, "temperature": 0,
		"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"schema": map[string]any{"enum": []any{"yes", "no"}}}}})
	require.Equal(t, 200, code, "%v", out)
	assert.Contains(t, []string{`"yes"`, `"no"`}, strings.TrimSpace(out["choices"].([]any)[0].(map[string]any)["text"].(string)))
}

// TestForcedArguments: a forced call's arguments are held to its
// function's parameters: the answer is that of the same generation run
// with WithToolArguments, and a strict function whose schema k3 cannot
// hold is refused.
func TestForcedArguments(t *testing.T) {
	_, hs, m := newTestServer(t, Config{Name: "tiny"})
	tool, schema, msgs, prompt := strictWeather(t, m)
	whole := 0
	for seed := range uint64(4) {
		code, out := post(t, hs.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "tools": []any{tool}, "tool_choice": "required",
			"max_tokens": 200, "temperature": 1, "seed": seed})
		require.Equal(t, 200, code, "%v", out)
		want, toks := direct(t, m, prompt, k3.WithMaxTokens(200), k3.WithTemperature(1), k3.WithSeed(seed),
			k3.WithToolCalls([]string{"get_weather"}, true), k3.WithToolArguments(map[string]*k3.JSONSchema{"get_weather": schema}))
		ch := out["choices"].([]any)[0].(map[string]any)
		_, calls, ok := parseToolCalls(want, toks[len(toks)-1].Finish == k3.FinishLength)
		if !ok {
			assert.Equal(t, want, ch["message"].(map[string]any)["content"])
			continue
		}
		if toks[len(toks)-1].Finish == k3.FinishStop {
			assert.Equal(t, "tool_calls", ch["finish_reason"])
		}
		require.Len(t, ch["message"].(map[string]any)["tool_calls"], len(calls))
		for k, c := range calls {
			assert.Equal(t, c.Function.Arguments, ch["message"].(map[string]any)["tool_calls"].([]any)[k].(map[string]any)["function"].(map[string]any)["arguments"])
			whole++
			d := json.NewDecoder(strings.NewReader(c.Function.Arguments))
			d.DisallowUnknownFields()
			var v struct {
				City *string
				Days *int64
			}
			require.NoError(t, d.Decode(&v), c.Function.Arguments)
			require.NotNil(t, v.City, c.Function.Arguments)
			assert.LessOrEqual(t, len([]rune(*v.City)), 10, c.Function.Arguments)
		}
	}
	assert.Positive(t, whole, "no whole call")
	bad := map[string]any{"type": "function", "function": map[string]any{"name": "f", "strict": true,
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"n": map[string]any{"type": "string", "format": "uri"}}}}}
	code, out := post(t, hs.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "tools": []any{bad}, "tool_choice": "required"})
	require.Equal(t, 400, code, "%v", out)
	assert.Equal(t, "tools[0].function.parameters", out["error"].(map[string]any)["param"])
	assert.Contains(t, out["error"].(map[string]any)["message"], `format "uri"`)
	delete(bad["function"].(map[string]any), "strict") // without strict, held to a JSON object only
	code, out = post(t, hs.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "tools": []any{bad}, "tool_choice": "required", "max_tokens": 4})
	require.Equal(t, 200, code, "%v", out)
}

// strictWeather is a strict get_weather tool (a city of at most 10
// characters, an optional integer of days), its compiled parameters, a
// user message and the prompt the server renders for them.
func strictWeather(t *testing.T, m *k3.Model) (tool map[string]any, schema *k3.JSONSchema, msgs []map[string]any, prompt []int32) {
	t.Helper()
	params := `{"type":"object","properties":{"city":{"type":"string","maxLength":10},"days":{"type":"integer"}},"required":["city"],"additionalProperties":false}`
	tool = map[string]any{"type": "function", "function": map[string]any{"name": "get_weather", "strict": true, "parameters": json.RawMessage(params)}}
	schema, err := k3.CompileJSONSchema([]byte(params))
	require.NoError(t, err)
	msgs = []map[string]any{{"role": "user", "content": "func main() {"}}
	decl, _, err := toolDeclaration(mustJSON(t, []any{tool}))
	require.NoError(t, err)
	return tool, schema, msgs, m.Encode(m.ChatPrompt([]k3.Message{{Role: "tool_declare", Content: decl}, {Role: "user", Content: "func main() {"}}))
}

// TestAutoStrictArguments: with tool_choice auto and a strict function
// the answer is that of the same generation run with
// WithOptionalToolCalls and WithToolArguments, and a strict function
// whose schema k3 cannot hold is refused under auto too. (The tiny model
// does not write the section's marker unasked, so its answers are text;
// k3's TestOptionalToolCalls holds the section once it begins.)
func TestAutoStrictArguments(t *testing.T) {
	_, hs, m := newTestServer(t, Config{Name: "tiny"})
	tool, schema, msgs, prompt := strictWeather(t, m)
	for seed := range uint64(3) {
		code, out := post(t, hs.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "tools": []any{tool}, "max_tokens": 40, "temperature": 1, "seed": seed})
		require.Equal(t, 200, code, "%v", out)
		want, toks := direct(t, m, prompt, k3.WithMaxTokens(40), k3.WithTemperature(1), k3.WithSeed(seed),
			k3.WithOptionalToolCalls([]string{"get_weather"}, true), k3.WithToolArguments(map[string]*k3.JSONSchema{"get_weather": schema}))
		content, calls, ok := parseToolCalls(want, toks[len(toks)-1].Finish == k3.FinishLength)
		msg := out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
		got, _ := msg["tool_calls"].([]any)
		require.Len(t, got, len(calls), "%q", want)
		if !ok {
			assert.Equal(t, want, msg["content"])
		} else {
			assert.Equal(t, nullIfEmpty(content), msg["content"])
		}
	}
	bad := map[string]any{"type": "function", "function": map[string]any{"name": "f", "strict": true,
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"n": map[string]any{"type": "string", "format": "uri"}}}}}
	code, out := post(t, hs.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "tools": []any{bad}})
	require.Equal(t, 400, code, "%v", out)
	assert.Equal(t, "tools[0].function.parameters", out["error"].(map[string]any)["param"])
	delete(bad["function"].(map[string]any), "strict") // not strict: not held, not refused
	code, out = post(t, hs.URL+"/v1/chat/completions", map[string]any{"messages": msgs, "tools": []any{bad}, "max_tokens": 4})
	require.Equal(t, 200, code, "%v", out)
}

// TestForcedToolCalls: tool_choice required (or naming a function) holds
// the answer to tool calls, which come back parsed: those of the same
// generation run directly.
func TestForcedToolCalls(t *testing.T) {
	_, hs, m := newTestServer(t, Config{Name: "tiny"})
	timeTool := map[string]any{"type": "function", "function": map[string]any{"name": "get_time"}}
	msgs := []map[string]any{{"role": "user", "content": "func main() {"}}
	decl, _, err := toolDeclaration(mustJSON(t, []any{weatherTool, timeTool}))
	require.NoError(t, err)
	prompt := m.Encode(m.ChatPrompt([]k3.Message{{Role: "tool_declare", Content: decl}, {Role: "user", Content: "func main() {"}}))
	closed := 0
	for i, tc := range []struct {
		choice   any
		names    []string
		parallel bool
		seed     uint64
	}{
		{"required", []string{"get_weather", "get_time"}, true, 2},
		{"required", []string{"get_weather", "get_time"}, false, 4},
		{map[string]any{"type": "function", "function": map[string]any{"name": "get_time"}}, []string{"get_time"}, true, 3},
	} {
		body := map[string]any{"messages": msgs, "tools": []any{weatherTool, timeTool}, "tool_choice": tc.choice,
			"max_tokens": 300, "temperature": 1, "seed": tc.seed}
		if !tc.parallel {
			body["parallel_tool_calls"] = false
		}
		code, out := post(t, hs.URL+"/v1/chat/completions", body)
		require.Equal(t, 200, code, "%v", out)
		want, toks := direct(t, m, prompt, k3.WithMaxTokens(300), k3.WithTemperature(1), k3.WithSeed(tc.seed), k3.WithToolCalls(tc.names, tc.parallel))
		ch := out["choices"].([]any)[0].(map[string]any)
		msg := ch["message"].(map[string]any)
		content, calls, ok := parseToolCalls(want, toks[len(toks)-1].Finish == k3.FinishLength)
		if !ok {
			assert.Equal(t, "length", ch["finish_reason"], "case %d", i)
			assert.Equal(t, want, msg["content"], "case %d", i)
			continue
		}
		assert.Empty(t, content)
		require.Len(t, msg["tool_calls"], len(calls), "case %d", i)
		for k, c := range msg["tool_calls"].([]any) {
			f := c.(map[string]any)["function"].(map[string]any)
			assert.Contains(t, tc.names, f["name"], "case %d", i)
			assert.Equal(t, calls[k].Function.Arguments, f["arguments"])
			if toks[len(toks)-1].Finish == k3.FinishStop {
				assert.True(t, json.Valid([]byte(f["arguments"].(string))), "case %d: %v", i, f["arguments"])
			}
		}
		if toks[len(toks)-1].Finish == k3.FinishStop {
			closed++
			assert.Equal(t, "tool_calls", ch["finish_reason"], "case %d", i)
			if !tc.parallel {
				assert.Len(t, calls, 1)
			}
		}
	}
	t.Logf("%d of 3 closed their section", closed)
}
