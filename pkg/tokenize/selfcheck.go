package tokenize

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/pkg/route"
)

// Self-check: a local tokenizer claims exactness, and a wrong one (a
// tokenizer file that is not the engine's, a template the engine renders
// differently) would silently zero the hit rate. So a sample of local
// tokenizations is compared, off the request path, with the engine's own
// POST /tokenize (chat requests through the engine's chat rendering), or,
// with endpoint render, with the engine's render endpoint given the
// request's own body (which checks every API, conversion included). The
// first mismatch demotes that model's local tokenizer: its requests go to
// the engine from then on (its /tokenize, or its render endpoints; with the
// model's usual fallback when that fails), the mismatch is counted, logged
// once with the first differing position, and shown by
// Tokenizer.SelfCheckStates and Explain.

// Self-check defaults.
const (
	DefaultSelfCheckSampleRate = 0.01
	DefaultSelfCheckWorkers    = 1
	DefaultSelfCheckQueue      = 64
	DefaultSelfCheckTimeout    = 2 * time.Second
)

// SelfCheckConfig configures the comparison of local tokens with the
// engine's. It applies to every local model when Options.Replicas is set.
type SelfCheckConfig struct {
	// Disabled turns the self-check off (local tokenizers are then
	// trusted unchecked and never demoted).
	Disabled bool `yaml:"disabled"`
	// SampleRate is the fraction of local tokenizations compared, in
	// (0, 1] (default 0.01).
	SampleRate float64 `yaml:"sample_rate"`
	// Workers compare concurrently (default 1); Queue bounds the pending
	// comparisons (default 64): a sample finding it full is dropped, never
	// waited for.
	Workers int `yaml:"workers"`
	Queue   int `yaml:"queue"`
	// Timeout bounds one engine call (default 2s).
	Timeout time.Duration `yaml:"timeout"`
	// Endpoint is what local tokens are compared with: "tokenize" (the
	// default), the replicas' POST /tokenize, or "render", their render
	// endpoints given the request's own body (vLLM 0.33 started with
	// --enable-scale-out), which reproduce every request as the engine
	// serves it: Messages and Responses conversions, documents and empty
	// tools lists included, which /tokenize cannot be asked. A demoted
	// model, and an auto model before its files load, are then served by
	// the same endpoint.
	Endpoint SelfCheckEndpoint `yaml:"endpoint"`
}

// SelfCheckEndpoint is what the self-check compares local tokens with.
type SelfCheckEndpoint string

// Self-check endpoints.
const (
	SelfCheckTokenize SelfCheckEndpoint = "tokenize"
	SelfCheckRender   SelfCheckEndpoint = "render"
)

// WithDefaults fills zero fields.
func (c SelfCheckConfig) WithDefaults() SelfCheckConfig {
	if c.SampleRate == 0 {
		c.SampleRate = DefaultSelfCheckSampleRate
	}
	if c.Workers == 0 {
		c.Workers = DefaultSelfCheckWorkers
	}
	if c.Queue == 0 {
		c.Queue = DefaultSelfCheckQueue
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultSelfCheckTimeout
	}
	if c.Endpoint == "" {
		c.Endpoint = SelfCheckTokenize
	}
	return c
}

// Validate reports every problem, each prefixed with its field.
func (c SelfCheckConfig) Validate() error {
	var errs []error
	if c.SampleRate < 0 || c.SampleRate > 1 {
		errs = append(errs, fmt.Errorf("sample_rate: must be in (0, 1], got %v", c.SampleRate))
	}
	if c.Workers < 0 || c.Workers > 64 {
		errs = append(errs, fmt.Errorf("workers: must be in [1, 64], got %d", c.Workers))
	}
	if c.Queue < 0 {
		errs = append(errs, fmt.Errorf("queue: must be positive, got %d", c.Queue))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout: must be positive, got %v", c.Timeout))
	}
	switch c.Endpoint {
	case "", SelfCheckTokenize, SelfCheckRender:
	default:
		errs = append(errs, fmt.Errorf("endpoint: want tokenize or render, got %q", c.Endpoint))
	}
	return errors.Join(errs...)
}

// checkJob is one sampled local tokenization to compare.
type checkJob struct {
	m   *modelTokenizer
	in  route.TokenizeInput
	ids []uint32
}

// selfChecker owns the comparison workers: started by New, stopped and
// joined by Tokenizer.Close.
type selfChecker struct {
	cfg    SelfCheckConfig
	jobs   chan checkJob
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	t      *Tokenizer
}

func newSelfChecker(t *Tokenizer, cfg SelfCheckConfig) *selfChecker {
	ctx, cancel := context.WithCancel(context.Background())
	c := &selfChecker{cfg: cfg, jobs: make(chan checkJob, cfg.Queue), ctx: ctx, cancel: cancel, t: t}
	for range cfg.Workers {
		c.wg.Add(1)
		go c.work()
	}
	return c
}

func (c *selfChecker) work() {
	defer c.wg.Done()
	for {
		select {
		case <-c.ctx.Done():
			return
		case j := <-c.jobs:
			c.check(j)
		}
	}
}

// stop cancels in-flight checks and waits for the workers.
func (c *selfChecker) stop() {
	c.once.Do(func() {
		c.cancel()
		c.wg.Wait()
	})
}

// reproduces reports whether the engine endpoint the check asks (r)
// tokenizes in as the engine serves it. A render endpoint does for every
// request with a body. vLLM's /tokenize takes no documents and drops an
// empty tools list, which its chat route passes on, and knows nothing of
// the choices its Anthropic Messages route makes per template (inline
// system messages merged, the effort for disabled thinking), so such
// requests are not sampled (a difference there says nothing about the
// local tokenizer). An input with no prompt (a body the router could not
// convert) has nothing to compare.
func reproduces(r *remote, in route.TokenizeInput) bool {
	switch {
	case !in.Chat && in.Prompt == "":
		return false
	case r.render:
		return len(in.Body) > 0 && in.API != ""
	case !in.Chat:
		return true
	}
	return (len(in.Documents) == 0 || string(in.Documents) == "null") && !emptyArray(in.Tools) &&
		in.SystemFirst == nil && !in.ThinkingDisabled
}

// emptyArray reports a JSON array with no elements.
func emptyArray(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) >= 2 && raw[0] == '[' && raw[len(raw)-1] == ']' && len(bytes.TrimSpace(raw[1:len(raw)-1])) == 0
}

// maybeSubmit samples a successful local tokenization. It never blocks:
// a full queue drops the sample (counted).
func (c *selfChecker) maybeSubmit(m *modelTokenizer, in route.TokenizeInput, ids []uint32) {
	if m.check == nil || m.check.demoted.Load() || rand.Float64() >= c.cfg.SampleRate {
		return
	}
	if !reproduces(m.check.engine, in) {
		c.t.metrics.selfChecks.WithLabelValues(m.name, "unreproducible").Inc()
		return
	}
	if c.ctx.Err() != nil {
		return
	}
	// The request's buffers belong to the caller: copy what the check
	// reads (the body for a render endpoint only).
	if m.check.engine.render {
		in.Body = bytes.Clone(in.Body)
	} else {
		in.Body = nil
	}
	in.Messages = bytes.Clone(in.Messages)
	in.Tools = bytes.Clone(in.Tools)
	in.ChatTemplateKwargs = bytes.Clone(in.ChatTemplateKwargs)
	j := checkJob{m: m, in: in, ids: slices.Clone(ids)}
	select {
	case c.jobs <- j:
	default:
		c.t.metrics.selfChecks.WithLabelValues(m.name, "dropped").Inc()
		m.check.dropped.Add(1)
	}
}

func (c *selfChecker) check(j checkJob) {
	st := j.m.check
	toks, err := st.engine.tokenize(c.ctx, j.in)
	if err != nil {
		if c.ctx.Err() != nil {
			return
		}
		c.t.metrics.selfChecks.WithLabelValues(j.m.name, "error").Inc()
		st.errors.Add(1)
		return
	}
	st.checks.Add(1)
	pos := firstDiff(j.ids, toks.IDs)
	if pos < 0 {
		c.t.metrics.selfChecks.WithLabelValues(j.m.name, "match").Inc()
		return
	}
	c.t.metrics.selfChecks.WithLabelValues(j.m.name, "mismatch").Inc()
	st.mismatches.Add(1)
	c.t.demote(j.m, pos, j.ids, toks.IDs, j.in.Chat)
}

// firstDiff returns the first index where a and b differ (the shorter
// length when one is a prefix of the other), or -1 when they are equal.
func firstDiff(a, b []uint32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return n
	}
	return -1
}

// checkState is one local model's self-check record.
type checkState struct {
	engine *remote // the engine's /tokenize or render endpoints, uncached, Timeout of the check

	demoted    atomic.Bool
	checks     atomic.Uint64
	mismatches atomic.Uint64
	errors     atomic.Uint64
	dropped    atomic.Uint64

	mu        sync.Mutex
	demotedAt time.Time
	reason    string
	firstDiff int
}

// demote marks m's local tokenizer inexact; the first call logs.
func (t *Tokenizer) demote(m *modelTokenizer, pos int, local, engine []uint32, chat bool) {
	st := m.check
	st.mu.Lock()
	first := !st.demoted.Load()
	if first {
		st.demotedAt = t.now()
		st.firstDiff = pos
		mode := "completion"
		if chat {
			mode = "chat"
		}
		st.reason = fmt.Sprintf("a sampled %s request tokenized locally to %d ids, %s to %d; first difference at token %d (local %v, engine %v)",
			mode, len(local), st.engine.endpoint(), len(engine), pos, window(local, pos), window(engine, pos))
		st.demoted.Store(true)
	}
	reason := st.reason
	st.mu.Unlock()
	if first {
		t.metrics.localExact.WithLabelValues(m.name).Set(0)
		t.log.Warn("tokenize: local tokenizer disagrees with the engine; serving this model with the remote tokenizer from now on",
			"model", m.name, "first_diff", pos, "detail", reason)
	}
}

// window returns up to 4 ids on each side of pos.
func window(ids []uint32, pos int) []uint32 {
	return ids[max(0, pos-4):min(len(ids), pos+4)]
}

// SelfCheckState is one local model's self-check status.
type SelfCheckState struct {
	Model string
	// Serving is "local", or once the local tokenizer was demoted the
	// engine's endpoint serving it instead: "remote" (/tokenize) or
	// "render".
	Serving    string
	Demoted    bool
	DemotedAt  time.Time
	FirstDiff  int    // first differing token position of the demoting check
	Reason     string // what the demoting check saw
	Checks     uint64 // comparisons completed
	Mismatches uint64
	Errors     uint64 // failed engine calls (not counted as checks)
	Dropped    uint64 // samples dropped because the queue was full
}

// SelfCheckStates returns the self-check status of every checked local
// model, sorted by name (for /debug pages).
func (t *Tokenizer) SelfCheckStates() []SelfCheckState {
	var out []SelfCheckState
	for _, m := range t.models {
		if m.checked() {
			out = append(out, m.selfCheckState())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

// checked reports whether m's local tokenizer is self-checked (an auto
// model's check is set up with its found files, before they are
// published).
func (m *modelTokenizer) checked() bool {
	if m.cfg.Kind == KindAuto && m.found.Load() == nil {
		return false
	}
	return m.check != nil
}

func (m *modelTokenizer) selfCheckState() SelfCheckState {
	st := m.check
	s := SelfCheckState{
		Model: m.name, Serving: string(KindLocal),
		Checks: st.checks.Load(), Mismatches: st.mismatches.Load(), Errors: st.errors.Load(), Dropped: st.dropped.Load(),
	}
	if st.demoted.Load() {
		st.mu.Lock()
		s.Serving, s.Demoted, s.DemotedAt, s.FirstDiff, s.Reason = st.engine.source(), true, st.demotedAt, st.firstDiff, st.reason
		st.mu.Unlock()
	}
	return s
}

// Explain says in a sentence how model's prompts are tokenized and why,
// with the fallbacks it took so far and the requests its local tokenizer
// refused (and why the latest was).
func (t *Tokenizer) Explain(model string) string {
	m := t.known(model)
	if m == nil {
		if t.def == nil {
			return fmt.Sprintf("model %q: no tokenizer configured", model)
		}
		return fmt.Sprintf("model %q: default tokenizer (%s), no request seen yet", model, t.def.Kind)
	}
	return m.explain() + "; fallbacks: " + m.fallbackCounts() + "; local refusals: " + m.refusalText()
}

// known returns model's tokenizer if it is configured or was built for a
// request by the default (nil otherwise; it builds nothing).
func (t *Tokenizer) known(model string) *modelTokenizer {
	if m, ok := t.models[model]; ok {
		return m
	}
	if t.defaults == nil {
		return nil
	}
	t.defaults.mu.Lock()
	defer t.defaults.mu.Unlock()
	return t.defaults.m[model]
}

func (m *modelTokenizer) explain() string {
	model := m.name
	kind, origin := m.cfg.Kind, ""
	if kind == KindAuto {
		kind = KindRemote
		switch {
		case m.found.Load() != nil:
			kind, origin = KindLocal, fmt.Sprintf(" (kind auto: files found in %s)", m.foundDir)
		case m.foundDir == "":
			origin = " (kind auto: no tokenizer files found for the model)"
		case m.loadErr.Load() != nil:
			origin = fmt.Sprintf(" (kind auto: files found in %s did not load: %v)", m.foundDir, *m.loadErr.Load())
		default:
			origin = fmt.Sprintf(" (kind auto: loading the files found in %s)", m.foundDir)
		}
	}
	switch {
	case kind == KindRemote || kind == KindRender:
		what := "remote tokenizer (the replicas' /tokenize)"
		switch {
		case m.remote.render && len(m.cfg.RenderURLs) > 0:
			what = fmt.Sprintf("render tokenizer (the render endpoints of %s)", strings.Join(m.cfg.RenderURLs, ", "))
		case m.remote.render:
			what = "render tokenizer (the replicas' render endpoints)"
		}
		d, n := m.remote.deadlines.learned()
		if m.cfg.Timeout > 0 {
			return fmt.Sprintf("model %q: %s%s, fixed deadline %s", model, what, origin, d)
		}
		return fmt.Sprintf("model %q: %s%s, adaptive deadline %s for inputs under 16 KiB (learned from %d calls, within %s-%s)",
			model, what, origin, d, n, m.cfg.TimeoutMin, m.cfg.TimeoutMax)
	case kind != KindLocal:
		return fmt.Sprintf("model %q: %s tokenizer", model, kind)
	case m.check == nil:
		return fmt.Sprintf("model %q: local tokenizer%s, not checked against the engine (self-check disabled or no replicas)", model, origin)
	}
	s := m.selfCheckState()
	if s.Demoted {
		return fmt.Sprintf("model %q: local tokenizer%s demoted at %s, serving %s instead: %s",
			model, origin, s.DemotedAt.UTC().Format(time.RFC3339), m.check.engine.endpoint(), s.Reason)
	}
	return fmt.Sprintf("model %q: local tokenizer%s, %d of %d sampled comparisons with %s matched (%d failed to reach the engine, %d dropped)",
		model, origin, s.Checks-s.Mismatches, s.Checks, m.check.engine.endpoint(), s.Errors, s.Dropped)
}
