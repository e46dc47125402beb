package respstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"github.com/kvroute/kvroute/pkg/enginehttp"
)

// Defaults of Config.
const (
	DefaultMemory            = 1 << 16
	DefaultLookupTimeout     = 250 * time.Millisecond
	DefaultLookupConcurrency = 4
	DefaultLookupFanout      = 64
)

// MaxIDBytes is the longest response id a Store remembers or looks up.
const MaxIDBytes = 256

// MissTTL is how long an id a lookup found nowhere is not looked up again.
const MissTTL = 10 * time.Second

// missMemory is how many ids found nowhere are remembered.
const missMemory = 4096

// Config is the "responses" section of kvroute's config file. Zero fields
// take the Default* values (WithDefaults).
type Config struct {
	// Memory is how many response ids, with their holders, are
	// remembered (the oldest told is forgotten first).
	Memory int `yaml:"memory"`
	// LookupTimeout bounds a lookup: the replicas' answers to GET
	// /v1/responses/{id}, asked at once. It is spent in the request's
	// routing decision, so it must stay below the decision's deadline.
	LookupTimeout time.Duration `yaml:"lookup_timeout"`
	// LookupConcurrency is how many lookups may run at once; a request
	// arriving past it is routed without one.
	LookupConcurrency int `yaml:"lookup_concurrency"`
	// LookupFanout is how many replicas a lookup asks, at most.
	LookupFanout int `yaml:"lookup_fanout"`
	// DisableLookup: never ask the replicas; only ids told (Stored) are
	// pinned.
	DisableLookup bool `yaml:"disable_lookup"`
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Memory == 0 {
		c.Memory = DefaultMemory
	}
	if c.LookupTimeout == 0 {
		c.LookupTimeout = DefaultLookupTimeout
	}
	if c.LookupConcurrency == 0 {
		c.LookupConcurrency = DefaultLookupConcurrency
	}
	if c.LookupFanout == 0 {
		c.LookupFanout = DefaultLookupFanout
	}
	return c
}

// Validate reports every problem of a defaulted Config, each prefixed with
// its field's YAML path.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct {
		field string
		v     int
	}{{"memory", c.Memory}, {"lookup_concurrency", c.LookupConcurrency}, {"lookup_fanout", c.LookupFanout}} {
		if f.v <= 0 {
			errs = append(errs, fmt.Errorf("%s: %d: must be positive", f.field, f.v))
		}
	}
	if c.LookupTimeout <= 0 {
		errs = append(errs, fmt.Errorf("lookup_timeout: %v: must be positive", c.LookupTimeout))
	}
	return errors.Join(errs...)
}

// Options are a Store's collaborators.
type Options struct {
	// Addresses returns the ip:port of the replicas a lookup for model
	// asks ("" model: every replica), without duplicates. Nil: no lookup.
	Addresses func(model string) []string
	// Client reaches the engines (enginehttp's, when they ask for an API
	// key); nil: enginehttp.Plain().
	Client *http.Client
	// Registerer, when not nil, gets the Store's metrics.
	Registerer prometheus.Registerer
	// Logger hears of lookups that failed; nil: slog.Default().
	Logger *slog.Logger
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time
}

// Source says how Holder came to its answer.
type Source string

// Holder's sources.
const (
	SourceBook    Source = "book"    // told (Stored), or found by an earlier lookup
	SourceLookup  Source = "lookup"  // found now by asking the replicas
	SourceUnknown Source = "unknown" // asked: every replica asked answered that it does not store it
	// SourceUnanswered: asked, none answered that it stores it, and some
	// did not answer within lookup_timeout (not remembered as a miss: the
	// slow one may hold it).
	SourceUnanswered Source = "unanswered"
	SourceSkipped    Source = "skipped" // not asked: lookups off, a recent miss, an overlong id, no replica
	SourceBusy       Source = "busy"    // not asked: lookup_concurrency lookups were running
)

// Store is the router's memory of response holders.
type Store struct {
	cfg    Config
	opts   Options
	client *http.Client
	slots  chan struct{} // one per lookup running

	mu     sync.Mutex
	held   ring[string]    // id -> holder address
	missed ring[time.Time] // id -> when a lookup found it nowhere
	flight singleflight.Group

	holders   *prometheus.CounterVec
	requests  *prometheus.CounterVec
	forgotten prometheus.Counter
	lost      prometheus.Counter
}

// New returns a Store for a defaulted, valid cfg.
func New(cfg Config, opts Options) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("respstore: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Store{
		cfg: cfg, opts: opts, client: opts.Client,
		slots:  make(chan struct{}, cfg.LookupConcurrency),
		held:   newRing[string](cfg.Memory),
		missed: newRing[time.Time](missMemory),
		holders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_responses_holder_total",
			Help: "Requests naming a stored response (previous_response_id, retrieval, cancellation), by how its holder was found: book, lookup, unknown, unanswered, skipped, busy.",
		}, []string{"source"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_responses_lookup_requests_total",
			Help: "Lookup requests (GET /v1/responses/{id}) sent to replicas, by outcome: found, not_found, error, timeout (lookup_timeout ran out first).",
		}, []string{"outcome"}),
		forgotten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_responses_forgotten_total",
			Help: "Response ids forgotten to keep within responses.memory (their next request needs a lookup).",
		}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_responses_lost_total",
			Help: "Holders unlearned because they answered 404 for the response they were remembered for (an engine restarted and lost its store).",
		}),
	}
	if s.client == nil {
		s.client = enginehttp.Plain() // direct: an HTTP_PROXY is not the way to the replicas
	}
	if opts.Registerer != nil {
		remembered := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvroute_responses_remembered",
			Help: "Response ids whose holder the router remembers.",
		}, func() float64 { return float64(s.Len()) })
		for _, c := range []prometheus.Collector{s.holders, s.requests, s.forgotten, s.lost, remembered} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("respstore: %w", err)
			}
		}
	}
	return s, nil
}

// Len is how many ids the Store remembers a holder of.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held.m)
}

// Stored records that the replica at addr stores (or is about to store)
// the response id.
func (s *Store) Stored(id, addr string) {
	if id == "" || len(id) > MaxIDBytes || addr == "" {
		return
	}
	s.mu.Lock()
	evicted := s.held.put(id, addr)
	s.missed.drop(id)
	s.mu.Unlock()
	if evicted {
		s.forgotten.Inc()
	}
}

// Lost forgets that the replica at addr stores id (it answered 404 for
// it); a holder recorded since, elsewhere, stays.
func (s *Store) Lost(id, addr string) {
	s.mu.Lock()
	a, ok := s.held.get(id)
	lost := ok && a == addr
	if lost {
		s.held.drop(id)
	}
	s.mu.Unlock()
	if lost {
		s.lost.Inc()
	}
}

// Remembered returns the holder of id the Store remembers, "" for none; it
// asks no replica and counts nothing (the admin API's explanations).
func (s *Store) Remembered(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	addr, _ := s.held.get(id)
	return addr
}

// Holder returns the address of the replica storing response id, asking
// model's replicas when it is not known (see the package comment); "" when
// none is known to, with how the answer was reached.
func (s *Store) Holder(ctx context.Context, model, id string) (string, Source) {
	addr, src := s.holder(ctx, model, id)
	s.holders.WithLabelValues(string(src)).Inc()
	return addr, src
}

// Elsewhere looks for response id on model's replicas other than the one at
// not, the holder remembered (or found) for it that the caller cannot use:
// a proxy that retried the request that stored it on another replica made
// that one the holder. The answer is remembered as Holder's is; "" when no
// other replica has it (the remembered holder is kept).
func (s *Store) Elsewhere(ctx context.Context, model, id, not string) (string, Source) {
	addr, src := s.find(ctx, model, id, not)
	s.holders.WithLabelValues(string(src)).Inc()
	return addr, src
}

func (s *Store) holder(ctx context.Context, model, id string) (string, Source) {
	s.mu.Lock()
	addr, ok := s.held.get(id)
	s.mu.Unlock()
	if ok {
		return addr, SourceBook
	}
	return s.find(ctx, model, id, "")
}

// find looks id up on model's replicas other than the one at not (see
// the package comment for the bounds).
func (s *Store) find(ctx context.Context, model, id, not string) (string, Source) {
	if id == "" || len(id) > MaxIDBytes {
		return "", SourceSkipped
	}
	now := s.opts.Now()
	s.mu.Lock()
	missedAt, missed := s.missed.get(id)
	s.mu.Unlock()
	switch {
	case s.cfg.DisableLookup || s.opts.Addresses == nil:
		return "", SourceSkipped
	case missed && now.Sub(missedAt) < MissTTL:
		return "", SourceSkipped
	}
	// Requests naming one id at once (a client's parallel polls, a burst
	// after a restart) share one lookup: only the first asks, on its own
	// goroutine. The lookup belongs to all of them, so it runs on no
	// request's cancellation: had the first request gone, the others would
	// get no holder. lookup_timeout bounds the wait of each.
	v, _, _ := s.flight.Do(model+"\x00"+id+"\x00"+not, func() (any, error) {
		addr, src := s.ask(context.WithoutCancel(ctx), model, id, not, now)
		return found{addr, src}, nil
	})
	f := v.(found)
	return f.addr, f.src
}

// found is a lookup's answer, shared by the requests that joined it.
type found struct {
	addr string
	src  Source
}

// ask runs one lookup for find, within lookup_concurrency.
func (s *Store) ask(ctx context.Context, model, id, not string, now time.Time) (string, Source) {
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		return "", SourceBusy
	}
	var addrs []string
	for _, a := range s.opts.Addresses(model) {
		if a != not && len(addrs) < s.cfg.LookupFanout {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return "", SourceSkipped
	}
	addr, notFound := s.lookup(ctx, addrs, id)
	switch {
	case addr != "":
		s.Stored(id, addr)
		return addr, SourceLookup
	case notFound < len(addrs):
		return "", SourceUnanswered
	}
	s.mu.Lock()
	s.missed.put(id, now)
	s.mu.Unlock()
	return "", SourceUnknown
}

// answer is one replica's answer to a lookup.
type answer int

const (
	answerNone     answer = iota // no answer: an error, a timeout, or no longer needed
	answerFound                  // 200
	answerNotFound               // 404
)

// lookup asks every address at once whether it stores id, and returns the
// first that does ("" when none did within the timeout) and how many
// answered that they do not. Every request has ended when it returns.
func (s *Store) lookup(ctx context.Context, addrs []string, id string) (string, int) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.LookupTimeout)
	defer cancel()
	found := make(chan string, len(addrs))
	var notFound atomic.Int64
	var wg sync.WaitGroup
	for _, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch s.stores(ctx, a, id) {
			case answerFound:
				found <- a
				cancel() // the others need not answer
			case answerNotFound:
				notFound.Add(1)
			}
		}()
	}
	wg.Wait()
	close(found)
	return <-found, int(notFound.Load()) // "" when the channel is empty
}

// stores asks the replica at addr for response id. Outcomes are counted:
// found, not_found, error, and timeout when lookup_timeout ran out first
// (a request no longer needed, the holder found elsewhere or the caller
// gone, is not).
func (s *Store) stores(ctx context.Context, addr, id string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/responses/"+url.PathEscape(id), nil)
	if err != nil {
		s.requests.WithLabelValues("error").Inc()
		return answerNone
	}
	resp, err := s.client.Do(req)
	if err != nil {
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			s.requests.WithLabelValues("timeout").Inc()
		case ctx.Err() == nil:
			s.requests.WithLabelValues("error").Inc()
			s.opts.Logger.Debug("response lookup failed", slog.String("addr", addr), slog.Any("err", err))
		}
		return answerNone
	}
	// The stored response itself is not needed; a bounded drain lets the
	// connection be reused for a short one.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		s.requests.WithLabelValues("found").Inc()
		return answerFound
	case http.StatusNotFound:
		s.requests.WithLabelValues("not_found").Inc()
		return answerNotFound
	}
	s.requests.WithLabelValues("error").Inc()
	return answerNone
}

// ring is a map of at most len(order) entries that forgets the oldest put
// first.
type ring[V any] struct {
	m     map[string]ringEntry[V]
	order []string // ids in the order put; "" for a free slot
	next  int      // the slot the next put takes
}

type ringEntry[V any] struct {
	v    V
	slot int
}

func newRing[V any](n int) ring[V] {
	return ring[V]{m: make(map[string]ringEntry[V]), order: make([]string, n)}
}

func (r *ring[V]) get(id string) (V, bool) {
	e, ok := r.m[id]
	return e.v, ok
}

// put sets id's value, as the newest entry; the oldest is forgotten when
// the ring is full (evicted reports it).
func (r *ring[V]) put(id string, v V) (evicted bool) {
	if e, ok := r.m[id]; ok {
		r.order[e.slot] = ""
	}
	if old := r.order[r.next]; old != "" {
		delete(r.m, old)
		evicted = true
	}
	r.order[r.next] = id
	r.m[id] = ringEntry[V]{v: v, slot: r.next}
	r.next = (r.next + 1) % len(r.order)
	return evicted
}

func (r *ring[V]) drop(id string) {
	if e, ok := r.m[id]; ok {
		r.order[e.slot] = ""
		delete(r.m, id)
	}
}
