package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// OpenAI's Responses API (POST /v1/responses; docs/SERVING.md): a request
// is read into the chat request it amounts to and runs as one, so the
// chat's validation, tools, formats and reasoning hold; the answer is
// written in the Responses shapes. A finished response is kept
// (store.go) unless the request says store false, and a request naming
// it in previous_response_id continues its conversation.

type responsesRequest struct {
	Model             string          `json:"model"`
	Input             json.RawMessage `json:"input"`
	Instructions      *string         `json:"instructions"`
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	MaxOutputTokens   *int            `json:"max_output_tokens"`
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	Text              *struct {
		Format json.RawMessage `json:"format"`
	} `json:"text"`
	Reasoning *struct {
		Effort *string `json:"effort"`
	} `json:"reasoning"`
	Stream bool `json:"stream"`
	// Log-probabilities of the message's tokens: with
	// "message.output_text.logprobs" in include or top_logprobs above 0.
	Include     []string `json:"include"`
	TopLogprobs *int     `json:"top_logprobs"`
	// Store false keeps the response out of the server's store.
	Store              *bool   `json:"store"`
	PreviousResponseID *string `json:"previous_response_id"`
	// Refused: state k3 does not keep, work it does not do.
	Conversation json.RawMessage `json:"conversation"`
	Background   bool            `json:"background"`
	Prompt       json.RawMessage `json:"prompt"`
	Truncation   *string         `json:"truncation"`
}

// responseItem is one element of input.
type responseItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Namespace string          `json:"namespace"`
	Arguments *string         `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// responseEcho is what a response repeats of its request.
type responseEcho struct {
	instructions any
	maxOutput    any
	parallel     bool
	temperature  float64
	topP         float64
	toolChoice   any
	tools        any
	format       any
	topLogprobs  int
	prev         any                       // previous_response_id, or nil
	store        bool                      // the response is to be kept
	history      []chatMessage             // what it continues: the stored conversation and its input
	namespaced   map[string]namespacedName // a namespace tool's functions by their flat names
}

// namespacedName is a function of a namespace tool: the model sees it as
// NAMESPACE__NAME, a call names it back as name and namespace.
type namespacedName struct{ namespace, name string }

// flatToolName is the name the model sees for a namespace's function (as
// vLLM and llama.cpp flatten them).
func flatToolName(namespace, name string) string { return namespace + "__" + name }

func (s *Server) responsesJob(req *responsesRequest) (*job, error) {
	switch {
	case req.PreviousResponseID != nil && !s.kept.enabled():
		return nil, badParam("previous_response_id", "previous_response_id: this server keeps no responses (k3 serve -responses-store-mb 0); send the conversation in input")
	case len(req.Conversation) > 0 && string(req.Conversation) != "null":
		return nil, badParam("conversation", "conversation: k3 keeps no conversations; send the conversation in input")
	case req.Background:
		return nil, badParam("background", "background: k3 runs no responses in the background")
	case len(req.Prompt) > 0 && string(req.Prompt) != "null":
		return nil, badParam("prompt", "prompt: k3 keeps no stored prompts")
	case req.Truncation != nil && *req.Truncation != "disabled":
		return nil, badParam("truncation", "truncation = %q: k3 does not drop input to fit the context, want \"disabled\"", *req.Truncation)
	}
	chat := chatRequest{}
	chat.Model, chat.MaxTokens, chat.Temperature, chat.TopP, chat.Stream = req.Model, req.MaxOutputTokens, req.Temperature, req.TopP, req.Stream
	chat.ParallelToolCalls = req.ParallelToolCalls
	if req.Instructions != nil && *req.Instructions != "" {
		chat.Messages = append(chat.Messages, chatMessage{Role: "system", Content: jsonString(*req.Instructions)})
	}
	var history []chatMessage
	if id := req.PreviousResponseID; id != nil {
		prev, ok := s.kept.get(*id)
		if !ok {
			return nil, &apiError{status: 400, typ: "invalid_request_error", param: "previous_response_id", code: "previous_response_not_found",
				msg: fmt.Sprintf("previous_response_id: no response %q is kept (never stored, deleted, or dropped as the least recently used)", *id)}
		}
		history = prev.msgs
	}
	msgs, err := responseMessages(req.Input, history)
	if err != nil {
		return nil, err
	}
	chat.Messages = append(append(chat.Messages, history...), msgs...)
	var namespaced map[string]namespacedName
	var toolParams []string
	if chat.Tools, namespaced, toolParams, err = chatTools(req.Tools); err != nil {
		return nil, err
	}
	if chat.ToolChoice, err = chatToolChoice(req.ToolChoice); err != nil {
		return nil, err
	}
	var sent []json.RawMessage
	if _ = json.Unmarshal(req.Tools, &sent); chat.Tools == nil && len(sent) > 0 && strings.TrimSpace(string(chat.ToolChoice)) == `"required"` {
		return nil, badParam("tool_choice", `tool_choice = "required" needs function tools; hosted and custom tools are not offered to the model`)
	}
	echo := &responseEcho{parallel: req.ParallelToolCalls == nil || *req.ParallelToolCalls,
		temperature: 1, topP: 1, toolChoice: "auto", tools: []any{}, format: map[string]any{"type": "text"},
		store: (req.Store == nil || *req.Store) && s.kept.enabled(), history: slices.Concat(history, msgs), namespaced: namespaced}
	if req.PreviousResponseID != nil {
		echo.prev = *req.PreviousResponseID
	}
	if req.Instructions != nil {
		echo.instructions = *req.Instructions
	}
	if req.MaxOutputTokens != nil {
		echo.maxOutput = *req.MaxOutputTokens
	}
	if req.Temperature != nil {
		echo.temperature = *req.Temperature
	}
	if req.TopP != nil {
		echo.topP = *req.TopP
	}
	if len(req.ToolChoice) > 0 && string(req.ToolChoice) != "null" {
		echo.toolChoice = req.ToolChoice
	}
	if len(chat.Tools) > 0 {
		echo.tools = req.Tools
	}
	if req.Text != nil && len(req.Text.Format) > 0 && string(req.Text.Format) != "null" {
		if chat.ResponseFormat, err = chatFormat(req.Text.Format); err != nil {
			return nil, err
		}
		echo.format = req.Text.Format
	}
	if req.Reasoning != nil && req.Reasoning.Effort != nil && *req.Reasoning.Effort == "none" {
		chat.ChatTemplateKwargs = map[string]any{"thinking": false}
	}
	if slices.Contains(req.Include, "message.output_text.logprobs") || req.TopLogprobs != nil && *req.TopLogprobs > 0 {
		chat.Logprobs, chat.TopLogprobs = json.RawMessage("true"), req.TopLogprobs
		if req.TopLogprobs != nil {
			echo.topLogprobs = *req.TopLogprobs
		}
	}
	j, err := s.chatJob(&chat)
	if err != nil {
		return nil, renameParams(err, toolParams)
	}
	if j.logprobs && (j.tools || j.reasoning) {
		// The message's tokens are then not all of the answer's.
		return nil, badParam("include", "log-probabilities with tools or a thinking model's reasoning (set reasoning.effort \"none\") are not served on /v1/responses")
	}
	j.resp = echo
	return j, nil
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// responseMessages reads input into chat messages, continuing history (a
// stored conversation, whose calls a function_call_output may answer).
// Every field the chat request checks is checked here, so the chat's
// errors never name its messages.
func responseMessages(raw json.RawMessage, history []chatMessage) (msgs []chatMessage, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badParam("input", "input is missing")
	}
	if raw[0] == '"' {
		return []chatMessage{{Role: "user", Content: raw}}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badParam("input", "input is neither a string nor a list of items")
	}
	names := map[string]string{} // call_id -> the function's name
	for _, m := range history {
		for _, c := range m.ToolCalls {
			names[c.ID] = c.Function.Name
		}
	}
	for i, rawItem := range items {
		param := fmt.Sprintf("input[%d]", i)
		var it responseItem
		if err := json.Unmarshal(rawItem, &it); err != nil {
			return nil, badParam(param, "%s is not an input item (an object with a type or a role)", param)
		}
		switch it.Type {
		case "", "message":
			text, err := responseText(it.Content, param+".content")
			if err != nil {
				return nil, err
			}
			switch it.Role {
			case "user", "system", "developer", "assistant":
			default:
				return nil, badParam(param+".role", "%s.role = %q, want user, system, developer or assistant", param, it.Role)
			}
			msgs = append(msgs, chatMessage{Role: it.Role, Content: jsonString(text)})
		case "function_call":
			if it.CallID == "" || it.Name == "" || it.Arguments == nil {
				return nil, badParam(param, "%s: a function_call needs call_id, name and arguments", param)
			}
			name := it.Name
			if it.Namespace != "" {
				name = flatToolName(it.Namespace, it.Name)
			}
			var call toolCall
			call.ID, call.Type, call.Function.Name, call.Function.Arguments = it.CallID, "function", name, *it.Arguments
			names[it.CallID] = name
			// Calls that follow an assistant message (or each other) are
			// that message's.
			if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
				msgs[n-1].ToolCalls = append(msgs[n-1].ToolCalls, call)
				continue
			}
			msgs = append(msgs, chatMessage{Role: "assistant", Content: jsonString(""), ToolCalls: []toolCall{call}})
		case "function_call_output":
			if it.CallID == "" {
				return nil, badParam(param+".call_id", "%s.call_id is missing", param)
			}
			text, err := responseText(it.Output, param+".output")
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, chatMessage{Role: "tool", ToolCallID: it.CallID, Name: names[it.CallID], Content: jsonString(text)})
		case "reasoning":
			// Earlier reasoning is not rendered back (the Kimi templates
			// drop it).
		default:
			return nil, badParam(param+".type", "%s.type = %q: k3 reads message, function_call, function_call_output and reasoning items", param, it.Type)
		}
	}
	if len(msgs) == 0 {
		return nil, badParam("input", "input holds no message")
	}
	return msgs, nil
}

// responseText reads a message's content or a call's output: a string,
// or a list of text parts.
func responseText(raw json.RawMessage, param string) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", badParam(param, "%s is missing", param)
	}
	return partsText(raw, param, "input_text", "output_text")
}

// chatTools rewrites the Responses API's function tools in the chat form
// ({"type": "function", "function": {...}}). A namespace tool's functions
// become functions named NAMESPACE__NAME (namespaced maps them back for
// the calls). Tools k3 cannot offer the model, hosted ones (web_search,
// file_search, mcp, ...) and custom ones, are left out: clients such as
// Codex send them with every request.
func chatTools(raw json.RawMessage) (json.RawMessage, map[string]namespacedName, []string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, nil, nil
	}
	var tools []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, nil, nil, badParam("tools", "tools is not a list of tool objects")
	}
	var out []map[string]any
	var params []string // each function's place in tools
	var namespaced map[string]namespacedName
	seen := map[string]string{} // a function's name (flat) -> where it was declared
	add := func(t map[string]json.RawMessage, name, param string) error {
		if prev, ok := seen[name]; ok {
			return badParam(param+".name", "%s.name: a second function named %q (the first is %s)", param, name, prev)
		}
		seen[name] = param
		fn := map[string]json.RawMessage{}
		for k, v := range t {
			if k != "type" {
				fn[k] = v
			}
		}
		fn["name"], _ = json.Marshal(name)
		out = append(out, map[string]any{"type": "function", "function": fn})
		params = append(params, param)
		return nil
	}
	for i, t := range tools {
		param := fmt.Sprintf("tools[%d]", i)
		var typ, name string
		_ = json.Unmarshal(t["type"], &typ)
		_ = json.Unmarshal(t["name"], &name)
		switch typ {
		case "function":
			if name == "" {
				return nil, nil, nil, badParam(param+".name", "%s.name is missing", param)
			}
			if err := add(t, name, param); err != nil {
				return nil, nil, nil, err
			}
		case "namespace":
			if name == "" {
				return nil, nil, nil, badParam(param+".name", "%s.name is missing", param)
			}
			var inner []map[string]json.RawMessage
			if err := json.Unmarshal(t["tools"], &inner); err != nil {
				return nil, nil, nil, badParam(param+".tools", "%s.tools is not a list of tool objects", param)
			}
			for j, f := range inner {
				fparam := fmt.Sprintf("%s.tools[%d]", param, j)
				var ftyp, fname string
				_ = json.Unmarshal(f["type"], &ftyp)
				_ = json.Unmarshal(f["name"], &fname)
				if ftyp != "function" {
					continue // a custom tool: left out, as at the top level
				}
				if fname == "" {
					return nil, nil, nil, badParam(fparam+".name", "%s.name is missing", fparam)
				}
				flat := flatToolName(name, fname)
				if err := add(f, flat, fparam); err != nil {
					return nil, nil, nil, err
				}
				if namespaced == nil {
					namespaced = map[string]namespacedName{}
				}
				namespaced[flat] = namespacedName{namespace: name, name: fname}
			}
		case "":
			return nil, nil, nil, badParam(param+".type", "%s.type is missing", param)
		}
	}
	if len(out) == 0 {
		return nil, nil, nil, nil
	}
	b, err := json.Marshal(out)
	return b, namespaced, params, err
}

// chatToolChoice rewrites a named function choice in the chat form.
func chatToolChoice(raw json.RawMessage) (json.RawMessage, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" || s[0] == '"' {
		return raw, nil
	}
	var named struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &named) != nil || named.Type != "function" || named.Name == "" {
		return nil, badParam("tool_choice", `tool_choice = %s, want "auto", "none", "required" or {"type": "function", "name": ...}`, raw)
	}
	return json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": named.Name}})
}

// chatFormat rewrites text.format as a chat response_format.
func chatFormat(raw json.RawMessage) (*responseFormat, error) {
	var f struct {
		Type   string          `json:"type"`
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict *bool           `json:"strict"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, badParam("text.format", "text.format is not a format object")
	}
	switch f.Type {
	case "text":
		return nil, nil
	case "json_object":
		return &responseFormat{Type: f.Type}, nil
	case "json_schema":
		rf := &responseFormat{Type: f.Type}
		rf.JSONSchema = &responseSchema{Name: f.Name, Schema: f.Schema, Strict: f.Strict}
		return rf, nil
	}
	return nil, badParam("text.format.type", "text.format.type = %q, want text, json_object or json_schema", f.Type)
}

// renameParams names the Responses request's fields in an error about
// the chat request it became; toolParams gives each chat tool's place in
// the request's tools.
func renameParams(err error, toolParams []string) error {
	var ae *apiError
	if !errors.As(err, &ae) {
		return err
	}
	rename := func(s string) string {
		for i, p := range toolParams {
			s = strings.ReplaceAll(s, fmt.Sprintf("tools[%d].function.", i), p+".")
		}
		for _, r := range [][2]string{{".function.", "."}, {"response_format.json_schema.schema", "text.format.schema"},
			{"response_format", "text.format"}, {"max_completion_tokens", "max_output_tokens"}, {"max_tokens", "max_output_tokens"},
		} {
			s = strings.ReplaceAll(s, r[0], r[1])
		}
		return s
	}
	out := *ae
	out.param, out.msg = rename(ae.param), rename(ae.msg)
	if out.param == "messages" { // the whole prompt (its length), not one message
		out.param = "input"
	}
	return &out
}

// parts splits a finished choice into its reasoning, its message's text
// and its tool calls.
func (a *answer) parts(c *choice) (reasoning, text string, calls []toolCall) {
	text = string(c.text)
	if a.j.reasoning {
		reasoning, text = splitReasoning(text, c.finish == "length")
	}
	if a.j.tools {
		if content, cs, ok := parseToolCalls(text, c.finish == "length"); ok {
			text, calls = content, cs
		}
	}
	return reasoning, text, calls
}

// keep stores the finished response obj, as GET answers it and as the
// conversation a response following it continues (its answer as an
// assistant turn, reasoning dropped), when its request lets it be kept;
// obj's store says whether it was.
func (a *answer) keep(obj map[string]any) {
	e := a.j.resp
	if !e.store {
		return
	}
	_, text, calls := a.parts(&a.choices[0])
	turn := chatMessage{Role: "assistant", Content: jsonString(text), ToolCalls: calls}
	if !a.s.kept.put(a.id, obj, append(slices.Clip(e.history), turn)) {
		obj["store"] = false
	}
}

// responseOutput is a finished choice as the Responses API's output
// items: reasoning, the message, the calls.
func (a *answer) responseOutput(c *choice, id string) (items []map[string]any, incomplete bool) {
	status := "completed"
	if c.finish == "length" {
		incomplete, status = true, "incomplete"
	}
	reasoning, text, calls := a.parts(c)
	if reasoning != "" {
		items = append(items, reasoningItem(id, reasoning, status))
	}
	if text != "" || len(calls) == 0 {
		items = append(items, messageItem(id, text, status, c.lps))
	}
	for k, call := range calls {
		items = append(items, a.j.resp.callItem(id, k, call, call.Function.Arguments, callStatus(call)))
	}
	return items, incomplete
}

func reasoningItem(id, text, status string) map[string]any {
	content := []any{}
	if text != "" || status != "in_progress" {
		content = append(content, map[string]any{"type": "reasoning_text", "text": text})
	}
	return map[string]any{"type": "reasoning", "id": "rs_" + id, "summary": []any{}, "content": content, "status": status}
}

func messageItem(id, text, status string, lps []tokenLogprob) map[string]any {
	content := []any{}
	if status != "in_progress" {
		content = append(content, outputText(text, lps))
	}
	return map[string]any{"type": "message", "id": "msg_" + id, "status": status, "role": "assistant", "content": content}
}

// outputText is a message's text part, with its tokens' log-probabilities
// when the request asked for them.
func outputText(text string, lps []tokenLogprob) map[string]any {
	var lp any = []any{}
	if lps != nil {
		lp = lps
	}
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": lp}
}

// callStatus is a finished call's item status: incomplete where
// max_tokens or the context cut its arguments short.
func callStatus(call toolCall) string {
	if call.cut {
		return "incomplete"
	}
	return "completed"
}

// callItem is a call's function_call item; a namespace's function is
// named back as its name and namespace.
func (e *responseEcho) callItem(id string, k int, call toolCall, args, status string) map[string]any {
	item := map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_%s_%d", id, k), "call_id": call.ID,
		"name": call.Function.Name, "arguments": args, "status": status}
	if n, ok := e.namespaced[call.Function.Name]; ok {
		item["name"], item["namespace"] = n.name, n.namespace
	}
	return item
}

// responseObject is the response: status, output and usage so far.
func (a *answer) responseObject(status string, output []map[string]any, u *usage) map[string]any {
	e := a.j.resp
	obj := map[string]any{"id": a.id, "object": "response", "created_at": a.created, "status": status,
		"model": a.s.cfg.Name, "output": output, "error": nil, "incomplete_details": nil,
		"instructions": e.instructions, "max_output_tokens": e.maxOutput, "parallel_tool_calls": e.parallel,
		"temperature": e.temperature, "top_p": e.topP, "tool_choice": e.toolChoice, "tools": e.tools,
		"text": map[string]any{"format": e.format}, "previous_response_id": e.prev, "store": e.store,
		"truncation": "disabled", "metadata": map[string]any{}, "usage": nil, "top_logprobs": e.topLogprobs}
	if output == nil {
		obj["output"] = []any{}
	}
	if status == "incomplete" {
		obj["incomplete_details"] = map[string]any{"reason": "max_output_tokens"}
	}
	if u != nil {
		reasoning := 0
		if u.Completion != nil {
			reasoning = u.Completion.ReasoningTokens
		}
		obj["usage"] = map[string]any{"input_tokens": u.PromptTokens, "input_tokens_details": map[string]any{"cached_tokens": u.Details.CachedTokens},
			"output_tokens": u.CompletionTokens, "output_tokens_details": map[string]any{"reasoning_tokens": reasoning}, "total_tokens": u.TotalTokens}
	}
	return obj
}

// responseWhole answers once the generation has finished.
func (a *answer) responseWhole(w http.ResponseWriter, events <-chan event) {
	if !a.collect(w, events) {
		return
	}
	items, incomplete := a.responseOutput(&a.choices[0], a.itemID())
	status := "completed"
	if incomplete {
		status = "incomplete"
	}
	obj := a.responseObject(status, items, a.usage())
	a.keep(obj)
	writeJSON(w, 200, obj)
}

// getResponse answers GET /v1/responses/{id} with a kept response.
func (s *Server) getResponse(w http.ResponseWriter, r *http.Request) {
	if v := r.URL.Query().Get("stream"); v != "" && v != "false" {
		writeError(w, badParam("stream", "stream = %q: k3 answers a kept response whole", v))
		return
	}
	r0, ok := s.kept.get(r.PathValue("id"))
	if !ok {
		writeError(w, s.responseNotFound(r.PathValue("id")))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(r0.obj)
}

// deleteResponse answers DELETE /v1/responses/{id}.
func (s *Server) deleteResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.kept.drop(id) {
		writeError(w, s.responseNotFound(id))
		return
	}
	writeJSON(w, 200, map[string]any{"id": id, "object": "response.deleted", "deleted": true})
}

func (s *Server) responseNotFound(id string) *apiError {
	why := "never stored, deleted, or dropped as the least recently used"
	if !s.kept.enabled() {
		why = "this server keeps no responses: k3 serve -responses-store-mb 0"
	}
	return &apiError{status: 404, typ: "invalid_request_error", param: "response_id", msg: fmt.Sprintf("no response %q is kept (%s)", id, why)}
}

// itemID is the part of the response's id its items' ids share.
func (a *answer) itemID() string { return strings.TrimPrefix(a.id, "resp_") }

// responseStream streams the Responses API's events.
func (a *answer) responseStream(ctx context.Context, w http.ResponseWriter, events <-chan event) {
	rs := &respStream{a: a, w: w, id: a.itemID()}
	rs.flusher, _ = w.(http.Flusher)
	c := &a.choices[0]
	for ev := range events {
		if ev.err != nil {
			a.s.abandoned(ev.err)
			if ctx.Err() != nil {
				return
			}
			if !rs.started {
				writeError(w, ev.err)
				return
			}
			// The error, then the terminal event a client waiting for one
			// reads (Codex takes a failed response's error from it): the
			// response, failed, with the output items finished before
			// it. It is not kept.
			ae := asAPIError(ev.err)
			if rs.send("error", map[string]any{"code": nullIfEmpty(ae.code), "message": ae.msg, "param": nullIfEmpty(ae.param)}) {
				obj := a.responseObject("failed", rs.output, nil)
				code := ae.code
				if code == "" {
					code = "server_error"
				}
				obj["error"] = map[string]any{"code": code, "message": ae.msg}
				rs.send("response.failed", map[string]any{"response": obj})
			}
			return
		}
		if !rs.begin() {
			a.s.met.failed("abort")
			return
		}
		text, lps, _ := a.take(ev)
		reasoning, content, calls := a.split(c, text)
		if !rs.reasoning(reasoning) || !rs.content(content, lps) {
			a.s.met.failed("abort")
			return
		}
		if c.finish != "" && !rs.finish(calls, c.finish == "length") {
			a.s.met.failed("abort")
			return
		}
	}
	if a.done < len(a.choices) {
		a.s.met.failed("abort")
	}
}

// respStream writes one response's events, opening each output item at
// its first text and closing it before the next.
type respStream struct {
	a       *answer
	w       http.ResponseWriter
	flusher http.Flusher
	id      string
	started bool
	seq     int
	output  []map[string]any // the items done so far
	open    string           // the open item's type: "", "reasoning", "message"
	text    strings.Builder  // the open item's text
}

func (rs *respStream) send(typ string, fields map[string]any) bool {
	fields["type"], fields["sequence_number"] = typ, rs.seq
	rs.seq++
	b, err := json.Marshal(fields)
	if err != nil {
		return false
	}
	if _, err := fmt.Fprintf(rs.w, "event: %s\ndata: %s\n\n", typ, b); err != nil {
		return false
	}
	if rs.flusher != nil {
		rs.flusher.Flush()
	}
	return true
}

func (rs *respStream) begin() bool {
	if rs.started {
		return true
	}
	rs.started = true
	h := rs.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	rs.w.WriteHeader(200)
	return rs.send("response.created", map[string]any{"response": rs.a.responseObject("in_progress", nil, nil)}) &&
		rs.send("response.in_progress", map[string]any{"response": rs.a.responseObject("in_progress", nil, nil)})
}

// openItem opens an item of kind typ (closing another open one).
func (rs *respStream) openItem(typ string) bool {
	if rs.open == typ {
		return true
	}
	if !rs.closeItem("completed") {
		return false
	}
	rs.open = typ
	idx := len(rs.output)
	item := messageItem(rs.id, "", "in_progress", nil)
	part := outputText("", nil)
	if typ == "reasoning" {
		item = reasoningItem(rs.id, "", "in_progress")
		part = map[string]any{"type": "reasoning_text", "text": ""}
	}
	return rs.send("response.output_item.added", map[string]any{"output_index": idx, "item": item}) &&
		rs.send("response.content_part.added", map[string]any{"item_id": item["id"], "output_index": idx, "content_index": 0, "part": part})
}

// closeItem ends the open item, if any, with the given status.
func (rs *respStream) closeItem(status string) bool {
	if rs.open == "" {
		return true
	}
	idx, text := len(rs.output), rs.text.String()
	lps := rs.a.choices[0].lps
	item, part, done := messageItem(rs.id, text, status, lps), outputText(text, lps), "response.output_text.done"
	if rs.open == "reasoning" {
		item, part, done = reasoningItem(rs.id, text, status), map[string]any{"type": "reasoning_text", "text": text}, "response.reasoning_text.done"
	}
	rs.open = ""
	rs.text.Reset()
	rs.output = append(rs.output, item)
	return rs.send(done, map[string]any{"item_id": item["id"], "output_index": idx, "content_index": 0, "text": text}) &&
		rs.send("response.content_part.done", map[string]any{"item_id": item["id"], "output_index": idx, "content_index": 0, "part": part}) &&
		rs.send("response.output_item.done", map[string]any{"output_index": idx, "item": item})
}

func (rs *respStream) delta(typ, kind, text string, lps []tokenLogprob) bool {
	if text == "" && lps == nil {
		return true
	}
	if !rs.openItem(kind) {
		return false
	}
	rs.text.WriteString(text)
	id := "msg_" + rs.id
	if kind == "reasoning" {
		id = "rs_" + rs.id
	}
	ev := map[string]any{"item_id": id, "output_index": len(rs.output), "content_index": 0, "delta": text}
	if kind == "message" {
		ev["logprobs"] = []tokenLogprob{}
		if lps != nil {
			ev["logprobs"] = lps
		}
	}
	return rs.send(typ, ev)
}

func (rs *respStream) reasoning(text string) bool {
	return rs.delta("response.reasoning_text.delta", "reasoning", text, nil)
}

func (rs *respStream) content(text string, lps []tokenLogprob) bool {
	return rs.delta("response.output_text.delta", "message", text, lps)
}

// finish closes the open item, sends the calls and the final response.
func (rs *respStream) finish(calls []toolCall, incomplete bool) bool {
	status := "completed"
	if incomplete {
		status = "incomplete"
	}
	if rs.open == "" && len(calls) == 0 && !rs.hasMessage() {
		// An answer with no text and no call still has its message.
		if !rs.openItem("message") {
			return false
		}
	}
	if !rs.closeItem(status) {
		return false
	}
	for k, call := range calls {
		idx := len(rs.output)
		item := rs.a.j.resp.callItem(rs.id, k, call, "", "in_progress")
		if !rs.send("response.output_item.added", map[string]any{"output_index": idx, "item": item}) ||
			!rs.send("response.function_call_arguments.delta", map[string]any{"item_id": item["id"], "output_index": idx, "delta": call.Function.Arguments}) ||
			!rs.send("response.function_call_arguments.done", map[string]any{"item_id": item["id"], "output_index": idx, "arguments": call.Function.Arguments}) {
			return false
		}
		done := rs.a.j.resp.callItem(rs.id, k, call, call.Function.Arguments, callStatus(call))
		rs.output = append(rs.output, done)
		if !rs.send("response.output_item.done", map[string]any{"output_index": idx, "item": done}) {
			return false
		}
	}
	ev := "response.completed"
	if incomplete {
		ev = "response.incomplete"
	}
	obj := rs.a.responseObject(status, rs.output, rs.a.usage())
	rs.a.keep(obj)
	return rs.send(ev, map[string]any{"response": obj})
}

func (rs *respStream) hasMessage() bool {
	for _, it := range rs.output {
		if it["type"] == "message" {
			return true
		}
	}
	return false
}
