package tokenize

import (
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Kind selects how a model's prompts are tokenized.
type Kind string

// Tokenizer kinds.
const (
	// KindPassthrough: prompts already are token ids (a completion prompt
	// given as a JSON array of ints); anything else fails (or falls back).
	KindPassthrough Kind = "passthrough"
	// KindRemote: the replica's own POST /tokenize.
	KindRemote Kind = "remote"
	// KindLocal: a HuggingFace tokenizer.json and the chat template of
	// tokenizer_config.json, in process.
	KindLocal Kind = "local"
	// KindApproximate: fixed byte blocks, no tokenizer; never exact.
	KindApproximate Kind = "approximate"
	// KindRender: vLLM's render endpoints (0.33 and later: POST
	// /v1/chat/completions/render and its siblings for completions,
	// Responses and Messages), given the request's own body: the engine's
	// rendering and tokenization, exact for every request vLLM accepts,
	// whatever its template or API. Asked of the render servers RenderURLs
	// names (`vllm launch render`, no GPU), else of the model's replicas
	// (which serve the endpoints when started with --enable-scale-out).
	KindRender Kind = "render"
	// KindAuto: local when the model's tokenizer files can be found
	// (Config.SearchDirs, then the HuggingFace hub cache: see
	// FindTokenizerFiles), remote otherwise. Found files load in the
	// background; the model is served remotely until they are loaded.
	KindAuto Kind = "auto"
)

// Engines a model's tokenizer renders for (ModelConfig.Engine).
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
)

// Fallback says what a failed tokenization turns into.
type Fallback string

// Fallbacks.
const (
	// FallbackApproximate answers with approximate tokens (Exact false:
	// the router uses them for approximate affinity only).
	FallbackApproximate Fallback = "approximate"
	// FallbackNone returns the error (the router routes on load only).
	FallbackNone Fallback = "none"
)

// Defaults.
const (
	DefaultCacheSize        = 4096
	DefaultMaxInputBytes    = 32 << 20
	DefaultBytesPerToken    = 4
	DefaultBreakerFailures  = 5
	DefaultBreakerOpenFor   = 5 * time.Second
	DefaultPrefixCacheBytes = 64 << 20
)

// Config selects a tokenizer per model.
type Config struct {
	// Models maps a served model name to its tokenizer.
	Models map[string]ModelConfig `yaml:"models"`
	// Default, when set, serves models not listed in Models (a remote or
	// approximate tokenizer; a local one needs per-model files).
	Default *ModelConfig `yaml:"default"`
	// SelfCheck compares a sample of local tokenizations with the engine's
	// /tokenize and demotes a local tokenizer that disagrees.
	SelfCheck SelfCheckConfig `yaml:"self_check"`
	// SearchDirs are where the auto kind looks for a model's tokenizer
	// files before the HuggingFace hub cache (FindTokenizerFiles).
	SearchDirs []string `yaml:"search_dirs"`
}

// ModelConfig is one model's tokenizer.
type ModelConfig struct {
	Kind Kind `yaml:"kind"`
	// TokenizerJSON and TokenizerConfig are the local tokenizer's
	// tokenizer.json and tokenizer_config.json (the latter only for chat).
	TokenizerJSON   string `yaml:"tokenizer_json"`
	TokenizerConfig string `yaml:"tokenizer_config"`
	// Timeout, when set, is a fixed bound on one remote tokenization, all
	// candidates included. Unset (the default), the bound adapts to the
	// latencies measured: DeadlineMultiplier × the recent 95th percentile
	// of inputs of the same size, within [TimeoutMin, TimeoutMax]
	// (defaults 250ms and 1s; TimeoutMax until enough calls were timed).
	Timeout    time.Duration `yaml:"timeout"`
	TimeoutMin time.Duration `yaml:"timeout_min"`
	TimeoutMax time.Duration `yaml:"timeout_max"`
	// Fallback on failure: approximate (default) or none.
	Fallback Fallback `yaml:"fallback"`
	// CacheSize is the remote tokenizer's LRU size in entries (default
	// 4096; negative disables).
	CacheSize int `yaml:"cache_size"`
	// PrefixCacheBytes bounds each of the local tokenizer's multi-turn
	// caches, the chunk cache and the conversation memo (default 64 MiB;
	// negative disables both).
	PrefixCacheBytes int `yaml:"prefix_cache_bytes"`
	// MaxInputBytes rejects larger prompts (rendered chat included) with
	// ErrInputTooLarge (default 32 MiB).
	MaxInputBytes int `yaml:"max_input_bytes"`
	// BytesPerToken is the approximate tokenizer's block size (default 4).
	BytesPerToken int `yaml:"bytes_per_token"`
	// BreakerFailures consecutive remote failures open a replica's breaker
	// for BreakerOpenFor (defaults 5 and 5s); then one probe is let through.
	BreakerFailures int           `yaml:"breaker_failures"`
	BreakerOpenFor  time.Duration `yaml:"breaker_open_for"`
	// Engine is the engine serving the model: "vllm" (the default) or
	// "sglang". SGLang renders chats otherwise than vLLM (tools dumped
	// whole, text parts joined by a space, tools filtered by tool_choice,
	// developer messages kept, reasoning_effort also setting thinking), and
	// the local renderer renders vLLM's way: with sglang, an auto model
	// tokenizes chats through the replicas' /tokenize (SGLang's own chat
	// pipeline) and only text prompts locally, and the remote tokenizer
	// asks /tokenize as SGLang's chat route would render the request
	// (tool_choice and reasoning_effort as fields, no
	// add_generation_prompt).
	Engine string `yaml:"engine"`
	// RenderURLs are the render servers a render tokenizer asks, in order
	// (base URLs, e.g. http://vllm-render:8000); empty, it asks the
	// model's replicas as the remote tokenizer does.
	RenderURLs []string `yaml:"render_urls"`
	// EngineChat is what the model's engines were started with that
	// changes their chat rendering (chat_template,
	// chat_template_content_format, default_chat_template_kwargs), for the
	// local tokenizer to render as they do.
	EngineChat `yaml:",inline"`
}

// withDefaults fills zero fields.
func (c ModelConfig) withDefaults() ModelConfig {
	if c.TimeoutMin == 0 {
		c.TimeoutMin = DefaultTimeoutMin
	}
	if c.TimeoutMax == 0 {
		c.TimeoutMax = DefaultTimeoutMax
	}
	if c.Fallback == "" {
		c.Fallback = FallbackApproximate
	}
	if c.CacheSize == 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.PrefixCacheBytes == 0 {
		c.PrefixCacheBytes = DefaultPrefixCacheBytes
	}
	if c.MaxInputBytes == 0 {
		c.MaxInputBytes = DefaultMaxInputBytes
	}
	if c.BytesPerToken == 0 {
		c.BytesPerToken = DefaultBytesPerToken
	}
	if c.BreakerFailures == 0 {
		c.BreakerFailures = DefaultBreakerFailures
	}
	if c.BreakerOpenFor == 0 {
		c.BreakerOpenFor = DefaultBreakerOpenFor
	}
	return c
}

// Validate reports the first problem of a model's configuration (after
// defaults).
func (c ModelConfig) Validate() error {
	switch c.Kind {
	case KindPassthrough, KindRemote, KindApproximate, KindAuto, KindRender:
	case KindLocal:
		if c.TokenizerJSON == "" {
			return errors.New("local tokenizer needs tokenizer_json")
		}
	case "":
		return errors.New("kind is required (auto, passthrough, remote, render, local or approximate)")
	default:
		return fmt.Errorf("unknown kind %q (want auto, passthrough, remote, render, local or approximate)", c.Kind)
	}
	switch c.Engine {
	case "", EngineVLLM, EngineSGLang:
	default:
		return fmt.Errorf("engine %q: want vllm or sglang", c.Engine)
	}
	if c.Engine == EngineSGLang && c.Kind == KindRender {
		return errors.New("kind render is vLLM's render endpoints; an sglang model wants kind remote or auto")
	}
	if len(c.RenderURLs) > 0 && c.Kind != KindRender {
		return fmt.Errorf("render_urls is for kind render, not %s", c.Kind)
	}
	for i, u := range c.RenderURLs {
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("render_urls[%d] %q: want an http or https base URL", i, u)
		}
	}
	switch c.Fallback {
	case FallbackApproximate, FallbackNone:
	default:
		return fmt.Errorf("unknown fallback %q (want approximate or none)", c.Fallback)
	}
	switch {
	case c.Timeout < 0 || c.TimeoutMin < 0 || c.TimeoutMax < 0:
		return errors.New("timeout, timeout_min and timeout_max must be positive")
	case c.TimeoutMin > c.TimeoutMax:
		return errors.New("timeout_min must not exceed timeout_max")
	case c.MaxInputBytes < 0:
		return errors.New("max_input_bytes must be positive")
	case c.BytesPerToken < 1 || c.BytesPerToken > 64:
		return errors.New("bytes_per_token must be in [1, 64]")
	case c.BreakerFailures < 0 || c.BreakerOpenFor < 0:
		return errors.New("breaker settings must be positive")
	}
	return c.EngineChat.Validate()
}

// Validate checks every model's configuration.
func (c Config) Validate() error {
	if len(c.Models) == 0 && c.Default == nil {
		return errors.New("tokenize: no models configured")
	}
	for name, m := range c.Models {
		if name == "" {
			return errors.New("tokenize: empty model name")
		}
		if err := m.withDefaults().Validate(); err != nil {
			return fmt.Errorf("tokenize: model %q: %w", name, err)
		}
	}
	for i, d := range c.SearchDirs {
		if d == "" {
			return fmt.Errorf("tokenize: search_dirs[%d]: empty path", i)
		}
	}
	if err := c.SelfCheck.WithDefaults().Validate(); err != nil {
		return prefixErrors("tokenize: self_check.", err)
	}
	if c.Default != nil {
		if c.Default.Kind == KindLocal {
			return errors.New("tokenize: default: a local tokenizer must be configured per model")
		}
		if err := c.Default.withDefaults().Validate(); err != nil {
			return fmt.Errorf("tokenize: default: %w", err)
		}
	}
	return nil
}

// prefixErrors prefixes each error joined in err.
func prefixErrors(prefix string, err error) error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return fmt.Errorf("%s%w", prefix, err)
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, fmt.Errorf("%s%w", prefix, e))
	}
	return errors.Join(out...)
}
