package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/route"
	"github.com/zeebo/xxh3"
)

// Remote tokenizer errors.
var (
	// ErrNoEndpoint: the replica list for the model is empty.
	ErrNoEndpoint = errors.New("tokenize: no replica to ask")
	// ErrBreakerOpen: every candidate replica's breaker is open.
	ErrBreakerOpen = errors.New("tokenize: circuit breaker open")
	// ErrRemote: a replica (or render server) answered /tokenize (or a
	// render endpoint) with an error or garbage.
	ErrRemote = errors.New("tokenize: remote tokenization failed")
)

// maxRemoteResponse bounds a /tokenize response body (a few bytes per id).
const maxRemoteResponse = 256 << 20

// remote asks a replica's POST /tokenize (vLLM's shape) for the ids, or,
// render set, the render endpoint of the request's API (KindRender).
type remote struct {
	model  string
	cfg    ModelConfig
	render bool
	// effortMap is cfg's --reasoning-effort-map, parsed (validated with
	// the configuration).
	effortMap map[string]string
	client    *http.Client
	replicas  func(model string) []string
	cache     *idsCache
	breakers  *breakers
	now       func() time.Time
	hits      func()
	// deadlines is the per-call deadline (fixed or learned); flights
	// coalesces identical in-flight calls (coalesced counts the waiters).
	deadlines *deadlines
	flights   flights
	coalesced func()
}

type tokenizeRequest struct {
	Model               string          `json:"model,omitempty"`
	Prompt              *string         `json:"prompt,omitempty"`
	Messages            json.RawMessage `json:"messages,omitempty"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt,omitempty"`
	ContinueFinal       bool            `json:"continue_final_message,omitempty"`
	AddSpecialTokens    bool            `json:"add_special_tokens"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs,omitempty"`
	Tools               json.RawMessage `json:"tools,omitempty"`
	// SGLang's /tokenize reads these as its chat route does.
	ToolChoice      json.RawMessage `json:"tool_choice,omitempty"`
	ReasoningEffort string          `json:"reasoning_effort,omitempty"`
}

type tokenizeResponse struct {
	Count  int      `json:"count"`
	Tokens []uint32 `json:"tokens"`
}

func (r *remote) body(in route.TokenizeInput) ([]byte, error) {
	req := tokenizeRequest{Model: r.model, AddSpecialTokens: in.AddSpecialTokens}
	if in.ThinkingDisabled {
		// The effort vLLM's Messages route picks depends on the engine's
		// template, which /tokenize does not apply for it.
		return nil, fmt.Errorf("%w: an Anthropic Messages request with thinking disabled", ErrUnsupported)
	}
	switch {
	case !in.Chat:
		p := in.Prompt
		req.Prompt = &p
		return marshalTokenize(req)
	case len(in.Tools) > 0 && string(in.Tools) != "null" && !(r.cfg.ExcludeToolsWhenNone && noToolChoice(in.ToolChoice)):
		// (vLLM's /tokenize takes no tool_choice: a request the engine
		// renders without its tools is sent without them.)
		req.Tools = in.Tools
	}
	req.Messages, req.ContinueFinal = in.Messages, in.ContinueFinalMessage
	if len(in.ChatTemplateKwargs) > 0 && string(in.ChatTemplateKwargs) != "null" {
		req.ChatTemplateKwargs = in.ChatTemplateKwargs
	}
	if r.cfg.Engine == EngineSGLang {
		// SGLang's /tokenize renders the request as its chat route does
		// when add_generation_prompt is left out (the chat route always
		// adds it and turns a trailing assistant message into a user one),
		// and reads tool_choice and reasoning_effort as the chat route
		// does.
		if len(in.ToolChoice) > 0 && string(in.ToolChoice) != "null" {
			req.ToolChoice = in.ToolChoice
		}
		req.ReasoningEffort = in.ReasoningEffort
		return marshalTokenize(req)
	}
	agp := in.AddGenerationPrompt
	req.AddGenerationPrompt = &agp
	if in.ReasoningEffort != "" {
		// vLLM's /tokenize takes no reasoning_effort: the arguments carry
		// it as the chat route merges it.
		kw, err := withEffort(req.ChatTemplateKwargs, mapEffort(in.ReasoningEffort, r.effortMap))
		if err != nil {
			return nil, err
		}
		req.ChatTemplateKwargs = kw
	}
	return marshalTokenize(req)
}

// marshalTokenize encodes a /tokenize request body.
func marshalTokenize(req tokenizeRequest) ([]byte, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadMessages, err)
	}
	return b, nil
}

// request is the path and body of in's call: /tokenize and its body, or
// the render endpoint of in's API and the request's own body.
func (r *remote) request(in route.TokenizeInput) (path string, body []byte, err error) {
	if !r.render {
		body, err = r.body(in)
		return "/tokenize", body, err
	}
	if len(in.Body) == 0 || in.API == "" {
		return "", nil, fmt.Errorf("%w: no request body to render", ErrUnsupported)
	}
	return in.API + "/render", in.Body, nil
}

// endpoint names what r asks, for messages.
func (r *remote) endpoint() string {
	if r.render {
		return "the engine's render endpoint"
	}
	return "the engine's /tokenize"
}

// source names the answers' origin (route.Tokens.Source).
func (r *remote) source() string {
	if r.render {
		return SourceRender
	}
	return SourceRemote
}

// kind is the tokenizer kind r serves (metrics and fallbacks name it).
func (r *remote) kind() Kind {
	if r.render {
		return KindRender
	}
	return KindRemote
}

func (r *remote) tokenize(ctx context.Context, in route.TokenizeInput) (route.Tokens, error) {
	path, body, err := r.request(in)
	if err != nil {
		return route.Tokens{}, err
	}
	if len(body) > r.cfg.MaxInputBytes {
		return route.Tokens{}, fmt.Errorf("%w: %d bytes > %d", ErrInputTooLarge, len(body), r.cfg.MaxInputBytes)
	}
	var h xxh3.Hasher
	_, _ = h.WriteString(path)
	_, _ = h.Write([]byte{0})
	_, _ = h.Write(body)
	key := h.Sum128()
	if r.cache != nil {
		if ids, ok := r.cache.get(key); ok {
			r.hits()
			return route.Tokens{IDs: ids[:len(ids):len(ids)], Source: r.source(), Exact: true}, nil
		}
	}
	fl, leader := r.flights.join(key)
	if !leader {
		// The same input is being asked already: wait for that answer.
		r.coalesced()
		select {
		case <-fl.done:
			if fl.err != nil {
				return route.Tokens{}, fl.err
			}
			return route.Tokens{IDs: fl.ids[:len(fl.ids):len(fl.ids)], Source: r.source(), Exact: true}, nil
		case <-ctx.Done():
			return route.Tokens{}, ctx.Err()
		}
	}
	// The leader's call serves its waiters too, so it does not end with
	// the leader's own request while anyone waits for it: when the
	// leader's context ends with no waiter, the flight is retired (nobody
	// can join it any more) and the call cancelled; otherwise only its
	// deadline bounds it.
	callCtx, cancelCall := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		if r.flights.abandon(key, fl) {
			cancelCall()
		}
	})
	ids, err := r.callReplicas(callCtx, path, body)
	stop()
	cancelCall()
	r.flights.land(key, fl, ids, err)
	if err != nil {
		return route.Tokens{}, err
	}
	if r.cache != nil {
		r.cache.put(key, ids)
	}
	return route.Tokens{IDs: ids[:len(ids):len(ids)], Source: r.source(), Exact: true}, nil
}

// callReplicas asks the candidate replicas (or render servers) in order
// until one answers, within one deadline for all of them, and feeds the
// deadline estimate.
func (r *remote) callReplicas(ctx context.Context, path string, body []byte) ([]uint32, error) {
	limit := r.deadlines.deadline(len(body))
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	urls := r.replicas(r.model)
	if len(urls) == 0 {
		return nil, ErrNoEndpoint
	}
	start := time.Now()
	var errs []error
	tried := 0
	for _, base := range urls {
		if ctx.Err() != nil {
			break
		}
		if !r.breakers.allow(base) {
			continue
		}
		tried++
		ids, err := r.call(ctx, base, path, body)
		var refused *refusedError
		if errors.As(err, &refused) {
			// The server is up and refuses this input (a body vLLM
			// validates otherwise, a Responses body continuing a stored
			// response): no other replica would take it, and the breaker,
			// which guards against servers that are down, hears that this
			// one is up.
			r.breakers.record(base, true)
			return nil, err
		}
		r.breakers.record(base, err == nil)
		if err == nil {
			r.deadlines.observe(len(body), time.Since(start))
			return ids, nil
		}
		errs = append(errs, err)
	}
	if tried == 0 {
		return nil, ErrBreakerOpen
	}
	if err := ctx.Err(); err != nil {
		// Timed out: the call took (at least) its deadline.
		r.deadlines.observe(len(body), limit)
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (r *remote) call(ctx context.Context, base, path string, body []byte) ([]uint32, error) {
	url := strings.TrimRight(base, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrRemote, url, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrRemote, url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // keep the connection reusable
		err := fmt.Errorf("%w: %s: status %d: %s", ErrRemote, url, resp.StatusCode, bytes.TrimSpace(msg))
		if refusesInput(resp.StatusCode) {
			return nil, &refusedError{err}
		}
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxRemoteResponse))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: read: %w", ErrRemote, url, err)
	}
	if r.render {
		ids, err := parseRenderResponse(data)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: decode: %w", ErrRemote, url, err)
		}
		return ids, nil
	}
	out, err := parseTokenizeResponse(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: decode: %w", ErrRemote, url, err)
	}
	if out.Tokens == nil || (out.Count != 0 && out.Count != len(out.Tokens)) {
		return nil, fmt.Errorf("%w: %s: response has count %d and %d tokens", ErrRemote, url, out.Count, len(out.Tokens))
	}
	return out.Tokens, nil
}

// breakers keeps one circuit breaker per replica base URL: after failures
// consecutive failures it opens for openFor, then lets one probe through
// (half-open); the probe's outcome closes or reopens it.
type breakers struct {
	failures int
	openFor  time.Duration
	now      func() time.Time
	onChange func(base string, state breakerState)

	mu sync.Mutex
	m  map[string]*breaker
}

type breakerState int

const (
	breakerClosed breakerState = iota
	breakerOpen
	breakerHalfOpen
)

func (s breakerState) String() string {
	return [...]string{"closed", "open", "half_open"}[s]
}

type breaker struct {
	state     breakerState
	fails     int
	openUntil time.Time
	probing   bool
}

// maxBreakers bounds the per-URL map (replica sets churn); closed breakers
// are forgotten first.
const maxBreakers = 4096

func (b *breakers) get(base string) *breaker {
	br, ok := b.m[base]
	if !ok {
		if len(b.m) >= maxBreakers {
			for k, v := range b.m {
				if v.state == breakerClosed {
					delete(b.m, k)
				}
			}
		}
		br = &breaker{}
		b.m[base] = br
	}
	return br
}

func (b *breakers) allow(base string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	br := b.get(base)
	switch br.state {
	case breakerClosed:
		return true
	case breakerOpen:
		if b.now().Before(br.openUntil) {
			return false
		}
		br.state, br.probing = breakerHalfOpen, true
		b.changed(base, breakerHalfOpen)
		return true
	default: // half-open: one probe at a time
		if br.probing {
			return false
		}
		br.probing = true
		return true
	}
}

func (b *breakers) record(base string, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	br := b.get(base)
	br.probing = false
	if ok {
		if br.state != breakerClosed {
			b.changed(base, breakerClosed)
		}
		br.state, br.fails = breakerClosed, 0
		return
	}
	br.fails++
	if br.state == breakerHalfOpen || br.fails >= b.failures {
		if br.state != breakerOpen {
			b.changed(base, breakerOpen)
		}
		br.state, br.openUntil = breakerOpen, b.now().Add(b.openFor)
	}
}

func (b *breakers) changed(base string, s breakerState) {
	if b.onChange != nil {
		b.onChange(base, s)
	}
}

// idsCache is a bounded least-recently-used map from an input hash to
// ids, bounded by its number of entries. It is safe for concurrent use.
type idsCache struct {
	mu  sync.Mutex
	lru *lru[xxh3.Uint128, []uint32] // every entry has size 1
}

func newIDsCache(entries int) *idsCache {
	return &idsCache{lru: newLRU[xxh3.Uint128, []uint32](entries)}
}

func (c *idsCache) get(k xxh3.Uint128) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.get(k)
}

func (c *idsCache) put(k xxh3.Uint128, ids []uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.put(k, ids, 1)
}

// withEffort is a request's template arguments (a JSON object, nil for
// none) with its reasoning effort merged (effortArgs). The order of the
// keys is not kept: the engine reads them into a dict.
func withEffort(kwargs json.RawMessage, effort string) (json.RawMessage, error) {
	kw := map[string]json.RawMessage{}
	if kwargs != nil {
		if err := json.Unmarshal(kwargs, &kw); err != nil || kw == nil {
			return nil, fmt.Errorf("%w: chat_template_kwargs is not an object", ErrBadMessages)
		}
	}
	_, own := kw["enable_thinking"]
	thinking, reasoning := effortArgs(effort, own)
	if thinking != nil {
		kw["enable_thinking"] = json.RawMessage(strconv.FormatBool(*thinking))
	}
	if reasoning != "" {
		b, err := json.Marshal(reasoning)
		if err != nil {
			return nil, err
		}
		kw["reasoning_effort"] = b
	}
	return json.Marshal(kw)
}

// refusesInput reports a status by which a server that is up refuses the
// input itself (400, 404, 413, 422, ...), not a transient or server-side
// failure (408 and 429 are transient; 5xx are the server's).
func refusesInput(status int) bool {
	return status >= 400 && status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests &&
		status != http.StatusUnauthorized && status != http.StatusForbidden
}

// refusedError is a call's error when the server refused the input
// (refusesInput); it wraps the ErrRemote error.
type refusedError struct{ err error }

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }
