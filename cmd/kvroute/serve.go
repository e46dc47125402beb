package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/kvroute/kvroute/pkg/admin"
	"github.com/kvroute/kvroute/pkg/discovery"
	"github.com/kvroute/kvroute/pkg/enginehttp"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/extproc"
	"github.com/kvroute/kvroute/pkg/fleet"
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/policy"
	"github.com/kvroute/kvroute/pkg/respstore"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/telemetry"
	"github.com/kvroute/kvroute/pkg/tlsfiles"
	"github.com/kvroute/kvroute/pkg/tokenize"
)

// serveFlags are the command-line overrides of the config file.
type serveFlags struct {
	config                      string
	extproc, adminAddr, metrics string
	policy, logLevel, logFormat string
	replicasFile                string
	warmTimeout, drainTimeout   time.Duration
	// contention turns on the mutex and block profiles served under the
	// admin listener's /debug/pprof/ (off by default: they cost a little
	// on every contended lock and blocking channel operation).
	contention bool
}

func parseServeFlags(args []string, out io.Writer) (*serveFlags, error) {
	f := &serveFlags{}
	fs := flag.NewFlagSet("kvroute serve", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&f.config, "config", "", "config file (YAML; see examples/kvroute.yaml)")
	fs.StringVar(&f.extproc, "extproc-addr", "", "override listeners.extproc")
	fs.StringVar(&f.adminAddr, "admin-addr", "", "override listeners.admin")
	fs.StringVar(&f.metrics, "metrics-addr", "", "override listeners.metrics")
	fs.StringVar(&f.policy, "policy", "", "override policy.name")
	fs.StringVar(&f.logLevel, "log-level", "", "override telemetry.log_level")
	fs.StringVar(&f.logFormat, "log-format", "", "override telemetry.log_format")
	fs.StringVar(&f.replicasFile, "replicas-file", "", "use this replica file (replaces the replicas section)")
	fs.DurationVar(&f.warmTimeout, "warm-timeout", 0, "override readiness.warm_timeout")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 0, "override listeners.drain_timeout")
	fs.BoolVar(&f.contention, "profile-contention", false, "record mutex and block profiles (admin /debug/pprof/mutex and /block)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return f, nil
}

// loadServeConfig reads the file (if any), applies flag overrides, then
// defaults and validation.
func loadServeConfig(f *serveFlags) (*Config, error) {
	c := &Config{}
	if f.config != "" {
		var err error
		if c, err = decodeConfigFile(f.config); err != nil {
			return nil, err
		}
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&c.Listeners.ExtProc, f.extproc)
	set(&c.Listeners.Admin, f.adminAddr)
	set(&c.Listeners.Metrics, f.metrics)
	set(&c.Policy.Name, f.policy)
	set(&c.Telemetry.LogLevel, f.logLevel)
	set(&c.Telemetry.LogFormat, f.logFormat)
	if f.replicasFile != "" {
		c.Replicas = discovery.Config{File: &discovery.FileConfig{Path: f.replicasFile}}
	}
	if f.warmTimeout != 0 {
		c.Readiness.WarmTimeout = f.warmTimeout
	}
	if f.drainTimeout != 0 {
		c.Listeners.DrainTimeout = f.drainTimeout
	}
	*c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// wiring is what `kvroute serve` builds: every component, wired, not yet
// running (the composition root's product; route.Router is one of its
// parts).
type wiring struct {
	cfg    *Config
	log    *slog.Logger
	reg    *prometheus.Registry
	tr     *telemetry.Tracing
	idx    *index.Index
	events *events.Manager
	scrape *load.Scraper
	models *fleet.Models
	fid    *load.Fidelity
	view   *load.View
	set    *fleet.Set
	fleet  *fleet.Controller
	tok    *tokenize.Tokenizer
	source discovery.Source
	ext    *extproc.Server
	health *extproc.Health
	admin  *admin.Server
}

// build wires the components. It starts nothing.
func build(cfg *Config, log *slog.Logger, tr *telemetry.Tracing) (*wiring, error) {
	r := &wiring{cfg: cfg, log: log, tr: tr, reg: telemetry.NewRegistry()}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvroute_build_info", Help: "Always 1; the version label names the build.",
	}, []string{"version"})
	buildInfo.WithLabelValues(version).Set(1)
	r.reg.MustRegister(buildInfo)

	var err error
	// The engines' HTTP client: nil (each component's own) unless the
	// engines ask for an API key.
	var engines *http.Client
	if cfg.EngineAuth.Enabled() {
		keyLog := log.With("component", "engine_auth")
		if engines, err = enginehttp.Client(cfg.EngineAuth, func(err error) {
			keyLog.Warn("engine API key file not re-read; the previous key stays in use", "err", err)
		}); err != nil {
			return nil, err
		}
	}
	r.idx = index.New(cfg.Index)
	r.reg.MustRegister(newIndexCollector(r.idx))
	r.events = events.NewManager(r.idx, cfg.Events, r.reg, log.With("component", "events"))
	tracker, err := load.NewTracker(r.reg)
	if err != nil {
		return nil, fmt.Errorf("load tracker: %w", err)
	}
	sc := cfg.Load.Scraper()
	sc.Logger, sc.Registerer = log.With("component", "scraper"), r.reg
	sc.Tracker = tracker // sampled at each scrape: View tells other routers' requests from ours
	sc.Client = engines
	if r.scrape, err = load.NewScraper(sc); err != nil {
		return nil, fmt.Errorf("load scraper: %w", err)
	}
	if r.fid, err = load.NewFidelity(cfg.Load.Fidelity(), r.reg); err != nil {
		return nil, fmt.Errorf("fidelity: %w", err)
	}
	r.view = &load.View{Tracker: tracker, Scraper: r.scrape, Fidelity: r.fid, StaleAfter: cfg.Load.StaleAfter}
	// LoRA adapters: the replica specs' lora_adapters plus each engine's
	// /v1/models (vLLM lists adapters with their parent).
	if r.models, err = fleet.NewModels(fleet.ModelsConfig{Logger: log.With("component", "models"), Client: engines}); err != nil {
		return nil, fmt.Errorf("models prober: %w", err)
	}
	r.set = fleet.NewSet(fleet.SetConfig{Loads: r.view, Events: r.events, Fidelity: r.fid, BlockSize: cfg.Routing.BlockSize, Models: r.models})

	if r.tok, err = tokenize.New(cfg.Tokenizer, tokenize.Options{
		Registerer: r.reg, Replicas: r.set.TokenizerURLs, Logger: log.With("component", "tokenize"), HTTPClient: engines,
	}); err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}

	seed := cfg.Policy.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	pol, err := policy.New(cfg.Policy.Name, cfg.Policy.Config)
	if err != nil {
		return nil, err
	}
	// Explain gets its own policy instance, so that explaining never moves
	// a stateful policy (a round-robin cursor) that real traffic uses.
	explainPol, err := policy.New(cfg.Policy.Name, cfg.Policy.Config)
	if err != nil {
		return nil, err
	}
	// The events manager's matcher is the index's, with hybrid-attention
	// replicas' matches cut to their sliding-window groups (pkg/events).
	// One dispatch-learned index for replicas without events: the decider
	// records its picks there, the explainer only reads it.
	approx := route.NewApproxIndex(cfg.Routing.Approximate)
	r.reg.MustRegister(newApproxCollector(approx))
	// One rate learner, fed by ext_proc's finished responses, read by the
	// decider and the explainer alike (explain predicts what decide would).
	// So is the memory of prefixes just sent to event-fed replicas (their
	// events come once the blocks are computed; route.Options.Pending).
	rates := route.NewRates()
	var pending *route.ApproxIndex
	if cfg.Routing.PendingTTL > 0 {
		pending = route.NewApproxIndex(route.ApproxConfig{TTL: cfg.Routing.PendingTTL})
	}
	routeOpts := route.Options{Matcher: r.events.Matcher(), State: r.set, Policy: pol, Tokenizer: r.tok, Seed: seed, Approx: approx, Rates: rates, Pending: pending, Tracker: tracker, DeferRecords: true}
	decider := route.New(routeOpts) // extproc commits each decision's records once its pick is sent
	routeOpts.Policy = explainPol
	explainer := route.New(routeOpts)

	r.health = extproc.NewHealth()
	if r.fleet, err = fleet.NewController(fleet.ControllerConfig{
		Set: r.set, Streams: r.events, Index: r.idx, Probes: r.scrape, Readiness: r.health,
		WarmTimeout: cfg.Readiness.WarmTimeout, Now: clock, Logger: log,
	}); err != nil {
		return nil, err
	}
	ec := cfg.Routing.ExtProc() // headers and abuse limits
	ec.Decider = notingDecider{d: decider, ev: r.events}
	ec.Tracker = tracker
	ec.Fidelity = r.fid
	ec.Rates = rates
	stored, err := respstore.New(cfg.Responses, respstore.Options{
		Addresses: r.set.Addresses, Client: engines, Registerer: r.reg, Logger: log.With("component", "responses"),
	})
	if err != nil {
		return nil, err
	}
	ec.Responses = stored
	ec.BlockSize = r.set.BlockSize
	ec.TracerProvider = tr.Provider
	ec.Propagator = tr.Propagator
	ec.Registerer = r.reg
	ec.Logger = log.With("component", "extproc")
	ec.Ready = r.health.Ready // refuse streams until the first probe round: Envoy fails open
	if r.ext, err = extproc.New(ec); err != nil {
		return nil, fmt.Errorf("extproc: %w", err)
	}
	if r.admin, err = admin.New(admin.Config{
		Explainer: explainerFunc(explainer.Explain),
		Parse:     explainParser(stored),
		Replicas:  adminReplicas{fleet: r.fleet},
		Index:     r.idx,
		Decisions: decisionHistory{r.ext},
		Logger:    log.With("component", "admin"),
	}); err != nil {
		return nil, err
	}
	if r.source, err = cfg.Replicas.NewSource(log.With("component", "discovery"), r.reg); err != nil {
		return nil, err
	}
	return r, nil
}

// decisionHistory adapts extproc's decision history to admin.DecisionLister.
type decisionHistory struct{ ext *extproc.Server }

func (h decisionHistory) Decisions(limit int) ([]admin.RecordedDecision, uint64, error) {
	recs, total, err := h.ext.Decisions(limit)
	if errors.Is(err, extproc.ErrNoHistory) {
		return nil, 0, admin.ErrNoHistory
	}
	out := make([]admin.RecordedDecision, len(recs))
	for i, r := range recs {
		out[i] = admin.RecordedDecision{At: r.At, Decision: r.Decision}
	}
	return out, total, err
}

// notingDecider tells the event manager where requests go (its silent
// replica check) after each successful decision.
type notingDecider struct {
	d  *route.Router
	ev *events.Manager
}

func (n notingDecider) Decide(ctx context.Context, req route.Request) (route.Decision, error) {
	d, err := n.d.Decide(ctx, req)
	if err == nil && d.Replica != "" {
		n.ev.NoteRouted(d.Replica, clock())
	}
	return d, err
}

// clock is time.Now, named for the one place the wiring reads the clock.
var clock = time.Now

type explainerFunc func(context.Context, route.Request) (route.Decision, error)

func (f explainerFunc) Explain(ctx context.Context, req route.Request) (route.Decision, error) {
	return f(ctx, req)
}

// explainParser is the admin API's body parser: parseBody, with a body
// continuing a stored response pinned to the holder the router remembers
// (explaining asks no replica: it moves nothing).
func explainParser(stored *respstore.Store) func(string, []byte) (route.Request, error) {
	return func(path string, body []byte) (route.Request, error) {
		p, req, err := parseBody(path, body)
		if err == nil && p.Kind == openai.KindResponses && p.PreviousResponseID != "" {
			req.Pin = stored.Remembered(p.PreviousResponseID)
		}
		return req, err
	}
}

// parseBody is the admin API's body parsing: the same OpenAI parsing and
// request mapping ext_proc uses. A body without a path is read as the API
// its keys name.
func parseBody(path string, body []byte) (openai.Request, route.Request, error) {
	if path == "" {
		path = "/v1/completions"
		switch {
		case strings.Contains(string(body), `"messages"`):
			path = "/v1/chat/completions"
		case strings.Contains(string(body), `"input"`) && !strings.Contains(string(body), `"prompt"`):
			path = "/v1/responses"
		}
	}
	p, err := openai.Parse(path, body)
	if err != nil {
		return openai.Request{}, route.Request{}, fmt.Errorf("%w: %w", admin.ErrBadRequest, err)
	}
	var req route.Request
	extproc.FillRequest(&req, p, body)
	return p, req, nil
}

// adminReplicas is the admin API's view of the replica set.
type adminReplicas struct{ fleet *fleet.Controller }

// ReplicaInfos implements admin.ReplicaLister.
func (a adminReplicas) ReplicaInfos() []admin.ReplicaInfo {
	var out []admin.ReplicaInfo
	for _, m := range a.fleet.Members() {
		out = append(out, admin.ReplicaInfo{
			ID: m.ID, Address: m.Replica.Address, Model: m.Replica.Model, Engine: m.Replica.Engine,
			Load:             m.Load,
			EventsConfigured: m.Replica.EventsEndpoint != "",
			Resyncing:        m.Stream.Known && m.Stream.Resyncing,
			Warm:             m.Stream.Known && m.Stream.CaughtUp,
			LastSeq:          m.Stream.LastSeq,
			Silent:           m.Stream.Silent,
			Credit:           m.Trust,
			Cache:            m.Cache,
		})
	}
	return out
}

// serve runs every component under one errgroup until ctx ends or one
// fails, then shuts down in order: stop accepting streams (health goes
// NOT_SERVING, listeners close), drain in-flight streams for at most
// DrainTimeout, then stop the event subscribers, scraper and discovery.
// The caller flushes traces after serve returns.
func (r *wiring) serve(ctx context.Context, lis listeners) error {
	g, gctx := errgroup.WithContext(ctx)
	// Background components outlive the servers' drain: they stop after it.
	bg, stopBG := context.WithCancel(context.WithoutCancel(gctx))
	defer stopBG()

	// ServerOptions: the receive limit derived from extproc's body limit and
	// flow-control windows that let large bodies through without waiting.
	extSrv := grpc.NewServer(append(r.ext.ServerOptions(),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	)...)
	r.ext.Register(extSrv)
	r.health.Register(extSrv)

	// Explain over gRPC takes the bodies ext_proc takes (HTTP explain reads
	// up to admin.MaxExplainBody, the same 16 MiB).
	adminGRPC := grpc.NewServer(grpc.MaxRecvMsgSize(r.ext.MaxRecvMsgBytes()))
	r.admin.Register(adminGRPC)
	adminHTTP := &http.Server{
		Handler:           adminHandler(adminGRPC, r.debugMux()),
		ReadHeaderTimeout: 10 * time.Second,
	}
	adminHTTP.Protocols = new(http.Protocols)
	adminHTTP.Protocols.SetHTTP1(true)
	adminHTTP.Protocols.SetUnencryptedHTTP2(true)
	metricsHTTP := &http.Server{Handler: r.metricsHandler(), ReadHeaderTimeout: 10 * time.Second}

	updates := make(chan discovery.Snapshot)
	g.Go(func() error {
		defer stopBG()
		<-gctx.Done()
		r.fleet.Shutdown()
		r.health.Shutdown()
		r.log.Info("shutting down: draining ext_proc streams", slog.Duration("drain_timeout", r.cfg.Listeners.DrainTimeout))
		drained := make(chan struct{})
		go func() { extSrv.GracefulStop(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(r.cfg.Listeners.DrainTimeout):
			// Streams outliving the drain end with a status Envoy acts on
			// (UNAVAILABLE: it fails open and serves the rest of the
			// request without kvroute), each at its next message; after
			// endStreamsGrace the connections close, ending any stream
			// still waiting for one.
			r.log.Warn("drain timeout: ending the remaining ext_proc streams with UNAVAILABLE")
			r.ext.EndStreams()
			select {
			case <-drained:
			case <-time.After(endStreamsGrace):
				r.log.Warn("closing the ext_proc connections")
				extSrv.Stop()
				<-drained
			}
		}
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = adminHTTP.Shutdown(sctx)
		adminGRPC.Stop()
		_ = metricsHTTP.Shutdown(sctx)
		return nil
	})
	g.Go(func() error {
		if err := extSrv.Serve(lis.extproc); err != nil {
			return fmt.Errorf("ext_proc server: %w", err)
		}
		return nil
	})
	g.Go(func() error { return httpServe(adminHTTP, lis.admin, "admin") })
	g.Go(func() error { return httpServe(metricsHTTP, lis.metrics, "metrics") })
	g.Go(func() error {
		if err := r.events.Run(bg); err != nil {
			return fmt.Errorf("events: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := r.scrape.Run(bg); err != nil {
			return fmt.Errorf("scraper: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := r.source.Run(bg, updates); err != nil {
			return fmt.Errorf("discovery: %w", err)
		}
		return nil
	})
	g.Go(func() error { return r.models.Run(bg) })
	g.Go(func() error { return r.fleet.Run(bg, updates) })
	err := g.Wait()
	r.tok.Close()
	return err
}

// endStreamsGrace is how long, after the drain deadline, streams still
// open have to reach their next message and end with a status before the
// ext_proc connections are closed under them.
const endStreamsGrace = time.Second

func httpServe(s *http.Server, ln net.Listener, name string) error {
	if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s server: %w", name, err)
	}
	return nil
}

// adminHandler serves gRPC and the HTTP JSON mirror on one port.
func adminHandler(g *grpc.Server, mirror http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.ProtoMajor == 2 && strings.HasPrefix(req.Header.Get("Content-Type"), "application/grpc") {
			g.ServeHTTP(w, req)
			return
		}
		mirror.ServeHTTP(w, req)
	})
}

// debugMux is the admin HTTP mirror plus GET /debug/tokenizer (each local
// tokenizer's self-check against the engine, and why it is or is not
// trusted).
func (r *wiring) debugMux() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /debug/tokenizer", r.tok.DebugHandler())
	mux.Handle("/", r.admin.Handler())
	return mux
}

func (r *wiring) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", telemetry.MetricsHandler(r.reg))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := r.fleet.ReadyStatus()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !st.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = io.WriteString(w, st.String())
	})
	return mux
}

// listeners are the bound sockets serve uses.
type listeners struct {
	extproc, admin, metrics net.Listener
}

// withTLS wraps each listener whose TLS section names a certificate; the
// files are re-read when they change. On error every listener is closed.
func (l *listeners) withTLS(c TLSConfig, log *slog.Logger) error {
	for _, x := range []struct {
		name string
		ln   *net.Listener
		cfg  tlsfiles.Config
	}{{"tls.extproc", &l.extproc, c.ExtProc}, {"tls.admin", &l.admin, c.Admin}, {"tls.metrics", &l.metrics, c.Metrics}} {
		name := x.name
		ln, err := tlsfiles.Listen(*x.ln, x.cfg, func(err error) {
			log.Warn("tls files not reloaded; keeping the previous certificates", slog.String("section", name), slog.Any("error", err))
		})
		if err != nil {
			l.extproc.Close()
			l.admin.Close()
			l.metrics.Close()
			return fmt.Errorf("%s: %w", name, err)
		}
		*x.ln = ln
	}
	return nil
}

func listen(c ListenersConfig) (listeners, error) {
	var l listeners
	var err error
	if l.extproc, err = net.Listen("tcp", c.ExtProc); err != nil {
		return l, fmt.Errorf("listeners.extproc: %w", err)
	}
	if l.admin, err = net.Listen("tcp", c.Admin); err != nil {
		l.extproc.Close()
		return l, fmt.Errorf("listeners.admin: %w", err)
	}
	if l.metrics, err = net.Listen("tcp", c.Metrics); err != nil {
		l.extproc.Close()
		l.admin.Close()
		return l, fmt.Errorf("listeners.metrics: %w", err)
	}
	return l, nil
}

// runServe is `kvroute serve`.
func runServe(ctx context.Context, args []string, stderr io.Writer) error {
	f, err := parseServeFlags(args, stderr)
	if err != nil {
		return err
	}
	if f.contention {
		runtime.SetMutexProfileFraction(10)  // one contended lock event in 10
		runtime.SetBlockProfileRate(100_000) // one blocking event per 100 µs blocked
	}
	cfg, err := loadServeConfig(f)
	if err != nil {
		return err
	}
	log, err := telemetry.NewLogger(stderr, cfg.Telemetry.LogLevel, cfg.Telemetry.LogFormat)
	if err != nil {
		return err
	}
	tr, err := telemetry.NewTracing(ctx, telemetry.TracingConfig{ServiceName: cfg.Telemetry.ServiceName, ServiceVersion: version})
	if err != nil {
		return err
	}
	// Flushed last, after every component has stopped.
	defer func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tr.Shutdown(fctx); err != nil {
			log.Warn("flushing traces", slog.Any("error", err))
		}
	}()
	r, err := build(cfg, log, tr)
	if err != nil {
		return err
	}
	lis, err := listen(cfg.Listeners)
	if err != nil {
		return err
	}
	if err := lis.withTLS(cfg.TLS, log); err != nil {
		return err
	}
	log.Info("kvroute serving", slog.String("version", version),
		slog.String("extproc", lis.extproc.Addr().String()), slog.String("admin", lis.admin.Addr().String()),
		slog.String("metrics", lis.metrics.Addr().String()), slog.String("policy", cfg.Policy.Name),
		slog.String("traces", tr.Exporter))
	err = r.serve(ctx, lis)
	log.Info("kvroute stopped")
	return err
}
