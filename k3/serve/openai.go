package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"k3/internal/tokenizer"
	"k3/k3"
)

// The request bodies, as OpenAI's API documents them. Fields whose JSON
// type varies (stop, prompt, content, logprobs) stay raw until validated.
// Fields a client may send that change nothing here (user, metadata,
// store, ...) are ignored, as OpenAI-compatible servers do.
type sampling struct {
	Model               string             `json:"model"`
	MaxTokens           *int               `json:"max_tokens"`
	MaxCompletionTokens *int               `json:"max_completion_tokens"`
	Temperature         *float64           `json:"temperature"`
	TopP                *float64           `json:"top_p"`
	TopK                *int               `json:"top_k"` // extension (vLLM)
	MinP                *float64           `json:"min_p"` // extension (vLLM)
	Seed                *int64             `json:"seed"`
	Stop                json.RawMessage    `json:"stop"`
	N                   *int               `json:"n"`
	PresencePenalty     *float64           `json:"presence_penalty"`
	FrequencyPenalty    *float64           `json:"frequency_penalty"`
	LogitBias           map[string]float64 `json:"logit_bias"`
	IgnoreEOS           bool               `json:"ignore_eos"` // extension (vLLM)
	Stream              bool               `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// Tools: chat only (tools.go).
	Tools json.RawMessage `json:"tools"`
	// Features k3 does not serve; a request that asks for them is refused
	// rather than answered as if it had not.
	Functions      json.RawMessage `json:"functions"`
	ResponseFormat *responseFormat `json:"response_format"`
}

type responseFormat struct {
	Type       string          `json:"type"`
	JSONSchema *responseSchema `json:"json_schema"`
}

type responseSchema struct {
	Name   string          `json:"name"`
	Schema json.RawMessage `json:"schema"`
	Strict *bool           `json:"strict"` // read and ignored: the schema is always held
}

type chatRequest struct {
	sampling
	Messages    []chatMessage   `json:"messages"`
	Logprobs    json.RawMessage `json:"logprobs"` // a boolean here
	TopLogprobs *int            `json:"top_logprobs"`
	ToolChoice  json.RawMessage `json:"tool_choice"`
	// ParallelToolCalls is accepted: the calls returned are those the
	// model wrote.
	ParallelToolCalls *bool `json:"parallel_tool_calls"`
	// ChatTemplateKwargs (vLLM's extension): "thinking" is read.
	ChatTemplateKwargs map[string]any `json:"chat_template_kwargs"`
}

type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []toolCall      `json:"tool_calls"`   // assistant
	ToolCallID string          `json:"tool_call_id"` // tool
	Name       string          `json:"name"`
}

type completionRequest struct {
	sampling
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs json.RawMessage `json:"logprobs"` // an integer here
	Echo     bool            `json:"echo"`
	BestOf   *int            `json:"best_of"`
	Suffix   *string         `json:"suffix"`
}

// apiError is an error the client sees as OpenAI's error object.
type apiError struct {
	status int
	typ    string
	param  string
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badParam(param, format string, args ...any) *apiError {
	return &apiError{status: 400, typ: "invalid_request_error", param: param, msg: fmt.Sprintf(format, args...)}
}

// job is a validated request: what to feed and how to draw each choice.
// Choice k answers prompt k/n (a completion request may hold several
// prompts; a chat has one) as its choice k%n.
type job struct {
	chat         bool
	prompts      [][]int32
	n            int // choices per prompt
	stream       bool
	includeUsage bool
	logprobs     bool
	top          int
	tools        bool                // read tool calls back from the text (tools.go)
	reasoning    bool                // split reasoning from content (reasoning.go)
	opts         []k3.GenerateOption // shared by every choice
	maxTokens    []int               // per prompt
	seeds        []uint64            // per prompt: its choice i draws with seed+i
	resp         *responseEcho       // answered in the Responses API's shapes (responses.go)
	echo         bool                // completions: the prompt is scored and repeated before the text (echo.go)
}

// choices is how many generations the request runs.
func (j *job) choices() int { return len(j.prompts) * j.n }

// choiceOpts are the generation options of choice k.
func (j *job) choiceOpts(k int) []k3.GenerateOption {
	p := k / j.n
	o := append([]k3.GenerateOption(nil), j.opts...)
	return append(o, k3.WithMaxTokens(j.maxTokens[p]), k3.WithSeed(j.seeds[p]+uint64(k%j.n)))
}

func (s *Server) chatJob(req *chatRequest) (*job, error) {
	if len(req.Messages) == 0 {
		return nil, badParam("messages", "messages is empty; a chat completion needs at least one message")
	}
	decl, names, err := toolDeclaration(req.Tools)
	if err != nil {
		return nil, err
	}
	// The turns' text is the client's: it is encoded as text, so that a
	// special-token string in it cannot open or close a turn; only the
	// format's markers and the tool calls' section markers are tokens.
	var turns []tokenizer.ChatTurn
	if decl != "" {
		turns = append(turns, tokenizer.ChatTurn{Role: "tool_declare", Parts: []tokenizer.ChatPart{{Text: decl}}})
	}
	for i, m := range req.Messages {
		param := fmt.Sprintf("messages[%d]", i)
		text, err := contentText(m.Content, param+".content")
		if err != nil {
			return nil, err
		}
		turn := tokenizer.ChatTurn{Role: m.Role, Parts: []tokenizer.ChatPart{{Text: text}}}
		switch m.Role {
		case "system", "user":
		case "assistant":
			if len(m.ToolCalls) > 0 {
				calls, err := toolCallsParts(m.ToolCalls, param+".tool_calls")
				if err != nil {
					return nil, err
				}
				turn.Parts = append(turn.Parts, calls...)
			}
		case "tool":
			if turn, err = toolResult(m, text, param); err != nil {
				return nil, err
			}
		case "developer":
			turn.Role = "system"
		default:
			return nil, badParam(param+".role", "%s.role = %q, want system, developer, user, assistant or tool", param, m.Role)
		}
		turns = append(turns, turn)
	}
	prompt := tokenizer.EncodeChat(s.m.Tokenizer(), turns, true)
	j := &job{chat: true}
	if s.cfg.Reasoning {
		j.reasoning = true
		if v, ok := req.ChatTemplateKwargs["thinking"]; ok {
			think, ok := v.(bool)
			if !ok {
				return nil, badParam("chat_template_kwargs", "chat_template_kwargs.thinking = %s, want true or false", jsonText(v))
			}
			if !think {
				// The template's empty reasoning.
				prompt = append(prompt, s.m.Tokenizer().Encode(thinkBegin+thinkEnd, true)...)
				j.reasoning = false
			}
		}
	}
	j.prompts = [][]int32{prompt}
	// tool_choice required, or naming a function, holds the answer to
	// tool calls (k3.WithToolCalls).
	var forced []string
	switch choice := strings.TrimSpace(string(req.ToolChoice)); choice {
	case "", "null", `"auto"`:
		j.tools = decl != ""
	case `"none"`:
	case `"required"`:
		if decl == "" {
			return nil, badParam("tool_choice", `tool_choice = "required" needs tools`)
		}
		forced = names
	default:
		var named struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if json.Unmarshal(req.ToolChoice, &named) != nil || named.Type != "function" {
			return nil, badParam("tool_choice", "tool_choice = %s, want \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}", req.ToolChoice)
		}
		if !slices.Contains(names, named.Function.Name) {
			return nil, badParam("tool_choice", "tool_choice names the function %q, which tools does not declare", named.Function.Name)
		}
		forced = []string{named.Function.Name}
	}
	parallel := req.ParallelToolCalls == nil || *req.ParallelToolCalls
	formatted := req.ResponseFormat != nil && (req.ResponseFormat.Type == "json_object" || req.ResponseFormat.Type == "json_schema")
	switch {
	case forced != nil:
		if formatted {
			return nil, badParam("response_format", "response_format %s with a forced tool call: the call's arguments are JSON already", req.ResponseFormat.Type)
		}
		j.tools = true
		j.opts = append(j.opts, k3.WithToolCalls(forced, parallel))
		schemas, _, err := s.toolSchemas(req.Tools, forced)
		if err != nil {
			return nil, err
		}
		if len(schemas) > 0 {
			j.opts = append(j.opts, k3.WithToolArguments(schemas))
		}
	case j.tools:
		// auto: the calls the model chooses to make are held only when a
		// function asks for it (strict), and not beside a response_format
		// (one grammar holds a generation).
		schemas, strict, err := s.toolSchemas(req.Tools, names)
		if err != nil {
			return nil, err
		}
		if strict && !formatted {
			j.opts = append(j.opts, k3.WithOptionalToolCalls(names, parallel))
			if len(schemas) > 0 {
				j.opts = append(j.opts, k3.WithToolArguments(schemas))
			}
		}
	}
	if len(req.Logprobs) > 0 && string(req.Logprobs) != "null" {
		if err := json.Unmarshal(req.Logprobs, &j.logprobs); err != nil {
			return nil, badParam("logprobs", "logprobs = %s, want true or false", req.Logprobs)
		}
	}
	if req.TopLogprobs != nil {
		if !j.logprobs {
			return nil, badParam("top_logprobs", "top_logprobs needs logprobs = true")
		}
		if *req.TopLogprobs < 0 || *req.TopLogprobs > 20 {
			return nil, badParam("top_logprobs", "top_logprobs = %d, want in 0..20", *req.TopLogprobs)
		}
		j.top = *req.TopLogprobs
	}
	return j, s.sampling(&req.sampling, j)
}

func (s *Server) completionJob(req *completionRequest) (*job, error) {
	prompts, err := s.promptList(req.Prompt)
	if err != nil {
		return nil, err
	}
	switch {
	case req.BestOf != nil && *req.BestOf != 1:
		return nil, badParam("best_of", "best_of = %d is not served by k3 (use n)", *req.BestOf)
	case req.Suffix != nil && *req.Suffix != "":
		return nil, badParam("suffix", "suffix is not served by k3")
	}
	j := &job{prompts: prompts, echo: req.Echo}
	if len(req.Logprobs) > 0 && string(req.Logprobs) != "null" {
		var n int
		if err := json.Unmarshal(req.Logprobs, &n); err != nil || n < 0 || n > 20 {
			return nil, badParam("logprobs", "logprobs = %s, want an integer in 0..20", req.Logprobs)
		}
		j.logprobs, j.top = true, n
	}
	return j, s.sampling(&req.sampling, j)
}

// promptList reads a completion's prompts: a string or a list of token
// ids is one prompt, a list of either several.
func (s *Server) promptList(raw json.RawMessage) ([][]int32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badParam("prompt", "prompt is missing")
	}
	if p, err := s.promptTokens(raw, "prompt"); err == nil || !errors.Is(err, errNotPrompt) {
		return [][]int32{p}, err
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return nil, badParam("prompt", "prompt must be a string, a list of token ids, or a list of either")
	}
	if len(list) == 0 {
		return nil, badParam("prompt", "prompt is an empty list")
	}
	prompts := make([][]int32, len(list))
	for i, r := range list {
		param := fmt.Sprintf("prompt[%d]", i)
		p, err := s.promptTokens(r, param)
		if errors.Is(err, errNotPrompt) {
			return nil, badParam(param, "%s must be a string or a list of token ids", param)
		}
		if err != nil {
			return nil, err
		}
		prompts[i] = p
	}
	return prompts, nil
}

var errNotPrompt = errors.New("not a prompt")

// promptTokens reads one prompt: a string or a list of token ids
// (errNotPrompt if raw is neither).
func (s *Server) promptTokens(raw json.RawMessage, param string) ([]int32, error) {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		if text == "" {
			return nil, badParam(param, "%s is empty", param)
		}
		return s.m.Encode(text), nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return s.tokenIDs(ids, param)
	}
	return nil, errNotPrompt
}

func (s *Server) tokenIDs(ids []int64, param string) ([]int32, error) {
	if len(ids) == 0 {
		return nil, badParam(param, "%s is empty", param)
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id >= int64(s.m.VocabSize()) {
			return nil, badParam(param, "%s[%d] = %d, outside the vocabulary 0..%d", param, i, id, s.m.VocabSize()-1)
		}
		out[i] = int32(id)
	}
	return out, nil
}

// contentText reads a message's content: a string, null, or a list of
// text parts.
func contentText(raw json.RawMessage, param string) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	return partsText(raw, param, "text")
}

// partsText reads a string, or a list of parts of the given text types
// ({"type", "text"}), as one text.
func partsText(raw json.RawMessage, param string, types ...string) (string, error) {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return text, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badParam(param, "%s must be a string or a list of text parts", param)
	}
	var b strings.Builder
	for i, p := range parts {
		if !slices.Contains(types, p.Type) || p.Text == nil {
			return "", badParam(fmt.Sprintf("%s[%d].type", param, i), "%s[%d].type = %q; k3 serves text parts only (%s)", param, i, p.Type, strings.Join(types, ", "))
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// sampling validates the fields chat and completions share and fills in
// the job's options.
func (s *Server) sampling(req *sampling, j *job) error {
	if req.Model != "" && req.Model != s.cfg.Name {
		return &apiError{status: 404, typ: "invalid_request_error", param: "model", code: "model_not_found",
			msg: fmt.Sprintf("the model %q does not exist (this server has %q)", req.Model, s.cfg.Name)}
	}
	switch {
	case !j.chat && len(req.Tools) > 0 && string(req.Tools) != "null" && string(req.Tools) != "[]":
		return badParam("tools", "tools are served on /v1/chat/completions only")
	case len(req.Functions) > 0 && string(req.Functions) != "null":
		return badParam("functions", "functions (the deprecated form of tools) is not served by k3; use tools")
	case req.ResponseFormat != nil && req.ResponseFormat.Type != "" && req.ResponseFormat.Type != "text" && req.ResponseFormat.Type != "json_object" && req.ResponseFormat.Type != "json_schema":
		return badParam("response_format", "response_format.type = %q, want \"text\", \"json_object\" or \"json_schema\"", req.ResponseFormat.Type)
	case req.StreamOptions != nil && !req.Stream:
		return badParam("stream_options", "stream_options needs stream = true")
	}
	j.stream = req.Stream
	j.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage

	for i, p := range j.prompts {
		// A prompt of several is named by its index.
		param, what := "messages", "the prompt"
		if !j.chat {
			param = "prompt"
			if len(j.prompts) > 1 {
				param = fmt.Sprintf("prompt[%d]", i)
				what = param
			}
		}
		room := s.m.ContextLength() - len(p)
		// An echoing completion may ask for no tokens: it scores its prompt.
		scoreOnly := j.echo && (req.MaxTokens != nil && *req.MaxTokens == 0 || req.MaxCompletionTokens != nil && *req.MaxCompletionTokens == 0)
		switch {
		case room < 0 || room == 0 && !scoreOnly:
			return badParam(param, "%s has %d tokens; the model's context holds %d, leaving no room to generate", what, len(p), s.m.ContextLength())
		case scoreOnly:
			j.maxTokens = append(j.maxTokens, 0)
			continue
		}
		maxTokens := min(s.cfg.MaxTokens, room)
		for _, f := range []struct {
			name string
			v    *int
		}{{"max_tokens", req.MaxTokens}, {"max_completion_tokens", req.MaxCompletionTokens}} {
			if f.v == nil {
				continue
			}
			switch {
			case *f.v < 1:
				return badParam(f.name, "%s = %d, want >= 1", f.name, *f.v)
			case *f.v > s.cfg.MaxTokens:
				return badParam(f.name, "%s = %d, past this server's limit of %d", f.name, *f.v, s.cfg.MaxTokens)
			case *f.v > room:
				return badParam(f.name, "%s = %d, but %s's %d tokens leave room for %d in the model's context of %d",
					f.name, *f.v, what, len(p), room, s.m.ContextLength())
			}
			maxTokens = *f.v // max_completion_tokens, the newer name, wins
		}
		j.maxTokens = append(j.maxTokens, maxTokens)
	}

	j.n = 1
	if req.N != nil {
		if *req.N < 1 || *req.N > s.cfg.MaxN {
			return badParam("n", "n = %d, want in 1..%d", *req.N, s.cfg.MaxN)
		}
		j.n = *req.N
	}
	if most := s.cfg.MaxSequences + s.cfg.MaxQueue; j.choices() > most {
		if len(j.prompts) == 1 {
			return badParam("n", "n = %d makes %d sequences; this server decodes and queues at most %d at once", j.n, j.n, most)
		}
		return badParam("prompt", "%d prompts with n = %d make %d sequences; this server decodes and queues at most %d at once",
			len(j.prompts), j.n, j.choices(), most)
	}

	// OpenAI's defaults: temperature 1, top_p 1, and a different draw per
	// request unless a seed is given.
	temp := 1.0
	if req.Temperature != nil {
		temp = *req.Temperature
		if !(temp >= 0 && temp <= 2) {
			return badParam("temperature", "temperature = %v, want in 0..2", temp)
		}
	}
	j.opts = append(j.opts, k3.WithTemperature(float32(temp)))
	if req.TopP != nil {
		if !(*req.TopP > 0 && *req.TopP <= 1) {
			return badParam("top_p", "top_p = %v, want in (0, 1]", *req.TopP)
		}
		j.opts = append(j.opts, k3.WithTopP(float32(*req.TopP)))
	}
	if req.TopK != nil {
		if *req.TopK < -1 {
			return badParam("top_k", "top_k = %d, want >= 0 (or -1: all tokens)", *req.TopK)
		}
		j.opts = append(j.opts, k3.WithTopK(max(*req.TopK, 0)))
	}
	if req.MinP != nil {
		if !(*req.MinP >= 0 && *req.MinP <= 1) {
			return badParam("min_p", "min_p = %v, want in 0..1", *req.MinP)
		}
		j.opts = append(j.opts, k3.WithMinP(float32(*req.MinP)))
	}
	for _, f := range []struct {
		name string
		v    *float64
		opt  func(float32) k3.GenerateOption
	}{{"presence_penalty", req.PresencePenalty, k3.WithPresencePenalty}, {"frequency_penalty", req.FrequencyPenalty, k3.WithFrequencyPenalty}} {
		if f.v == nil {
			continue
		}
		if !(*f.v >= -2 && *f.v <= 2) {
			return badParam(f.name, "%s = %v, want in -2..2", f.name, *f.v)
		}
		j.opts = append(j.opts, f.opt(float32(*f.v)))
	}
	if len(req.LogitBias) > 0 {
		bias := make(map[int32]float32, len(req.LogitBias))
		for key, v := range req.LogitBias {
			id, err := strconv.ParseInt(key, 10, 32)
			if err != nil || id < 0 || id >= int64(s.m.VocabSize()) {
				return badParam("logit_bias", "logit_bias key %q is not a token id in 0..%d", key, s.m.VocabSize()-1)
			}
			if !(v >= -100 && v <= 100) {
				return badParam("logit_bias", "logit_bias[%s] = %v, want in -100..100", key, v)
			}
			bias[int32(id)] = float32(v)
		}
		j.opts = append(j.opts, k3.WithLogitBias(bias))
	}
	stops, err := stopStrings(req.Stop)
	if err != nil {
		return err
	}
	if len(stops) > 0 {
		j.opts = append(j.opts, k3.WithStopStrings(stops...))
	}
	if j.logprobs {
		j.opts = append(j.opts, k3.WithLogprobs(j.top))
	}
	if req.IgnoreEOS {
		j.opts = append(j.opts, k3.WithoutDefaultStops())
	}
	if req.ResponseFormat != nil && req.ResponseFormat.Type == "json_object" {
		j.opts = append(j.opts, k3.WithJSONObject())
	}
	if req.ResponseFormat != nil && req.ResponseFormat.Type == "json_schema" {
		js := req.ResponseFormat.JSONSchema
		if js == nil || len(js.Schema) == 0 || string(js.Schema) == "null" {
			return badParam("response_format.json_schema.schema", "response_format json_schema needs response_format.json_schema.schema")
		}
		schema, err := s.schemas.compile(js.Schema)
		if err != nil {
			return badParam("response_format.json_schema.schema", "response_format.json_schema.schema: %s", strings.TrimPrefix(err.Error(), k3.ErrInvalidOption.Error()+": "))
		}
		j.opts = append(j.opts, k3.WithJSONSchema(schema))
	}
	if s.cfg.Speculation != nil {
		j.opts = append(j.opts, s.cfg.Speculation)
	}
	// With a seed each prompt draws as it would alone; without, each
	// draws its own.
	for range j.prompts {
		seed := rand.Uint64()
		if req.Seed != nil {
			seed = uint64(*req.Seed)
		}
		j.seeds = append(j.seeds, seed)
	}
	return nil
}

// maxStops is how many stop strings a request may give (OpenAI allows 4).
const maxStops = 16

func stopStrings(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		raw, _ = json.Marshal([]string{one})
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badParam("stop", "stop must be a string or a list of strings")
	}
	if len(list) > maxStops {
		return nil, badParam("stop", "stop holds %d strings, at most %d", len(list), maxStops)
	}
	for i, s := range list {
		if s == "" {
			return nil, badParam("stop", "stop[%d] is empty", i)
		}
		if !utf8.ValidString(s) {
			return nil, badParam("stop", "stop[%d] is not valid UTF-8", i)
		}
	}
	return list, nil
}

// decodeError turns a JSON decoding failure into a 400 (or 413) naming the
// field.
func decodeError(err error) *apiError {
	var tooBig *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	var syntax *json.SyntaxError
	switch {
	case errors.As(err, &tooBig):
		return &apiError{status: 413, typ: "invalid_request_error", msg: fmt.Sprintf("request body larger than %d bytes", tooBig.Limit)}
	case errors.As(err, &typeErr):
		// Fields of the embedded sampling struct are named by their path.
		field := strings.TrimPrefix(typeErr.Field, "sampling.")
		if field == "" {
			field = "body"
		}
		return badParam(field, "%s: got a JSON %s, want %s", field, typeErr.Value, jsonType(typeErr.Type.Kind().String()))
	case errors.As(err, &syntax):
		return badParam("", "request body is not valid JSON: %v (at byte %d)", err, syntax.Offset)
	}
	return badParam("", "request body: %v", err)
}

func jsonType(kind string) string {
	switch {
	case strings.HasPrefix(kind, "int"), strings.HasPrefix(kind, "uint"):
		return "an integer"
	case strings.HasPrefix(kind, "float"):
		return "a number"
	case kind == "bool":
		return "true or false"
	case kind == "string":
		return "a string"
	case kind == "slice":
		return "a list"
	case kind == "map", kind == "struct", kind == "ptr":
		return "an object"
	}
	return kind
}
