package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/pkg/route"
	"github.com/zeebo/xxh3"
)

// Token sources, as route.Tokens.Source reports them.
const (
	SourcePassthrough = "passthrough"
	SourceRemote      = "remote"
	SourceRender      = "render"
	SourceLocal       = "local"
	SourceApproximate = "approximate"
)

// ErrNotTokenIDs: a passthrough model got a prompt that is not token ids.
var ErrNotTokenIDs = errors.New("tokenize: passthrough model needs token ids")

// approximate cuts a request's text into fixed byte blocks, one pseudo token
// per block. Equal prefixes give equal pseudo tokens, which is all prefix
// affinity needs; the ids mean nothing to an engine, so Exact is false.
type approximate struct {
	bytesPerToken int
	maxInputBytes int
}

// approxText is the text approximate tokens are cut from: the prompt, or for
// a chat request the tools and each message's role and content, separated
// so that message boundaries cannot alias.
func approxText(in route.TokenizeInput) (string, error) {
	if !in.Chat {
		return in.Prompt, nil
	}
	var b strings.Builder
	if len(in.Tools) > 0 && string(in.Tools) != "null" {
		var compact bytes.Buffer
		if err := json.Compact(&compact, in.Tools); err != nil {
			return "", fmt.Errorf("%w: tools: %w", ErrBadMessages, err)
		}
		b.WriteString("\x00tools\x00")
		b.Write(compact.Bytes())
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(in.Messages, &msgs); err != nil {
		return "", fmt.Errorf("%w: messages: %w", ErrBadMessages, err)
	}
	for _, m := range msgs {
		b.WriteString("\x00")
		b.WriteString(m.Role)
		b.WriteString("\x00")
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			b.WriteString(s)
		} else {
			b.Write(m.Content)
		}
	}
	return b.String(), nil
}

func (a *approximate) tokenize(in route.TokenizeInput) (route.Tokens, error) {
	text, err := approxText(in)
	if err != nil {
		return route.Tokens{}, err
	}
	if len(text) > a.maxInputBytes {
		return route.Tokens{}, fmt.Errorf("%w: %d bytes > %d", ErrInputTooLarge, len(text), a.maxInputBytes)
	}
	return route.Tokens{IDs: approxIDs(text, a.bytesPerToken), Source: SourceApproximate, Exact: false}, nil
}

// approxIDs hashes each block of n bytes (the last one may be shorter) to a
// 32-bit pseudo token.
func approxIDs(text string, n int) []uint32 {
	ids := make([]uint32, 0, (len(text)+n-1)/n)
	for i := 0; i < len(text); i += n {
		end := min(i+n, len(text))
		ids = append(ids, uint32(xxh3.HashString(text[i:end])))
	}
	return ids
}

// passthroughIDs reads a completion prompt written as a JSON array of token
// ids.
func passthroughIDs(in route.TokenizeInput) (route.Tokens, error) {
	p := strings.TrimSpace(in.Prompt)
	if in.Chat || !strings.HasPrefix(p, "[") {
		return route.Tokens{}, ErrNotTokenIDs
	}
	var ids []uint32
	if err := json.Unmarshal([]byte(p), &ids); err != nil {
		return route.Tokens{}, fmt.Errorf("%w: %w", ErrNotTokenIDs, err)
	}
	return route.Tokens{IDs: ids, Source: SourcePassthrough, Exact: true}, nil
}
