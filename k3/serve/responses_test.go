package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/k3"
)

// respEvents reads a Responses stream: each event's `event:` line must
// name its data's type, and the sequence numbers count from 0.
func respEvents(t *testing.T, r io.Reader) []map[string]any {
	t.Helper()
	var events []map[string]any
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, "event: "):
			require.Empty(t, name, "two event lines")
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var ev map[string]any
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev), line)
			require.Equal(t, name, ev["type"], "the event line names the data's type")
			require.EqualValues(t, len(events), ev["sequence_number"])
			events = append(events, ev)
			name = ""
		default:
			t.Fatalf("line %q", line)
		}
	}
	require.NoError(t, sc.Err())
	return events
}

// accumulate builds the response from a stream's events the way the
// API defines them (the snapshot of response.created, items and parts
// added, deltas appended) and returns it with the final response the
// last event carries.
func accumulate(t *testing.T, events []map[string]any) (built, final map[string]any) {
	t.Helper()
	require.NotEmpty(t, events)
	require.Equal(t, "response.created", events[0]["type"])
	built = events[0]["response"].(map[string]any)
	output := func(ev map[string]any) map[string]any {
		i := int(ev["output_index"].(float64))
		require.Less(t, i, len(built["output"].([]any)), "%v", ev)
		return built["output"].([]any)[i].(map[string]any)
	}
	for _, ev := range events[1:] {
		switch ev["type"] {
		case "response.output_item.added":
			built["output"] = append(built["output"].([]any), ev["item"])
		case "response.content_part.added":
			it := output(ev)
			it["content"] = append(it["content"].([]any), ev["part"])
		case "response.output_text.delta", "response.reasoning_text.delta":
			it := output(ev)
			part := it["content"].([]any)[int(ev["content_index"].(float64))].(map[string]any)
			part["text"] = part["text"].(string) + ev["delta"].(string)
		case "response.function_call_arguments.delta":
			it := output(ev)
			it["arguments"] = it["arguments"].(string) + ev["delta"].(string)
		case "response.completed", "response.incomplete":
			final = ev["response"].(map[string]any)
		}
	}
	require.NotNil(t, final, "no response.completed or response.incomplete")
	require.Contains(t, []any{"response.completed", "response.incomplete"}, events[len(events)-1]["type"], "the final event is last")
	return built, final
}

// texts lists the output items' types with their texts (a call's name
// and arguments), the part of an output both ways of building it share.
func texts(output []any) []string {
	var out []string
	for _, x := range output {
		it := x.(map[string]any)
		switch it["type"] {
		case "function_call":
			out = append(out, "call "+it["call_id"].(string)+" "+it["name"].(string)+" "+it["arguments"].(string))
		default:
			var b strings.Builder
			for _, p := range it["content"].([]any) {
				b.WriteString(p.(map[string]any)["text"].(string))
			}
			out = append(out, it["type"].(string)+" "+b.String())
		}
	}
	return out
}

// TestResponsesAnswers: generated text comes back as the Responses API's
// output items (reasoning, message, function calls), whole and streamed;
// the stream's deltas build the final response's output; an answer cut by
// max_output_tokens is incomplete.
func TestResponsesAnswers(t *testing.T) {
	s, _, _ := newTestServer(t, Config{Name: "tiny"})
	calls := []string{"<|tool_call_begin|>functions.get_weather:0", "<|tool_call_argument_begin|>", `{"city": `, `"Paris"}`, "<|tool_call_end|>",
		"<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>", "<|tool_calls_section_end|>"}
	for _, tc := range []struct {
		name      string
		reasoning bool
		finish    k3.FinishReason
		pieces    []string
		want      []string
		status    string
		events    []string // the stream's event types, when checked
	}{
		{"reasoning, text and calls", true, k3.FinishStop,
			append([]string{"<think>", "plan ", "it</th", "ink>", "Let me ", "check <|", "tool_calls_sec", "tion_begin|>"}, calls...),
			[]string{"reasoning plan it", "message Let me check ", `call functions.get_weather:0 get_weather {"city": "Paris"}`, "call functions.get_time:1 get_time {}"},
			"completed", []string{"response.created", "response.in_progress",
				"response.output_item.added", "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
				"response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
				"response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
				"response.output_text.done", "response.content_part.done", "response.output_item.done",
				"response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
				"response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
				"response.completed"}},
		{"calls alone", false, k3.FinishStop, append([]string{"<|tool_calls_section_begin|>"}, calls...),
			[]string{`call functions.get_weather:0 get_weather {"city": "Paris"}`, "call functions.get_time:1 get_time {}"}, "completed", nil},
		{"cut by the limit", false, k3.FinishLength, []string{"func ", "main"}, []string{"message func main"}, "incomplete",
			[]string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
				"response.output_text.delta", "response.output_text.delta", "response.output_text.done", "response.content_part.done",
				"response.output_item.done", "response.incomplete"}},
		{"nothing", false, k3.FinishStop, []string{""}, []string{"message "}, "completed", nil},
		{"a call cut by the limit", false, k3.FinishLength, []string{"Let me ", "<|tool_calls_section_begin|>", "<|tool_call_begin|>functions.get_weather:0",
			"<|tool_call_argument_begin|>", `{"city": `}, []string{"message Let me ", `call functions.get_weather:0 get_weather {"city": `}, "incomplete", nil},
	} {
		j := func(stream bool) *job {
			return &job{chat: true, tools: true, reasoning: tc.reasoning, stream: stream, prompts: [][]int32{{1, 2, 3}}, n: 1,
				resp: &responseEcho{toolChoice: "auto", tools: []any{}, format: map[string]any{"type": "text"}, temperature: 1, topP: 1}}
		}
		var whole map[string]any
		require.NoError(t, json.Unmarshal(runJob(t, s, j(false), tc.finish, tc.pieces...), &whole), tc.name)
		assert.Equal(t, "response", whole["object"], tc.name)
		assert.Equal(t, tc.status, whole["status"], tc.name)
		assert.Equal(t, tc.want, texts(whole["output"].([]any)), tc.name)
		callStatus := "completed"
		if tc.name == "a call cut by the limit" {
			callStatus = "incomplete"
		}
		for _, it := range whole["output"].([]any) {
			if it := it.(map[string]any); it["type"] == "function_call" {
				assert.Equal(t, callStatus, it["status"], tc.name)
			}
		}
		if tc.status == "incomplete" {
			assert.Equal(t, map[string]any{"reason": "max_output_tokens"}, whole["incomplete_details"], tc.name)
		} else {
			assert.Nil(t, whole["incomplete_details"], tc.name)
		}
		u := whole["usage"].(map[string]any)
		reasoned := 0
		if tc.reasoning {
			reasoned = 4 // "<think>", "plan ", "it</th", "ink>"
		}
		assert.EqualValues(t, reasoned, u["output_tokens_details"].(map[string]any)["reasoning_tokens"], tc.name)
		assert.EqualValues(t, 3, u["input_tokens"], tc.name)
		assert.EqualValues(t, len(tc.pieces), u["output_tokens"], tc.name)
		assert.EqualValues(t, 3+len(tc.pieces), u["total_tokens"], tc.name)

		events := respEvents(t, strings.NewReader(string(runJob(t, s, j(true), tc.finish, tc.pieces...))))
		if tc.events != nil {
			var types []string
			for _, ev := range events {
				types = append(types, ev["type"].(string))
			}
			assert.Equal(t, tc.events, types, tc.name)
		}
		built, final := accumulate(t, events)
		assert.Equal(t, tc.want, texts(built["output"].([]any)), "%s: the deltas", tc.name)
		assert.Equal(t, whole["output"], final["output"], "%s: the streamed response's output is the whole one's", tc.name)
		assert.Equal(t, whole["usage"], final["usage"], tc.name)
		assert.Equal(t, tc.status, final["status"], tc.name)
	}
}

// TestResponsesRequest: a Responses request runs the chat it amounts to:
// the answer (greedy) and usage equal the chat completion's, whole and
// streamed; function_call and function_call_output items render as the
// chat's tool_calls and tool messages do.
func TestResponsesRequest(t *testing.T) {
	s, hs, _ := newTestServer(t, Config{Name: "tiny"})
	code, chat := post(t, hs.URL+"/v1/chat/completions", map[string]any{"model": "tiny", "max_tokens": 20, "temperature": 0,
		"messages": []any{map[string]any{"role": "system", "content": "You write Go."}, map[string]any{"role": "user", "content": "func main() {"}}})
	require.Equal(t, 200, code, "%v", chat)
	want := chat["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
	body := map[string]any{"model": "tiny", "max_output_tokens": 20, "temperature": 0, "instructions": "You write Go.",
		"input": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": "func "}, map[string]any{"type": "input_text", "text": "main() {"}}}}}
	code, resp := post(t, hs.URL+"/v1/responses", body)
	require.Equal(t, 200, code, "%v", resp)
	assert.Equal(t, []string{"message " + want}, texts(resp["output"].([]any)))
	cu, ru := chat["usage"].(map[string]any), resp["usage"].(map[string]any)
	assert.Equal(t, cu["prompt_tokens"], ru["input_tokens"])
	assert.Equal(t, cu["completion_tokens"], ru["output_tokens"])
	assert.Equal(t, "You write Go.", resp["instructions"])
	assert.EqualValues(t, 20, resp["max_output_tokens"])
	assert.True(t, strings.HasPrefix(resp["id"].(string), "resp_"), resp["id"])

	body["stream"] = true
	r := postStream(t, context.Background(), hs.URL+"/v1/responses", body)
	defer r.Body.Close()
	require.Equal(t, "text/event-stream", r.Header.Get("Content-Type"))
	built, final := accumulate(t, respEvents(t, r.Body))
	assert.Equal(t, []string{"message " + want}, texts(built["output"].([]any)))
	assert.Equal(t, resp["output"].([]any)[0].(map[string]any)["content"], final["output"].([]any)[0].(map[string]any)["content"])

	// Log-probabilities: the chat's, whole and streamed.
	code, chatLP := post(t, hs.URL+"/v1/chat/completions", map[string]any{"model": "tiny", "max_tokens": 8, "temperature": 0, "logprobs": true, "top_logprobs": 2,
		"messages": []any{map[string]any{"role": "user", "content": "func main() {"}}})
	require.Equal(t, 200, code, "%v", chatLP)
	wantLP := chatLP["choices"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)["content"]
	lpBody := map[string]any{"model": "tiny", "max_output_tokens": 8, "temperature": 0, "top_logprobs": 2,
		"include": []string{"message.output_text.logprobs"}, "input": "func main() {"}
	code, resp = post(t, hs.URL+"/v1/responses", lpBody)
	require.Equal(t, 200, code, "%v", resp)
	assert.EqualValues(t, 2, resp["top_logprobs"])
	part := resp["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)
	assert.Equal(t, wantLP, part["logprobs"])
	lpBody["stream"] = true
	r2 := postStream(t, context.Background(), hs.URL+"/v1/responses", lpBody)
	defer r2.Body.Close()
	var streamed []any
	for _, ev := range respEvents(t, r2.Body) {
		if ev["type"] == "response.output_text.delta" {
			streamed = append(streamed, ev["logprobs"].([]any)...)
		}
	}
	assert.Equal(t, wantLP, streamed)

	// A tool round trip in the Responses shapes is the chat's prompt.
	tools := `[{"type":"function","name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]`
	var rreq responsesRequest
	require.NoError(t, json.Unmarshal([]byte(`{"instructions":"Be brief.","tools":`+tools+`,"input":[
		{"role":"user","content":"weather?"},
		{"type":"reasoning","summary":[]},
		{"type":"function_call","call_id":"functions.get_weather:0","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
		{"type":"function_call","call_id":"functions.get_weather:1","name":"get_weather","arguments":"{\"city\":\"Rome\"}"},
		{"type":"function_call_output","call_id":"functions.get_weather:0","output":"18 C"},
		{"type":"function_call_output","call_id":"functions.get_weather:1","output":[{"type":"input_text","text":"21 C"}]}]}`), &rreq))
	rj, err := s.responsesJob(&rreq)
	require.NoError(t, err)
	chatPrompt := chatPrompts(t, s, `{"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"messages":[
		{"role":"system","content":"Be brief."},
		{"role":"user","content":"weather?"},
		{"role":"assistant","content":"","tool_calls":[
			{"id":"functions.get_weather:0","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
			{"id":"functions.get_weather:1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},
		{"role":"tool","tool_call_id":"functions.get_weather:0","name":"get_weather","content":"18 C"},
		{"role":"tool","tool_call_id":"functions.get_weather:1","name":"get_weather","content":"21 C"}]}`)
	assert.Equal(t, chatPrompt, rj.prompts)
	assert.True(t, rj.tools)
}

// TestResponsesErrors: what k3 cannot answer is refused by name, in the
// Responses request's own field names.
func TestResponsesErrors(t *testing.T) {
	_, hs, _ := newTestServer(t, Config{Name: "tiny"})
	for _, method := range []string{"GET", "DELETE"} {
		req, err := http.NewRequest(method, hs.URL+"/v1/responses/resp_1", nil)
		require.NoError(t, err)
		resp, err := hs.Client().Do(req)
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		resp.Body.Close()
		assert.Equal(t, 404, resp.StatusCode, method)
		assert.Contains(t, out["error"].(map[string]any)["message"], `no response "resp_1" is kept`, method)
	}
	for _, tc := range []struct{ body, param string }{
		{`{"input":"x","previous_response_id":"resp_1"}`, "previous_response_id"},
		{`{"input":"x","background":true}`, "background"},
		{`{"input":"x","conversation":"conv_1"}`, "conversation"},
		{`{"input":"x","prompt":{"id":"pmpt_1"}}`, "prompt"},
		{`{"input":"x","truncation":"auto"}`, "truncation"},
		{`{"input":"x","top_logprobs":2,"tools":[{"type":"function","name":"f"}]}`, "include"},
		{`{"input":"x","top_logprobs":21}`, "top_logprobs"},
		{`{}`, "input"},
		{`{"input":[]}`, "input"},
		{`{"input":[3]}`, "input[0]"},
		{`{"input":[{"role":"bot","content":"x"}]}`, "input[0].role"},
		{`{"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, "input[0].content[0].type"},
		{`{"input":[{"type":"file_search_call"}]}`, "input[0].type"},
		{`{"input":[{"type":"function_call","name":"f"}]}`, "input[0]"},
		{`{"input":[{"type":"function_call_output","output":"x"}]}`, "input[0].call_id"},
		{`{"input":"x","tools":[{}]}`, "tools[0].type"},
		{`{"input":"x","tools":[{"type":"web_search"}],"tool_choice":"required"}`, "tool_choice"},
		{`{"input":"x","tools":[{"type":"namespace","name":"ns","tools":[{"type":"function","name":"a b"}]}]}`, "tools[0].tools[0].name"},
		{`{"input":"x","tools":[{"type":"function","name":"ns__f"},{"type":"namespace","name":"ns","tools":[{"type":"function","name":"f"}]}]}`, "tools[1].tools[0].name"},
		{`{"input":"x","tools":[{"type":"web_search"},{"type":"namespace","name":"ns","tools":[{"type":"function","name":"f"},{"type":"function","name":"g","strict":true,"parameters":{"type":"object","not":{}}}]}]}`, "tools[1].tools[1].parameters"},
		{`{"input":"x","tools":[{"type":"function","name":"a b"}]}`, "tools[0].name"},
		{`{"input":"x","tool_choice":{"type":"file_search"}}`, "tool_choice"},
		{`{"input":"x","text":{"format":{"type":"yaml"}}}`, "text.format.type"},
		{`{"input":"x","text":{"format":{"type":"json_schema","name":"a","schema":{"not":{}}}}}`, "text.format.schema"},
		{`{"input":"x","max_output_tokens":0}`, "max_output_tokens"},
		{`{"input":"x","temperature":9}`, "temperature"},
		{`{"instructions":"x","input":[{"role":"user","content":"x"},{"role":"user"}]}`, "input[1].content"},
	} {
		resp, err := hs.Client().Post(hs.URL+"/v1/responses", "application/json", strings.NewReader(tc.body))
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		resp.Body.Close()
		require.Equal(t, 400, resp.StatusCode, "%s: %v", tc.body, out)
		e := out["error"].(map[string]any)
		assert.Equal(t, tc.param, e["param"], "%s: %v", tc.body, e["message"])
		assert.NotContains(t, e["message"], "messages[", tc.body)
		assert.NotContains(t, e["message"], "response_format", tc.body)
	}
}

// TestResponsesReasoningEffort: on a thinking model's server,
// reasoning.effort "none" turns the reasoning off as
// chat_template_kwargs {"thinking": false} does; other efforts leave it.
func TestResponsesReasoningEffort(t *testing.T) {
	s, _, _ := newTestServer(t, Config{Name: "tiny", Reasoning: true})
	job := func(body string) *job {
		var req responsesRequest
		require.NoError(t, json.Unmarshal([]byte(body), &req))
		j, err := s.responsesJob(&req)
		require.NoError(t, err)
		return j
	}
	var off chatRequest
	require.NoError(t, json.Unmarshal([]byte(`{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"thinking":false}}`), &off))
	want, err := s.chatJob(&off)
	require.NoError(t, err)
	none := job(`{"input":"x","reasoning":{"effort":"none"}}`)
	assert.False(t, none.reasoning)
	assert.Equal(t, want.prompts, none.prompts)
	high := job(`{"input":"x","reasoning":{"effort":"high"}}`)
	assert.True(t, high.reasoning)
	assert.NotEqual(t, want.prompts, high.prompts)
}

// respond sends a Responses request and returns the status and body.
func respond(t *testing.T, method, url string, body any) (int, map[string]any) {
	t.Helper()
	if method == "POST" {
		return post(t, url, body)
	}
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// TestResponsesStore: a finished response is kept unless store is false:
// GET answers it as it was answered (whole or streamed), DELETE drops
// it, and previous_response_id continues its conversation: the prompt
// is the chat of the stored turns (instructions not carried over), its
// answer and the new input.
func TestResponsesStore(t *testing.T) {
	s, hs, _ := newTestServer(t, Config{Name: "tiny"})
	first := map[string]any{"model": "tiny", "max_output_tokens": 12, "temperature": 0, "instructions": "You write Go.", "input": "func main() {"}
	code, r1 := post(t, hs.URL+"/v1/responses", first)
	require.Equal(t, 200, code, "%v", r1)
	assert.Equal(t, true, r1["store"])
	assert.Nil(t, r1["previous_response_id"])
	id := r1["id"].(string)
	code, got := respond(t, "GET", hs.URL+"/v1/responses/"+id, nil)
	require.Equal(t, 200, code, "%v", got)
	assert.Equal(t, r1, got)
	answer := r1["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"].(string)

	// The next turn's prompt is the chat of both turns.
	var next responsesRequest
	require.NoError(t, json.Unmarshal([]byte(`{"previous_response_id":"`+id+`","instructions":"Be brief.","input":"again"}`), &next))
	nj, err := s.responsesJob(&next)
	require.NoError(t, err)
	msgs := mustJSON(t, []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": "func main() {"},
		{"role": "assistant", "content": answer}, {"role": "user", "content": "again"}})
	assert.Equal(t, chatPrompts(t, s, `{"messages":`+string(msgs)+`}`), nj.prompts)

	// Streamed: GET answers the final response the stream ended with.
	body := map[string]any{"model": "tiny", "max_output_tokens": 6, "temperature": 0, "previous_response_id": id, "input": "more", "stream": true}
	r := postStream(t, context.Background(), hs.URL+"/v1/responses", body)
	_, final := accumulate(t, respEvents(t, r.Body))
	r.Body.Close()
	assert.Equal(t, id, final["previous_response_id"])
	assert.Equal(t, "incomplete", final["status"], "cut by max_output_tokens, and kept")
	code, got = respond(t, "GET", hs.URL+"/v1/responses/"+final["id"].(string), nil)
	require.Equal(t, 200, code, "%v", got)
	assert.Equal(t, final, got)

	// store false keeps nothing.
	code, r3 := post(t, hs.URL+"/v1/responses", map[string]any{"model": "tiny", "max_output_tokens": 4, "input": "x", "store": false})
	require.Equal(t, 200, code)
	assert.Equal(t, false, r3["store"])
	code, got = respond(t, "GET", hs.URL+"/v1/responses/"+r3["id"].(string), nil)
	assert.Equal(t, 404, code, "%v", got)
	code, got = post(t, hs.URL+"/v1/responses", map[string]any{"model": "tiny", "input": "x", "previous_response_id": r3["id"]})
	require.Equal(t, 400, code, "%v", got)
	e := got["error"].(map[string]any)
	assert.Equal(t, "previous_response_id", e["param"])
	assert.Equal(t, "previous_response_not_found", e["code"])

	// DELETE drops it once.
	code, got = respond(t, "DELETE", hs.URL+"/v1/responses/"+id, nil)
	require.Equal(t, 200, code, "%v", got)
	assert.Equal(t, map[string]any{"id": id, "object": "response.deleted", "deleted": true}, got)
	for _, method := range []string{"GET", "DELETE"} {
		code, got = respond(t, method, hs.URL+"/v1/responses/"+id, nil)
		assert.Equal(t, 404, code, "%s %v", method, got)
	}
	code, got = respond(t, "GET", hs.URL+"/v1/responses/"+final["id"].(string)+"?stream=true", nil)
	assert.Equal(t, 400, code, "%v", got)
	code, _ = respond(t, "GET", hs.URL+"/v1/responses/"+final["id"].(string)+"/input_items", nil)
	assert.Equal(t, 404, code)
}

// TestResponsesStoreToolCalls: a kept response whose answer is tool
// calls continues with their outputs: the calls stay in the stored
// conversation as the assistant's tool_calls, and each output is
// rendered as the chat's tool message named after its function.
func TestResponsesStoreToolCalls(t *testing.T) {
	s, _, _ := newTestServer(t, Config{Name: "tiny"})
	tools := `[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]`
	var req responsesRequest
	require.NoError(t, json.Unmarshal([]byte(`{"tools":`+tools+`,"instructions":"Be brief.","input":"weather in Paris and Rome?"}`), &req))
	j, err := s.responsesJob(&req)
	require.NoError(t, err)
	require.True(t, j.resp.store)
	var whole map[string]any
	require.NoError(t, json.Unmarshal(runJob(t, s, j, k3.FinishStop, "Checking.", "<|tool_calls_section_begin|>",
		`<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>`,
		`<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"city": "Rome"}<|tool_call_end|>`,
		"<|tool_calls_section_end|>"), &whole))
	assert.Equal(t, true, whole["store"])

	var next responsesRequest
	require.NoError(t, json.Unmarshal([]byte(`{"previous_response_id":"resp_test","tools":`+tools+`,"input":[
		{"type":"function_call_output","call_id":"functions.get_weather:0","output":"18 C"},
		{"type":"function_call_output","call_id":"functions.get_weather:1","output":"21 C"}]}`), &next))
	nj, err := s.responsesJob(&next)
	require.NoError(t, err)
	want := chatPrompts(t, s, `{"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"messages":[
		{"role":"user","content":"weather in Paris and Rome?"},
		{"role":"assistant","content":"Checking.","tool_calls":[
			{"id":"functions.get_weather:0","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
			{"id":"functions.get_weather:1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Rome\"}"}}]},
		{"role":"tool","tool_call_id":"functions.get_weather:0","name":"get_weather","content":"18 C"},
		{"role":"tool","tool_call_id":"functions.get_weather:1","name":"get_weather","content":"21 C"}]}`)
	assert.Equal(t, want, nj.prompts)
}

// chatPrompts is the prompt a chat request (JSON) runs.
func chatPrompts(t *testing.T, s *Server, body string) [][]int32 {
	t.Helper()
	var req chatRequest
	require.NoError(t, json.Unmarshal([]byte(body), &req))
	j, err := s.chatJob(&req)
	require.NoError(t, err)
	return j.prompts
}

// TestResponseStoreBudget: past its budget the store drops the least
// recently used responses (a read counts as a use); a response larger
// than the budget is not kept; a server without a store says so.
func TestResponseStoreBudget(t *testing.T) {
	msgs := []chatMessage{{Role: "user", Content: jsonString("hello")}}
	obj := func(id string) map[string]any { return map[string]any{"id": id, "pad": strings.Repeat("x", 100)} }
	one := int64(len(mustJSON(t, obj("a"))) + len(mustJSON(t, msgs)))
	st, err := newResponseStore(3*one, "", 0, t.Logf)
	require.NoError(t, err)
	for _, id := range []string{"a", "b", "c"} {
		require.True(t, st.put(id, obj(id), msgs))
	}
	_, ok := st.get("a") // a is now the most recently used
	require.True(t, ok)
	require.True(t, st.put("d", obj("d"), msgs))
	_, ok = st.get("b")
	assert.False(t, ok, "b, the least recently used, is dropped")
	for _, id := range []string{"a", "c", "d"} {
		r, ok := st.get(id)
		require.True(t, ok, id)
		assert.JSONEq(t, string(mustJSON(t, obj(id))), string(r.obj), id)
		assert.Equal(t, msgs, r.msgs)
	}
	n, used := st.stats()
	assert.Equal(t, 3, n)
	assert.Equal(t, 3*one, used)
	big := map[string]any{"id": "e", "pad": strings.Repeat("x", int(3*one))}
	assert.False(t, st.put("e", big, msgs), "larger than the budget")
	require.True(t, st.put("c", obj("c"), msgs), "kept again: replaced, not counted twice")
	n, used = st.stats()
	assert.Equal(t, 3, n)
	assert.Equal(t, 3*one, used)
	for _, id := range []string{"a", "c", "d"} {
		_, ok := st.get(id)
		assert.True(t, ok, "%s: nothing else dropped", id)
	}
	assert.True(t, st.drop("c"))
	assert.False(t, st.drop("c"))

	_, hs, _ := newTestServer(t, Config{Name: "tiny", ResponseStoreBytes: -1})
	code, r := post(t, hs.URL+"/v1/responses", map[string]any{"model": "tiny", "max_output_tokens": 3, "input": "x"})
	require.Equal(t, 200, code)
	assert.Equal(t, false, r["store"])
	code, got := respond(t, "GET", hs.URL+"/v1/responses/"+r["id"].(string), nil)
	assert.Equal(t, 404, code)
	assert.Contains(t, got["error"].(map[string]any)["message"], "-responses-store-mb 0")
	code, got = post(t, hs.URL+"/v1/responses", map[string]any{"model": "tiny", "input": "x", "previous_response_id": r["id"]})
	assert.Equal(t, 400, code)
	assert.Equal(t, "previous_response_id", got["error"].(map[string]any)["param"])
}

// TestResponsesLongInput: a prompt longer than the context is an error
// naming input (the chat request it becomes names its messages).
func TestResponsesLongInput(t *testing.T) {
	_, hs, m := newTestServer(t, Config{Name: "tiny"})
	var sb strings.Builder
	for i := 0; len(m.Encode(sb.String())) <= m.ContextLength(); i += 1000 {
		for j := range 1000 {
			fmt.Fprintf(&sb, "w%d ", i+j)
		}
	}
	code, out := post(t, hs.URL+"/v1/responses", map[string]any{"input": sb.String(), "max_output_tokens": 4})
	require.Equal(t, 400, code, "%v", out)
	assert.Equal(t, "input", out["error"].(map[string]any)["param"])
}

// TestResponsesNamespaceTools: a namespace tool's functions reach the
// model as NAMESPACE__NAME and come back as name and namespace, whole and
// streamed; hosted and custom tools (which Codex sends with every request)
// are left out; a function_call item of the history keeps its namespace.
func TestResponsesNamespaceTools(t *testing.T) {
	_, hs, _ := newTestServer(t, Config{Name: "tiny"})
	tools := []any{
		map[string]any{"type": "web_search", "external_web_access": false},
		map[string]any{"type": "custom", "name": "apply_patch", "format": map[string]any{"type": "text"}},
		map[string]any{"type": "namespace", "name": "agents", "description": "sub-agents", "tools": []any{
			map[string]any{"type": "function", "name": "close_agent", "strict": true, "parameters": map[string]any{"type": "object",
				"properties": map[string]any{"id": map[string]any{"type": "string"}}, "required": []any{"id"}, "additionalProperties": false}},
			map[string]any{"type": "custom", "name": "freeform"},
		}},
	}
	body := map[string]any{"model": "tiny", "max_output_tokens": 400, "temperature": 0, "input": "Close the agent.", "tools": tools, "tool_choice": "required"}
	code, resp := post(t, hs.URL+"/v1/responses", body)
	require.Equal(t, 200, code, "%v", resp)
	var call map[string]any
	for _, it := range resp["output"].([]any) {
		if it.(map[string]any)["type"] == "function_call" {
			call = it.(map[string]any)
		}
	}
	require.NotNil(t, call, "%v", resp["output"])
	assert.Equal(t, "close_agent", call["name"])
	assert.Equal(t, "agents", call["namespace"])
	assert.Len(t, resp["tools"], 3, "the tools as sent")

	body["stream"] = true
	r := postStream(t, context.Background(), hs.URL+"/v1/responses", body)
	defer r.Body.Close()
	_, final := accumulate(t, respEvents(t, r.Body))
	var streamed map[string]any
	for _, it := range final["output"].([]any) {
		if it.(map[string]any)["type"] == "function_call" {
			streamed = it.(map[string]any)
		}
	}
	require.NotNil(t, streamed)
	assert.Equal(t, call["name"], streamed["name"])
	assert.Equal(t, call["namespace"], streamed["namespace"])
	assert.Equal(t, call["arguments"], streamed["arguments"])

	// The call and its output sent back: accepted, and answered.
	body = map[string]any{"model": "tiny", "max_output_tokens": 4, "temperature": 0, "tools": tools, "input": []any{
		map[string]any{"role": "user", "content": "Close the agent."},
		map[string]any{"type": "function_call", "call_id": call["call_id"], "name": "close_agent", "namespace": "agents", "arguments": call["arguments"]},
		map[string]any{"type": "function_call_output", "call_id": call["call_id"], "output": "closed"},
	}}
	code, resp = post(t, hs.URL+"/v1/responses", body)
	require.Equal(t, 200, code, "%v", resp)
}
