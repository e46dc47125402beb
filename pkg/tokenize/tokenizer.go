package tokenize

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/pkg/route"
	"github.com/prometheus/client_golang/prometheus"
)

// Options are the Tokenizer's collaborators.
type Options struct {
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Replicas returns candidate base URLs ("http://10.0.0.1:8000") of
	// healthy replicas serving model, best first; the remote tokenizer
	// tries them in order. Required when a model is remote.
	Replicas func(model string) []string
	// HTTPClient overrides the remote tokenizer's pooled keep-alive client.
	HTTPClient *http.Client
	// Logger gets breaker state changes; nil discards.
	Logger *slog.Logger
	// Now is the clock (breakers); nil means time.Now.
	Now func() time.Time
}

// Tokenizer dispatches each request to its model's tokenizer, applying the
// model's fallback on failure. It implements route.Tokenizer and is safe for
// concurrent use; it starts no goroutines.
type Tokenizer struct {
	models  map[string]*modelTokenizer
	def     *ModelConfig
	defOpts Options
	metrics *metrics
	client  *http.Client
	ownHTTP bool
	log     *slog.Logger
	now     func() time.Time

	defaults *modelCache
	encMu    sync.Mutex
	encoders map[string]*Encoder // by tokenizer.json path

	// The auto kind: where to look for files, and the background loads
	// of found files (Close waits for them).
	searchDirs []string
	selfCheck  SelfCheckConfig
	opts       Options
	loads      sync.WaitGroup

	checker *selfChecker // nil when no local model is self-checked
}

var _ route.Tokenizer = (*Tokenizer)(nil)

// modelTokenizer is one model's configured tokenizer.
type modelTokenizer struct {
	name   string
	cfg    ModelConfig
	local  *Local
	remote *remote // a remote model's tokenizer; for a local one, its stand-in once demoted
	approx *approximate
	check  *checkState // self-check of a local model; nil when unchecked
	// The auto kind: found is the local tokenizer of the files found in
	// foundDir once loaded (nil until then, or when none were found or
	// they failed to load: loadErr).
	found    atomic.Pointer[Local]
	foundDir string
	loadErr  atomic.Pointer[error]

	// fallbacks counts this model's fallbacks by "<kind>_<reason>"
	// (explain; the metric has the same counts). refusals counts the
	// requests its local tokenizer refused as ones it cannot reproduce
	// (ErrUnsupported: a template printing a number as only Python prints
	// it, ...), lastRefusal says why the latest was (explain).
	fbMu        sync.Mutex
	fallbacks   map[string]uint64
	refusals    uint64
	lastRefusal string
}

// maxRefusalText bounds the reason explain keeps for a local refusal.
const maxRefusalText = 300

// noteRefusal records a local refusal and its reason.
func (m *modelTokenizer) noteRefusal(err error) {
	msg := err.Error()
	if len(msg) > maxRefusalText {
		msg = strings.ToValidUTF8(msg[:maxRefusalText], "") + "…"
	}
	m.fbMu.Lock()
	defer m.fbMu.Unlock()
	m.refusals++
	m.lastRefusal = msg
}

// refusalText is "none", or the refusals so far and the latest reason.
func (m *modelTokenizer) refusalText() string {
	m.fbMu.Lock()
	defer m.fbMu.Unlock()
	if m.refusals == 0 {
		return "none"
	}
	return fmt.Sprintf("%d, the latest: %s", m.refusals, m.lastRefusal)
}

func (m *modelTokenizer) countFallback(why string) {
	m.fbMu.Lock()
	defer m.fbMu.Unlock()
	if m.fallbacks == nil {
		m.fallbacks = map[string]uint64{}
	}
	m.fallbacks[why]++
}

// fallbackCounts returns the fallbacks so far, "kind_reason n" sorted by
// name, or "none".
func (m *modelTokenizer) fallbackCounts() string {
	m.fbMu.Lock()
	defer m.fbMu.Unlock()
	if len(m.fallbacks) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m.fallbacks))
	for k := range m.fallbacks {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m.fallbacks[k])
	}
	return b.String()
}

// New builds the tokenizers cfg describes, loading local tokenizer files
// now (a missing or unsupported file is an error here, not at request time).
// With Options.Replicas set and the self-check enabled, it starts the
// self-check workers, which Close stops and waits for.
func New(cfg Config, opts Options) (*Tokenizer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	met, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{
		models:  make(map[string]*modelTokenizer, len(cfg.Models)),
		metrics: met,
		log:     opts.Logger,
		now:     opts.Now,
		client:  opts.HTTPClient,
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.now == nil {
		t.now = time.Now
	}
	if t.client == nil {
		t.client, t.ownHTTP = newHTTPClient(), true
	}
	t.encoders = map[string]*Encoder{}
	t.searchDirs, t.opts = cfg.SearchDirs, opts
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(newChunkCollector(t)); err != nil {
			return nil, fmt.Errorf("tokenize: register metrics: %w", err)
		}
	}
	sc := cfg.SelfCheck.WithDefaults()
	if !sc.Disabled && opts.Replicas != nil {
		t.selfCheck = sc
	} else {
		t.selfCheck.Disabled = true
	}
	for name, mc := range cfg.Models {
		m, err := t.build(name, mc.withDefaults(), opts)
		if err != nil {
			return nil, fmt.Errorf("tokenize: model %q: %w", name, err)
		}
		t.models[name] = m
	}
	if cfg.Default != nil {
		d := cfg.Default.withDefaults()
		t.def, t.defOpts = &d, opts
		t.defaults = &modelCache{m: map[string]*modelTokenizer{}}
	}
	if !t.selfCheck.Disabled {
		for _, m := range t.models {
			if m.cfg.Kind != KindLocal {
				continue
			}
			engineCfg := t.engineConfig(m.cfg)
			engineCfg.Timeout = sc.Timeout
			m.check = &checkState{engine: t.newRemote(m.name, engineCfg, opts, false)}
			m.remote = t.newRemote(m.name, t.engineConfig(m.cfg), opts, true)
			t.metrics.localExact.WithLabelValues(m.name).Set(1)
		}
		if t.hasChecks() || t.hasAuto(cfg) {
			t.checker = newSelfChecker(t, sc)
		}
	}
	return t, nil
}

// hasAuto: some model may get a local tokenizer from found files.
func (t *Tokenizer) hasAuto(cfg Config) bool {
	if cfg.Default != nil && cfg.Default.Kind == KindAuto {
		return true
	}
	for _, m := range cfg.Models {
		if m.Kind == KindAuto {
			return true
		}
	}
	return false
}

func (t *Tokenizer) hasChecks() bool {
	for _, m := range t.models {
		if m.check != nil {
			return true
		}
	}
	return false
}

func newHTTPClient() *http.Client {
	tr := &http.Transport{
		Proxy:               nil, // replicas are reached directly
		DialContext:         (&net.Dialer{Timeout: time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: tr}
}

func (t *Tokenizer) build(name string, mc ModelConfig, opts Options) (*modelTokenizer, error) {
	m := &modelTokenizer{name: name, cfg: mc, approx: &approximate{bytesPerToken: mc.BytesPerToken, maxInputBytes: mc.MaxInputBytes}}
	switch mc.Kind {
	case KindLocal:
		var err error
		if m.local, err = t.loadLocal(mc); err != nil {
			return nil, err
		}
		if mc.Engine == EngineSGLang && opts.Replicas != nil {
			// SGLang renders chats otherwise: they go to its /tokenize.
			m.remote = t.newRemote(name, t.engineConfig(mc), opts, true)
		}
	case KindAuto:
		if opts.Replicas == nil {
			return nil, errors.New("auto tokenizer needs Options.Replicas (it is remote until local files are found)")
		}
		m.remote = t.newRemote(name, t.engineConfig(mc), opts, true)
		if m.foundDir = FindTokenizerFiles(name, t.searchDirs); m.foundDir != "" {
			t.loads.Add(1)
			go t.loadFound(m)
		}
	case KindRemote:
		if opts.Replicas == nil {
			return nil, errors.New("remote tokenizer needs Options.Replicas")
		}
		m.remote = t.newRemote(name, mc, opts, true)
	case KindRender:
		if opts.Replicas == nil && len(mc.RenderURLs) == 0 {
			return nil, errors.New("render tokenizer needs render_urls or Options.Replicas")
		}
		m.remote = t.newRemote(name, mc, opts, true)
	}
	return m, nil
}

// loadLocal loads mc's local tokenizer files; models sharing a
// tokenizer.json share one loaded encoder.
func (t *Tokenizer) loadLocal(mc ModelConfig) (*Local, error) {
	t.encMu.Lock()
	enc, ok := t.encoders[mc.TokenizerJSON]
	t.encMu.Unlock()
	if !ok {
		var err error
		if enc, err = LoadEncoder(mc.TokenizerJSON); err != nil {
			return nil, err
		}
		t.encMu.Lock()
		if prev, ok := t.encoders[mc.TokenizerJSON]; ok {
			enc = prev
		} else {
			t.encoders[mc.TokenizerJSON] = enc
		}
		t.encMu.Unlock()
	}
	var tmpl *ChatTemplate
	if mc.TokenizerConfig != "" {
		var err error
		if tmpl, err = LoadEngineChatTemplate(mc.TokenizerConfig, mc.EngineChat); err != nil {
			return nil, err
		}
	}
	return NewLocal(enc, tmpl, mc.MaxInputBytes, mc.PrefixCacheBytes), nil
}

// loadFound loads an auto model's found files (in its own goroutine, joined
// by Close) and, when they load, switches the model to them, self-checked
// like a configured local tokenizer. Files that fail to load leave it
// remote (logged, and shown by Explain).
func (t *Tokenizer) loadFound(m *modelTokenizer) {
	defer t.loads.Done()
	mc := m.cfg
	mc.TokenizerJSON = filepath.Join(m.foundDir, tokenizerFileNames[0])
	mc.TokenizerConfig = filepath.Join(m.foundDir, tokenizerFileNames[1])
	l, err := t.loadLocal(mc)
	if err != nil {
		m.loadErr.Store(&err)
		t.log.Warn("tokenize: found tokenizer files did not load; the model stays on the remote tokenizer", "model", m.name, "dir", m.foundDir, "err", err)
		return
	}
	if !t.selfCheck.Disabled {
		engineCfg := t.engineConfig(m.cfg)
		engineCfg.Timeout = t.selfCheck.Timeout
		m.check = &checkState{engine: t.newRemote(m.name, engineCfg, t.opts, false)}
		t.metrics.localExact.WithLabelValues(m.name).Set(1)
	}
	m.found.Store(l)
	t.log.Info("tokenize: local tokenizer from found files", "model", m.name, "dir", m.foundDir)
}

// engineConfig is mc as the engine is asked for a local model's tokens
// (its self-check; a demoted model; an auto model before its files load;
// an SGLang model's chats): the replicas' /tokenize, or their render
// endpoints when the self-check's endpoint is render and the engine vLLM
// (SGLang serves none).
func (t *Tokenizer) engineConfig(mc ModelConfig) ModelConfig {
	mc.Kind, mc.RenderURLs = KindRemote, nil
	if t.selfCheck.Endpoint == SelfCheckRender && mc.Engine != EngineSGLang {
		mc.Kind = KindRender
	}
	return mc
}

// newRemote builds a client of the replicas' /tokenize for model (of the
// render endpoints, on the render servers or the replicas, when mc's kind
// is render), with its own breakers, and an LRU cache when cached is set
// and configured.
func (t *Tokenizer) newRemote(name string, mc ModelConfig, opts Options, cached bool) *remote {
	kind := KindRemote
	replicas := opts.Replicas
	if mc.Kind == KindRender {
		kind = KindRender
		if urls := slices.Clone(mc.RenderURLs); len(urls) > 0 {
			replicas = func(string) []string { return urls }
		}
	}
	effortMap, _ := mc.effortMap() // validated with the configuration
	r := &remote{
		model: name, cfg: mc, client: t.client, replicas: replicas, now: t.now, render: kind == KindRender, effortMap: effortMap,
		hits:      t.metrics.cacheHits.WithLabelValues(string(kind)).Inc,
		coalesced: t.metrics.coalesced.WithLabelValues(name).Inc,
		deadlines: newDeadlines(mc),
		breakers: &breakers{
			failures: mc.BreakerFailures, openFor: mc.BreakerOpenFor, now: t.now, m: map[string]*breaker{},
			onChange: func(base string, s breakerState) {
				t.log.Warn("tokenize: remote breaker state", "model", name, "replica", base, "state", s.String())
				t.metrics.breaker.WithLabelValues(name, s.String()).Inc()
			},
		},
	}
	if cached && mc.CacheSize > 0 {
		r.cache = newIDsCache(mc.CacheSize)
	}
	return r
}

// modelCache holds the tokenizers built from Config.Default, one per model
// seen (each has its own breakers and cache).
type modelCache struct {
	mu sync.Mutex
	m  map[string]*modelTokenizer
}

// maxDefaultModels bounds the models served by the default tokenizer (the
// model name is request input).
const maxDefaultModels = 1024

func (t *Tokenizer) model(name string) (*modelTokenizer, error) {
	if m, ok := t.models[name]; ok {
		return m, nil
	}
	if t.def == nil {
		return nil, fmt.Errorf("%w: no tokenizer for model %q", route.ErrUnknownModel, name)
	}
	t.defaults.mu.Lock()
	defer t.defaults.mu.Unlock()
	if m, ok := t.defaults.m[name]; ok {
		return m, nil
	}
	if len(t.defaults.m) >= maxDefaultModels {
		return nil, fmt.Errorf("%w: too many models on the default tokenizer", route.ErrUnknownModel)
	}
	m, err := t.build(name, *t.def, t.defOpts)
	if err != nil {
		return nil, err
	}
	t.defaults.m[name] = m
	return m, nil
}

// Tokenize implements route.Tokenizer. Errors wrap route.ErrUnknownModel,
// ErrInvalidUTF8, ErrInputTooLarge, ErrTemplate, ErrBadMessages,
// ErrNotTokenIDs, ErrRemote, ErrBreakerOpen or context errors; with
// fallback "approximate" a failure other than an unknown model or an ended
// request context is answered with approximate tokens instead, counted in
// kvroute_tokenizer_fallbacks_total{model,kind,reason} and named in their
// Source (fallbackSource).
func (t *Tokenizer) Tokenize(ctx context.Context, model string, in route.TokenizeInput) (route.Tokens, error) {
	m, err := t.model(model)
	if err != nil {
		return route.Tokens{}, err
	}
	start := time.Now()
	var toks route.Tokens
	kind, local := m.cfg.Kind, m.local
	if kind == KindAuto {
		kind = m.remote.kind()
		if local = m.found.Load(); local != nil {
			kind = KindLocal
		}
	}
	switch kind {
	case KindLocal:
		if m.check != nil && m.check.demoted.Load() || in.Chat && m.cfg.Engine == EngineSGLang && m.remote != nil {
			// The engine disagreed with this local tokenizer, or renders
			// chats otherwise than the local renderer: ask it.
			kind = m.remote.kind()
			toks, err = m.remote.tokenize(ctx, in)
			break
		}
		toks, err = local.TokenizeContext(ctx, in)
		if err == nil && t.checker != nil {
			t.checker.maybeSubmit(m, in, toks.IDs)
		}
		if errors.Is(err, ErrUnsupported) {
			m.noteRefusal(err)
			if m.remote != nil && ctx.Err() == nil {
				// The local tokenizer knows it cannot reproduce this
				// request (a template printing a number or a list as only
				// Python prints it, ...): the engine can.
				t.metrics.requests.WithLabelValues(string(KindLocal), "unsupported").Inc()
				kind = m.remote.kind()
				toks, err = m.remote.tokenize(ctx, in)
			}
		}
	case KindRemote, KindRender:
		toks, err = m.remote.tokenize(ctx, in)
	case KindPassthrough:
		toks, err = passthroughIDs(in)
	case KindApproximate:
		toks, err = m.approx.tokenize(in)
	}
	t.metrics.seconds.WithLabelValues(string(kind)).Observe(time.Since(start).Seconds())
	if err == nil {
		t.metrics.requests.WithLabelValues(string(kind), "ok").Inc()
		return toks, nil
	}
	reason := errReason(err)
	t.metrics.requests.WithLabelValues(string(kind), reason).Inc()
	// A caller that gave up or ran out of time wants nothing (the router
	// routes it on load); an approximate answer for an approximate model's
	// own failure would be the same failure.
	if m.cfg.Fallback != FallbackApproximate || m.cfg.Kind == KindApproximate || ctx.Err() != nil {
		return route.Tokens{}, err
	}
	toks, aerr := m.approx.tokenize(in)
	if aerr != nil {
		return route.Tokens{}, errors.Join(err, aerr)
	}
	t.metrics.fallbacks.WithLabelValues(model, string(kind), reason).Inc()
	m.countFallback(string(kind) + "_" + reason)
	toks.Source = fallbackSource(kind, reason)
	return toks, nil
}

// fallbackSource names approximate tokens given in place of kind's failed
// answer, e.g. "approximate:remote_timeout": the router's Decision (and so
// explain and the per-source tokenize metric) shows why it routed on
// approximate tokens.
func fallbackSource(kind Kind, reason string) string {
	return SourceApproximate + ":" + string(kind) + "_" + reason
}

// errReason classifies a failure for metrics.
func errReason(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, ErrBreakerOpen):
		return "breaker_open"
	case errors.Is(err, ErrNoEndpoint):
		return "no_endpoint"
	case errors.Is(err, ErrInputTooLarge):
		return "too_large"
	case errors.Is(err, ErrInvalidUTF8), errors.Is(err, ErrBadMessages), errors.Is(err, ErrNotTokenIDs):
		return "bad_input"
	case errors.Is(err, ErrTemplate):
		return "template"
	case errors.Is(err, ErrUnsupported):
		return "unsupported"
	case errors.Is(err, ErrRemote):
		return "remote_error"
	}
	return "error"
}

// Close stops the self-check workers (waiting for them) and releases idle
// connections of the Tokenizer's own HTTP client. Tokenize may still be
// called afterwards (nothing more is sampled).
func (t *Tokenizer) Close() {
	t.loads.Wait()
	if t.checker != nil {
		t.checker.stop()
	}
	if t.ownHTTP {
		t.client.CloseIdleConnections()
	}
}

type metrics struct {
	requests  *prometheus.CounterVec
	fallbacks *prometheus.CounterVec
	cacheHits *prometheus.CounterVec
	coalesced *prometheus.CounterVec
	breaker   *prometheus.CounterVec
	seconds   *prometheus.HistogramVec

	selfChecks *prometheus.CounterVec
	localExact *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_requests_total",
			Help: "Tokenizations by tokenizer kind and result (ok or the failure reason).",
		}, []string{"kind", "result"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_fallbacks_total",
			Help: "Failed tokenizations answered with approximate tokens, by model, kind and reason.",
		}, []string{"model", "kind", "reason"}),
		cacheHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_cache_hits_total",
			Help: "Tokenizations answered from the remote tokenizer's LRU cache.",
		}, []string{"kind"}),
		coalesced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_coalesced_total",
			Help: "Remote tokenizations that waited for an identical in-flight call instead of calling /tokenize again, by model.",
		}, []string{"model"}),
		breaker: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_breaker_transitions_total",
			Help: "Remote tokenizer circuit breaker transitions, by model and new state.",
		}, []string{"model", "state"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_tokenizer_seconds",
			Help:    "Tokenization latency by tokenizer kind.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
		}, []string{"kind"}),
		selfChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_self_checks_total",
			Help: "Sampled local tokenizations compared with the engine's /tokenize, by model and result (match, mismatch, error, dropped; unreproducible: a sample /tokenize cannot render as the chat route does, not sent).",
		}, []string{"model", "result"}),
		localExact: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_tokenizer_local_exact",
			Help: "1 while a self-checked local tokenizer agrees with the engine, 0 once a mismatch demoted it to the remote tokenizer.",
		}, []string{"model"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.fallbacks, m.cacheHits, m.coalesced, m.breaker, m.seconds, m.selfChecks, m.localExact} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("tokenize: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
