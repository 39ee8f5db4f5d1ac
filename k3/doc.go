// Package k3 is the SDK entry point: it loads a Kimi Linear, Kimi K3 or
// K3.1 Pro checkpoint and generates text.
//
// It owns model assembly (the layer pattern from the config, AttnRes, MoE,
// the final norm and lm_head), sessions (one sequence's caches), sampling,
// streaming generation, batching and the tokenizer.
//
// Status: the model assembly is not implemented yet. The configuration
// types are available now.
package k3

import "k3/internal/config"

// Config is a parsed and validated model configuration (config.json).
type Config = config.Config

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (*Config, error) { return config.Load(dir) }

// ErrInvalidConfig is wrapped by configuration validation errors.
var ErrInvalidConfig = config.ErrInvalid
