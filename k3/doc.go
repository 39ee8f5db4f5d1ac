// Package k3 is the SDK entry point: it loads a Kimi Linear, Kimi K3 or
// K3.1 Pro checkpoint and generates text.
//
// It owns model assembly (the layer pattern from the config, AttnRes, MoE,
// the final norm and lm_head), sessions (one sequence's caches), sampling,
// streaming generation, batching and the tokenizer.
//
// A program loads a Model once (Load, LoadFS, or LoadTiny for the embedded
// model trained on Go source), then runs one Session per conversation: Generate
// streams tokens as an iter.Seq2, Forward returns logits. Sessions can be
// cloned and truncated. Batch steps many sessions in one pass over the
// weights, with each session's results equal to decoding it alone, and
// Batcher serves concurrent Generate calls with continuous batching,
// prefilling prompts in chunks between the running streams' tokens.
// WithPrefixCache lets new sessions resume from the state of prompts run
// before (a chat's earlier turns, a shared system prompt).
// WithJSONObject, WithJSONSchema and WithToolCalls hold a generation to
// one JSON object, to a value of a JSON Schema (CompileJSONSchema) or to
// a Kimi tool calls section (its arguments to each function's schema
// with WithToolArguments) by masking each draw; WithOptionalToolCalls
// lets the model write text first and holds a section once it begins. A
// Sampler applies the generation options to logits a program drives
// itself.
//
// WithSpeculation and WithAdaptiveSpeculation make a generation draft
// tokens and verify them in one pass, its tokens those of plain decoding
// (WithRejectionSampling: distributed as plain sampling's): with
// specdec.NGram, the checkpoint's DSpark module (Model.NewDSpark),
// the model's own first layers (NewSelfDraft) or a smaller model
// (NewDraftModel); WithRollback makes a rejected draft's rollback a
// cursor move. Session.Save and Model.LoadSession keep a session in a
// file. LoadGroup splits a model over ranks (tensor, expert and context
// parallel), whose GroupSession runs a sequence on all of them and whose
// GroupBatcher (Group.NewBatcher) batches many such sequences.
//
// Close waits for running passes; afterwards every call fails with
// ErrClosed. Errors name the problem and wrap sentinels (ErrBadToken,
// ErrContextFull, ErrEmptyPrompt, ErrInvalidOption, ErrLayoutMismatch,
// ErrInvalidConfig, ErrCheckpoint, ErrOutOfRange, ErrClosed,
// ErrSessionClosed, ErrSessionFile, ErrMemoryBudget, ErrNoPrefixCache,
// ErrBatcherClosed, ErrBatcherNotRunning) for errors.Is; bad input leaves
// the model and the session usable.
package k3

import "k3/config"

// Config is a parsed and validated model configuration (config.json): an
// alias of config.Config, whose fields "go doc k3/config.Config" lists.
type Config = config.Config

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (*Config, error) { return config.Load(dir) }

// ErrInvalidConfig is wrapped by configuration validation errors.
var ErrInvalidConfig = config.ErrInvalid
