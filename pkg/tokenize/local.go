package tokenize

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/pkg/route"
)

// Local tokenizes in process with a model's tokenizer.json and, for chat
// requests, its tokenizer_config.json chat template. Long text chunks are
// remembered (bounded, least recently used out) so that a conversation's
// history, resent every turn, is not re-encoded: see Encoder's chunking
// rule for why the reused ids are exactly the ids full encoding gives. It
// is safe for concurrent use.
type Local struct {
	enc      *Encoder
	tmpl     *ChatTemplate // nil when no tokenizer_config is configured
	maxBytes int
	cache    *chunkCache // nil when disabled
	conv     *convMemo   // nil when disabled (with cache)
	// convMin: chat prompts shorter than this skip the conversation memo
	// (minConvText; tests lower it).
	convMin int
}

// ErrNoChatTemplate: a chat request reached a local tokenizer configured
// without tokenizer_config.json.
var ErrNoChatTemplate = errors.New("tokenize: no chat template configured")

// LoadLocal loads the files mc names (defaults applied by the caller or
// here).
func LoadLocal(mc ModelConfig) (*Local, error) {
	mc = mc.withDefaults()
	enc, err := LoadEncoder(mc.TokenizerJSON)
	if err != nil {
		return nil, err
	}
	l := &Local{enc: enc, maxBytes: mc.MaxInputBytes, convMin: minConvText}
	if mc.TokenizerConfig != "" {
		if l.tmpl, err = LoadEngineChatTemplate(mc.TokenizerConfig, mc.EngineChat); err != nil {
			return nil, err
		}
	}
	if mc.PrefixCacheBytes > 0 {
		l.cache = newChunkCache(mc.PrefixCacheBytes)
		l.conv = newConvMemo(mc.PrefixCacheBytes)
	}
	return l, nil
}

// NewLocal assembles a Local from loaded parts (tmpl may be nil);
// cacheBytes <= 0 disables chunk reuse.
func NewLocal(enc *Encoder, tmpl *ChatTemplate, maxInputBytes, cacheBytes int) *Local {
	l := &Local{enc: enc, tmpl: tmpl, maxBytes: maxInputBytes, convMin: minConvText}
	if l.maxBytes <= 0 {
		l.maxBytes = DefaultMaxInputBytes
	}
	if cacheBytes > 0 {
		l.cache = newChunkCache(cacheBytes)
		l.conv = newConvMemo(cacheBytes)
	}
	return l
}

// Encoder returns the underlying encoder.
func (l *Local) Encoder() *Encoder { return l.enc }

// Tokenize returns the ids the engine computes for in.
func (l *Local) Tokenize(in route.TokenizeInput) (route.Tokens, error) {
	return l.TokenizeContext(context.Background(), in)
}

// TokenizeContext is Tokenize ending early with ctx's error when ctx ends:
// checked before and after rendering the chat template and between the
// segments and chunks of the encoding, so a request whose deadline passed
// stops costing CPU.
func (l *Local) TokenizeContext(ctx context.Context, in route.TokenizeInput) (route.Tokens, error) {
	if err := ctx.Err(); err != nil {
		return route.Tokens{}, err
	}
	text := in.Prompt
	if in.Chat {
		if l.tmpl == nil {
			return route.Tokens{}, ErrNoChatTemplate
		}
		if len(in.Messages) > l.maxBytes {
			return route.Tokens{}, fmt.Errorf("%w: %d bytes of messages > %d", ErrInputTooLarge, len(in.Messages), l.maxBytes)
		}
		var err error
		text, err = l.tmpl.Render(ChatInput{
			Messages: in.Messages, Tools: in.Tools, ChatTemplateKwargs: in.ChatTemplateKwargs,
			AddGenerationPrompt: in.AddGenerationPrompt, ContinueFinalMessage: in.ContinueFinalMessage, Parsed: in.ChatMessages,
			Documents: in.Documents, SystemFirst: in.SystemFirst, ReasoningEffort: in.ReasoningEffort, ThinkingDisabled: in.ThinkingDisabled, ToolChoice: in.ToolChoice,
		})
		if err != nil {
			return route.Tokens{}, err
		}
		if err := ctx.Err(); err != nil {
			return route.Tokens{}, err
		}
	}
	if len(text) > l.maxBytes {
		return route.Tokens{}, fmt.Errorf("%w: %d bytes > %d", ErrInputTooLarge, len(text), l.maxBytes)
	}
	var ids []uint32
	var err error
	if in.Chat && l.conv != nil && len(text) >= l.convMin && (len(in.ChatMessages) > 0 || len(in.Messages) > 0) && (!in.AddSpecialTokens || len(l.enc.post) == 0) {
		ids, err = l.encodeTurn(ctx, in, text)
	} else {
		ids, err = l.enc.appendEncode(ctx, make([]uint32, 0, len(text)/3+4), text, in.AddSpecialTokens, l.cache)
	}
	if err != nil {
		return route.Tokens{}, err
	}
	return route.Tokens{IDs: ids, Source: SourceLocal, Exact: true}, nil
}
