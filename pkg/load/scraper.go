package load

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Target is one replica to scrape.
type Target struct {
	// ID names the replica (the same string the Tracker and View use).
	ID string
	// URL is the engine's HTTP base URL, e.g. "http://10.0.0.7:8000".
	URL string
}

// Scraped is what the scraper last learned about one replica.
type Scraped struct {
	// Healthy is the probe verdict. A replica is unhealthy until its first
	// successful probe, after FailureThreshold consecutive failed probes,
	// and until SuccessThreshold consecutive successes follow.
	Healthy bool
	// Engine is "vllm" or "sglang" once metrics were read, else "".
	Engine string
	// Running and Waiting are the engine's running and queued requests;
	// KVUsage its KV cache usage in [0, 1]. Valid when MetricsAt is set.
	Running, Waiting int
	KVUsage          float64
	// KVBlocks is the engine's GPU KV block count (vLLM's
	// cache_config_info num_gpu_blocks label; the largest when several
	// engines report), 0 when not exposed.
	KVBlocks  int
	MetricsAt time.Time
	// Preemptions is the engine's cumulative preemption count (vLLM's
	// num_preemptions_total, SGLang's num_retracted_requests_total), and
	// PreemptedAt the probe that first read it higher than the probe
	// before (zero: never seen to rise; a count that fell, the engine
	// restarted, is taken as the new base).
	Preemptions float64
	PreemptedAt time.Time
	// LocalRequests is the router's own in-flight request count to the
	// replica (Tracker) around the scrape that produced Running and
	// Waiting: the larger of the counts just before the request and just
	// after the answer. LocalKnown is false when no Tracker was configured.
	// View subtracts it from the engine's count to find other routers'
	// requests without counting its own twice.
	LocalRequests int
	LocalKnown    bool
	// ProbedAt is the time of the last probe, successful or not.
	ProbedAt time.Time
}

// PreemptingAt reports whether the engine's preemption counter rose within
// PreemptionHold before now (Load.Preempting).
func (s Scraped) PreemptingAt(now time.Time) bool {
	return !s.PreemptedAt.IsZero() && now.Sub(s.PreemptedAt) < PreemptionHold
}

// ScraperConfig configures a Scraper. Zero fields take defaults.
type ScraperConfig struct {
	// Interval between scrapes of one replica. Default
	// DefaultScrapeInterval (200ms).
	Interval time.Duration
	// IdleInterval, when above Interval and with a Tracker, is the
	// interval between scrapes of a replica while the router is idle: no
	// request started (Tracker.Starts) since the previous tick, none in
	// flight to the replica, and its last probe healthy with metrics read.
	// The scraper still wakes every Interval to check, so routing resumes
	// the full rate within one Interval. Zero: always Interval.
	IdleInterval time.Duration
	// Timeout bounds each HTTP request. Default DefaultScrapeTimeout
	// (300ms).
	Timeout time.Duration
	// MetricsPath is scraped for load figures. Default "/metrics".
	MetricsPath string
	// HealthPath is probed each interval; a 2xx answer is healthy. Default
	// "/health". With DisableHealthProbe, health follows whether the
	// metrics endpoint can be reached at all.
	HealthPath         string
	DisableHealthProbe bool
	// FailureThreshold consecutive failed probes mark a replica unhealthy
	// (default 2); SuccessThreshold consecutive good ones readmit it
	// (default 1). With the defaults a dead replica is excluded within
	// about Interval + 2*Timeout, well under a second.
	FailureThreshold int
	SuccessThreshold int
	// MaxBodyBytes bounds a metrics response. Default 8 MiB.
	MaxBodyBytes int64
	// Tracker, when set, is sampled around each metrics scrape
	// (Scraped.LocalRequests).
	Tracker *Tracker
	// Client is the HTTP client; nil means a dedicated client with
	// keep-alives.
	Client *http.Client
	Logger *slog.Logger
	// Registerer receives the scraper's metrics unless nil.
	Registerer prometheus.Registerer
}

func (c ScraperConfig) withDefaults() (ScraperConfig, error) {
	if c.Interval == 0 {
		c.Interval = DefaultScrapeInterval
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultScrapeTimeout
	}
	if c.MetricsPath == "" {
		c.MetricsPath = "/metrics"
	}
	if c.HealthPath == "" {
		c.HealthPath = "/health"
	}
	if c.FailureThreshold == 0 {
		c.FailureThreshold = 2
	}
	if c.SuccessThreshold == 0 {
		c.SuccessThreshold = 1
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 8 << 20
	}
	if c.Client == nil {
		c.Client = &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.Interval < 0 || c.Timeout < 0:
		return c, errors.New("load: scraper interval and timeout must be positive")
	case c.FailureThreshold < 0 || c.SuccessThreshold < 0:
		return c, errors.New("load: scraper thresholds must be positive")
	}
	return c, nil
}

// Scraper polls every target's metrics and health endpoints.
//
// New has no side effects; Run owns all goroutines (one per target, started
// and stopped as SetTargets changes the set) and returns, with all of them
// joined, when its context ends. Get is lock-free and safe for concurrent
// use with everything else.
type Scraper struct {
	cfg    ScraperConfig
	parser expfmt.TextParser

	mu      sync.Mutex
	targets map[string]Target
	changed chan struct{} // 1-buffered: the target set changed

	states sync.Map // id -> *atomic.Pointer[Scraped]

	errs        *prometheus.CounterVec
	transitions *prometheus.CounterVec
}

// NewScraper returns a scraper with no targets. It registers, unless
// cfg.Registerer is nil: kvroute_scrape_errors_total{replica,kind},
// kvroute_replica_health_transitions_total{replica,healthy} and the gauges
// kvroute_replica_healthy, kvroute_replica_engine_running_requests,
// kvroute_replica_engine_waiting_requests, kvroute_replica_kv_usage (all
// labelled by replica).
func NewScraper(cfg ScraperConfig) (*Scraper, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Scraper{
		cfg:     cfg,
		parser:  expfmt.NewTextParser(model.UTF8Validation),
		targets: map[string]Target{},
		changed: make(chan struct{}, 1),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_scrape_errors_total",
			Help: "Failed engine probes and scrapes, by kind (health, metrics_connect, metrics_status, metrics_parse).",
		}, []string{"replica", "kind"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_replica_health_transitions_total",
			Help: "Replica health changes decided by the prober.",
		}, []string{"replica", "healthy"}),
	}
	if reg := cfg.Registerer; reg != nil {
		for _, c := range []prometheus.Collector{s.errs, s.transitions, newScrapeCollector(s)} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// SetTargets replaces the set of replicas to scrape. Replicas leaving the
// set are forgotten; new ones start unhealthy until their first probe. It
// never blocks on Run.
func (s *Scraper) SetTargets(targets []Target) {
	next := make(map[string]Target, len(targets))
	for _, t := range targets {
		next[t.ID] = t
	}
	s.mu.Lock()
	s.targets = next
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Get returns what is known of replica; ok is false when it is not a
// target (it has never been set, or has been removed).
func (s *Scraper) Get(replica string) (Scraped, bool) {
	v, ok := s.states.Load(replica)
	if !ok {
		return Scraped{}, false
	}
	p := v.(*atomic.Pointer[Scraped]).Load()
	if p == nil {
		return Scraped{}, true
	}
	return *p, true
}

type worker struct {
	target Target
	cancel context.CancelFunc
	done   chan struct{}
}

// Run scrapes until ctx ends, then stops and joins every worker. It returns
// nil on cancellation.
func (s *Scraper) Run(ctx context.Context) error {
	workers := map[string]*worker{}
	defer func() {
		for _, w := range workers {
			w.cancel()
		}
		for id, w := range workers {
			<-w.done
			s.states.Delete(id)
		}
	}()
	for {
		s.reconcile(ctx, workers)
		select {
		case <-ctx.Done():
			return nil
		case <-s.changed:
		}
	}
}

func (s *Scraper) reconcile(ctx context.Context, workers map[string]*worker) {
	s.mu.Lock()
	want := s.targets
	s.mu.Unlock()
	for id, w := range workers {
		if t, ok := want[id]; ok && t == w.target {
			continue
		}
		w.cancel()
		<-w.done
		delete(workers, id)
		s.states.Delete(id)
	}
	for id, t := range want {
		if _, ok := workers[id]; ok {
			continue
		}
		st := &atomic.Pointer[Scraped]{}
		s.states.Store(id, st)
		wctx, cancel := context.WithCancel(ctx)
		w := &worker{target: t, cancel: cancel, done: make(chan struct{})}
		workers[id] = w
		go func() {
			defer close(w.done)
			s.scrapeLoop(wctx, t, st)
		}()
	}
}

func (s *Scraper) scrapeLoop(ctx context.Context, t Target, st *atomic.Pointer[Scraped]) {
	var (
		cur       Scraped
		fails, ok int
		bufs      scrapeBuffers
		starts    = int64(-1) // Tracker.Starts at the previous tick
		lastOK    bool        // the last probe was healthy and read metrics
		preempts  bool        // cur.Preemptions was read from the engine
	)
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if s.idle(t, &starts, lastOK) && time.Since(cur.ProbedAt) < s.cfg.IdleInterval-s.cfg.Interval/2 {
				continue
			}
		}
		healthy, m, mErr := s.probe(ctx, t, &bufs)
		if ctx.Err() != nil {
			return
		}
		lastOK = healthy && mErr == nil
		cur.ProbedAt = time.Now()
		if mErr == nil {
			cur.Engine, cur.Running, cur.Waiting, cur.KVUsage = m.engine, m.running, m.waiting, m.kvUsage
			cur.KVBlocks = m.kvBlocks
			if m.hasPreemptions {
				if preempts && m.preemptions > cur.Preemptions {
					cur.PreemptedAt = cur.ProbedAt
				}
				cur.Preemptions, preempts = m.preemptions, true
			}
			cur.LocalRequests, cur.LocalKnown = m.local, m.localKnown
			cur.MetricsAt = cur.ProbedAt
		}
		if healthy {
			fails, ok = 0, ok+1
		} else {
			fails, ok = fails+1, 0
		}
		switch {
		case !cur.Healthy && healthy && ok >= s.cfg.SuccessThreshold:
			cur.Healthy = true
			s.transitions.WithLabelValues(t.ID, "true").Inc()
			s.cfg.Logger.Info("replica healthy", slog.String("replica", t.ID))
		case cur.Healthy && !healthy && fails >= s.cfg.FailureThreshold:
			cur.Healthy = false
			s.transitions.WithLabelValues(t.ID, "false").Inc()
			s.cfg.Logger.Warn("replica unhealthy", slog.String("replica", t.ID))
		}
		snap := cur
		st.Store(&snap)
	}
}

// idle reports whether replica t may be scraped at the idle interval:
// IdleInterval is configured above Interval, a Tracker shows no request
// started since the previous tick (starts holds that tick's count) and
// none in flight to t, and the last probe went well (a failing replica
// keeps the full rate, so that it is excluded as fast as ever).
func (s *Scraper) idle(t Target, starts *int64, lastOK bool) bool {
	tr := s.cfg.Tracker
	if tr == nil || s.cfg.IdleInterval <= s.cfg.Interval {
		return false
	}
	n := tr.Starts()
	quiet := n == *starts
	*starts = n
	return quiet && lastOK && tr.Get(t.ID).Requests == 0
}

type engineMetrics struct {
	engine           string
	running, waiting int
	kvUsage          float64
	kvBlocks         int
	preemptions      float64 // cumulative; valid with hasPreemptions
	hasPreemptions   bool
	local            int // Tracker's in-flight requests around the scrape
	localKnown       bool
}

// errUnreachable marks a failure to talk to the engine at all (as opposed to
// an answer we did not like).
var errUnreachable = errors.New("unreachable")

// probe runs one health probe and one metrics scrape. healthy reports the
// probe's verdict (or, with the probe disabled, whether the metrics
// endpoint could be reached).
func (s *Scraper) probe(ctx context.Context, t Target, bufs *scrapeBuffers) (healthy bool, m engineMetrics, err error) {
	healthy = true
	if !s.cfg.DisableHealthProbe {
		if herr := s.health(ctx, t); herr != nil {
			healthy = false
			if ctx.Err() == nil {
				s.errs.WithLabelValues(t.ID, "health").Inc()
			}
		}
	}
	m, err = s.metrics(ctx, t, bufs)
	if err != nil && ctx.Err() == nil {
		kind := "metrics_parse"
		switch {
		case errors.Is(err, errUnreachable):
			kind = "metrics_connect"
			if s.cfg.DisableHealthProbe {
				healthy = false
			}
		case errors.Is(err, errStatus):
			kind = "metrics_status"
		}
		s.errs.WithLabelValues(t.ID, kind).Inc()
	}
	return healthy, m, err
}

func (s *Scraper) get(ctx context.Context, url string, accept string) (*http.Response, context.CancelFunc, error) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("load: request %s: %w", url, err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("load: %s: %w: %w", url, errUnreachable, err)
	}
	return resp, cancel, nil
}

var errStatus = errors.New("unexpected status")

func (s *Scraper) health(ctx context.Context, t Target) error {
	resp, cancel, err := s.get(ctx, t.URL+s.cfg.HealthPath, "")
	if err != nil {
		return err
	}
	defer cancel()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("load: %s%s: %w %d", t.URL, s.cfg.HealthPath, errStatus, resp.StatusCode)
	}
	return nil
}

// metrics scrapes t's load figures. With a Tracker it samples the
// router's own in-flight count just before the request and just after the
// answer and keeps the larger: the engine's figures are a snapshot taken in
// between, so a request of ours it may have counted is never mistaken for
// another router's (see View).
func (s *Scraper) metrics(ctx context.Context, t Target, bufs *scrapeBuffers) (engineMetrics, error) {
	before := s.localRequests(t.ID)
	resp, cancel, err := s.get(ctx, t.URL+s.cfg.MetricsPath, "text/plain;version=0.0.4")
	if err != nil {
		return engineMetrics{}, err
	}
	defer cancel()
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return engineMetrics{}, fmt.Errorf("load: %s%s: %w %d", t.URL, s.cfg.MetricsPath, errStatus, resp.StatusCode)
	}
	if bufs == nil {
		bufs = &scrapeBuffers{}
	}
	m, err := s.parseWith(bufs, io.LimitReader(resp.Body, s.cfg.MaxBodyBytes))
	if err == nil && s.cfg.Tracker != nil {
		m.local, m.localKnown = max(before, s.localRequests(t.ID)), true
	}
	return m, err
}

func (s *Scraper) localRequests(id string) int {
	if s.cfg.Tracker == nil {
		return 0
	}
	return s.cfg.Tracker.Get(id).Requests
}

// scrapeBuffers are one replica's scrape buffers, reused from scrape to
// scrape: the exposition as read, and the lines of it parse needs.
type scrapeBuffers struct {
	raw  bytes.Buffer
	kept []byte
}

// wantedFamilies are the metric families engineFigures reads.
var wantedFamilies = func() map[string]bool {
	m := map[string]bool{"vllm:cache_config_info": true}
	for _, e := range engines {
		m[e.running], m[e.waiting], m[e.preemptions] = true, true, true
		for _, k := range e.kvUsage {
			m[k] = true
		}
	}
	return m
}()

// keepFamilies appends to dst the lines of a text exposition that belong
// to wantedFamilies (samples and their # TYPE lines); every other line,
// the engines' many histograms above all, is dropped unparsed. A
// sample's family is its name up to '{' or a blank; a line that does not
// start with a name (a quoted UTF-8 name) is dropped: the classic format
// requested never has one.
func keepFamilies(dst, src []byte) []byte {
	for len(src) > 0 {
		line := src
		if i := bytes.IndexByte(src, '\n'); i >= 0 {
			line, src = src[:i+1], src[i+1:]
		} else {
			src = nil
		}
		name := line
		if bytes.HasPrefix(line, typePrefix) {
			name = line[len(typePrefix):]
		} else if len(line) > 0 && line[0] == '#' {
			continue
		}
		if wantedFamilies[string(familyName(name))] {
			dst = append(dst, line...)
			if line[len(line)-1] != '\n' {
				dst = append(dst, '\n')
			}
		}
	}
	return dst
}

var typePrefix = []byte("# TYPE ")

// familyName is the metric name a line starts with: up to '{' or a blank.
func familyName(b []byte) []byte {
	for i, c := range b {
		if c == '{' || c == ' ' || c == '\t' || c == '\r' || c == '\n' {
			return b[:i]
		}
	}
	return b
}

// parse reads engine load figures from a Prometheus text exposition.
func (s *Scraper) parse(r io.Reader) (engineMetrics, error) {
	return s.parseWith(&scrapeBuffers{}, r)
}

// parseWith is parse with the caller's buffers: the exposition is read
// whole, cut down to wantedFamilies and only that is parsed.
func (s *Scraper) parseWith(bufs *scrapeBuffers, r io.Reader) (engineMetrics, error) {
	bufs.raw.Reset()
	if _, err := bufs.raw.ReadFrom(r); err != nil {
		return engineMetrics{}, fmt.Errorf("load: read metrics: %w", err)
	}
	bufs.kept = keepFamilies(bufs.kept[:0], bufs.raw.Bytes())
	p := s.parser // TextParser keeps per-parse state: use a copy
	fams, err := p.TextToMetricFamilies(bytes.NewReader(bufs.kept))
	if err != nil {
		return engineMetrics{}, fmt.Errorf("load: parse metrics: %w", err)
	}
	return engineFigures(fams)
}

// Metric names by engine. Requests are summed over series (one per model or
// data-parallel engine label); KV usage takes the fullest series.
var engines = []struct {
	name, running, waiting string
	kvUsage                []string // first present wins
	preemptions            string   // the cumulative preemption counter
}{
	{"vllm", "vllm:num_requests_running", "vllm:num_requests_waiting", []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}, "vllm:num_preemptions_total"},
	{"sglang", "sglang:num_running_reqs", "sglang:num_queue_reqs", []string{"sglang:token_usage"}, "sglang:num_retracted_requests_total"},
}

var errNoEngineMetrics = errors.New("load: no vLLM or SGLang load metrics in exposition")

func engineFigures(fams map[string]*dto.MetricFamily) (engineMetrics, error) {
	for _, e := range engines {
		run, okR := fams[e.running]
		wait, okW := fams[e.waiting]
		if !okR && !okW {
			continue
		}
		m := engineMetrics{engine: e.name, running: int(sum(run)), waiting: int(sum(wait)), kvBlocks: kvBlocks(fams)}
		for _, name := range e.kvUsage {
			if f, ok := fams[name]; ok {
				m.kvUsage = min(max(maxValue(f), 0), 1)
				break
			}
		}
		if f, ok := fams[e.preemptions]; ok {
			m.preemptions, m.hasPreemptions = sum(f), true
		}
		return m, nil
	}
	return engineMetrics{}, errNoEngineMetrics
}

// kvBlocks reads vLLM's cache_config_info num_gpu_blocks label (the
// largest over its series), 0 when absent or not a number.
func kvBlocks(fams map[string]*dto.MetricFamily) int {
	n := 0
	for _, m := range fams["vllm:cache_config_info"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() != "num_gpu_blocks" {
				continue
			}
			if v, err := strconv.Atoi(l.GetValue()); err == nil && v > n {
				n = v
			}
		}
	}
	return n
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	return 0
}

func sum(f *dto.MetricFamily) float64 {
	t := 0.0
	for _, m := range f.GetMetric() {
		if v := value(m); v > 0 {
			t += v
		}
	}
	return t
}

func maxValue(f *dto.MetricFamily) float64 {
	best := 0.0
	for _, m := range f.GetMetric() {
		best = max(best, value(m))
	}
	return best
}

type scrapeCollector struct {
	s                                              *Scraper
	healthy, running, waiting, kvUsage, preempting *prometheus.Desc
}

func newScrapeCollector(s *Scraper) *scrapeCollector {
	l := []string{"replica"}
	return &scrapeCollector{
		s:       s,
		healthy: prometheus.NewDesc("kvroute_replica_healthy", "1 when the replica passes its health probes.", l, nil),
		running: prometheus.NewDesc("kvroute_replica_engine_running_requests", "Running requests the engine last reported.", l, nil),
		waiting: prometheus.NewDesc("kvroute_replica_engine_waiting_requests", "Queued requests the engine last reported.", l, nil),
		kvUsage: prometheus.NewDesc("kvroute_replica_kv_usage", "KV cache usage in [0, 1] the engine last reported.", l, nil),
		preempting: prometheus.NewDesc("kvroute_replica_preempting",
			"1 when the engine's preemption counter rose in the last 10s (the router then reads its waits as memory, not speed).", l, nil),
	}
}

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.healthy
	ch <- c.running
	ch <- c.waiting
	ch <- c.kvUsage
	ch <- c.preempting
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	all := map[string]Scraped{}
	c.s.states.Range(func(k, _ any) bool {
		if v, ok := c.s.Get(k.(string)); ok {
			all[k.(string)] = v
		}
		return true
	})
	for _, r := range sortedKeys(all) {
		v := all[r]
		h := 0.0
		if v.Healthy {
			h = 1
		}
		ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, h, r)
		if !v.MetricsAt.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(v.Running), r)
			ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(v.Waiting), r)
			ch <- prometheus.MustNewConstMetric(c.kvUsage, prometheus.GaugeValue, v.KVUsage, r)
			p := 0.0
			if v.PreemptingAt(time.Now()) {
				p = 1
			}
			ch <- prometheus.MustNewConstMetric(c.preempting, prometheus.GaugeValue, p, r)
		}
	}
}
