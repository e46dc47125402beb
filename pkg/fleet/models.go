package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Defaults of ModelsConfig.
const (
	// DefaultModelsInterval is how often each replica's /v1/models is read.
	DefaultModelsInterval = 2 * time.Second
	// DefaultModelsTimeout bounds one /v1/models request.
	DefaultModelsTimeout = time.Second
	// maxModelsBody caps the /v1/models answer read (a list of names).
	maxModelsBody = 1 << 20
)

// ModelsConfig configures a Models prober.
type ModelsConfig struct {
	// Interval between two reads of every target; 0 means
	// DefaultModelsInterval.
	Interval time.Duration
	// Timeout of one request; 0 means DefaultModelsTimeout.
	Timeout time.Duration
	// Client; nil means http.DefaultClient.
	Client *http.Client
	// Logger; nil discards. Only changes of a replica's adapters are logged.
	Logger *slog.Logger
}

// ModelsTarget is one replica whose OpenAI model list is read.
type ModelsTarget struct {
	ID  string // discovery.Replica.ID
	URL string // http://<address>/v1/models
}

// Models learns the LoRA adapters each replica serves from its OpenAI
// /v1/models list: vLLM lists every adapter loaded with --lora-modules (or
// at runtime) as a model whose `parent` is the base model. The Set adds
// them to the adapters a replica's spec lists.
//
// SetTargets and Adapters are safe for concurrent use; Run is its one
// goroutine and reads every target once per Interval, one at a time. A
// failed read keeps the last list (health decides whether the replica is
// routable); a target removed by SetTargets is forgotten.
type Models struct {
	cfg ModelsConfig
	log *slog.Logger

	mu      sync.Mutex
	targets []ModelsTarget
	known   map[string][]string // replica ID -> sorted adapters
	version uint64              // bumped whenever known changes
	wake    chan struct{}       // SetTargets asks Run for an early round
}

// NewModels returns a prober; it starts nothing.
func NewModels(cfg ModelsConfig) (*Models, error) {
	if cfg.Interval < 0 || cfg.Timeout < 0 {
		return nil, errors.New("fleet: models interval and timeout must not be negative")
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultModelsInterval
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultModelsTimeout
	}
	if cfg.Client == nil {
		cfg.Client = http.DefaultClient
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Models{cfg: cfg, log: log, known: map[string][]string{}, wake: make(chan struct{}, 1)}, nil
}

// SetTargets replaces the replicas read; new ones are read at once.
func (m *Models) SetTargets(ts []ModelsTarget) {
	m.mu.Lock()
	m.targets = slices.Clone(ts)
	for id := range m.known {
		if !slices.ContainsFunc(ts, func(t ModelsTarget) bool { return t.ID == id }) {
			delete(m.known, id)
			m.version++
		}
	}
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Adapters returns the adapters replica id was last seen serving (nil when
// none or not read yet). The slice must not be modified.
func (m *Models) Adapters(id string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.known[id]
}

// Version changes whenever some replica's adapters change.
func (m *Models) Version() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version
}

// Run reads every target each Interval (and at once after SetTargets)
// until ctx ends.
func (m *Models) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		m.mu.Lock()
		ts := m.targets
		m.mu.Unlock()
		for _, tg := range ts {
			if ctx.Err() != nil {
				return nil
			}
			as, err := m.read(ctx, tg.URL)
			if err != nil {
				continue
			}
			m.record(tg.ID, as)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-m.wake:
		}
	}
}

func (m *Models) record(id string, as []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.ContainsFunc(m.targets, func(t ModelsTarget) bool { return t.ID == id }) {
		return // removed while being read
	}
	old, seen := m.known[id]
	if seen && slices.Equal(old, as) {
		return
	}
	m.known[id] = as
	m.version++
	m.log.Info("replica adapters", slog.String("replica", id), slog.Any("lora_adapters", as))
}

// modelList is the part of an OpenAI /v1/models answer read here.
type modelList struct {
	Data []struct {
		ID     string  `json:"id"`
		Parent *string `json:"parent"`
	} `json:"data"`
}

// read fetches url and returns the sorted ids of the models that have a
// parent (vLLM's LoRA adapters).
func (m *Models) read(ctx context.Context, url string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := m.cfg.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxModelsBody))
		return nil, fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	return parseAdapters(io.LimitReader(resp.Body, maxModelsBody))
}

// parseAdapters decodes an OpenAI model list and returns the sorted,
// distinct ids of the entries with a non-empty parent.
func parseAdapters(r io.Reader) ([]string, error) {
	var l modelList
	if err := json.NewDecoder(r).Decode(&l); err != nil {
		return nil, fmt.Errorf("models list: %w", err)
	}
	var out []string
	for _, d := range l.Data {
		if d.Parent != nil && *d.Parent != "" && d.ID != "" && d.ID != *d.Parent {
			out = append(out, d.ID)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
