package discovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// StaticSource publishes a fixed replica set once.
type StaticSource struct {
	name     string
	replicas []Replica
}

var _ Source = (*StaticSource)(nil)

// Static returns a source that publishes replicas (normalized and validated
// by Run, see Normalize; Ready is taken as given) once, then waits for its
// context. Its snapshots are named "static". Typical use:
// Static(ParseReplicas(...)) for replicas inlined in the router's config.
func Static(replicas []Replica) *StaticSource {
	return &StaticSource{name: "static", replicas: slices.Clone(replicas)}
}

// Run publishes the set and blocks until ctx ends. An invalid set is
// returned as an error matching ErrInvalid, before anything is sent.
func (s *StaticSource) Run(ctx context.Context, updates chan<- Snapshot) error {
	rs, err := Normalize("replicas", s.replicas)
	if err != nil {
		return fmt.Errorf("discovery: static: %w", err)
	}
	select {
	case updates <- Snapshot{Source: s.name, Replicas: rs}:
	case <-ctx.Done():
		return nil
	}
	<-ctx.Done()
	return nil
}

// FileConfig configures a FileSource.
type FileConfig struct {
	// Name is the snapshots' Source; default "file".
	Name string `yaml:"-"`
	// Path is the YAML file (see ParseReplicas for the format). Required.
	Path string `yaml:"path"`
	// Interval between reads; default DefaultFileInterval.
	Interval time.Duration `yaml:"interval"`
	// Logger; nil discards.
	Logger *slog.Logger `yaml:"-"`
	// Registerer for the source's metrics; nil registers none.
	Registerer prometheus.Registerer `yaml:"-"`
}

// WithDefaults returns c with Name and Interval defaulted.
func (c FileConfig) WithDefaults() FileConfig {
	if c.Name == "" {
		c.Name = "file"
	}
	if c.Interval == 0 {
		c.Interval = DefaultFileInterval
	}
	return c
}

// Validate reports every problem, each prefixed with its field's YAML path
// ("path: is required").
func (c FileConfig) Validate() error { return errors.Join(c.check("")...) }

func (c FileConfig) check(prefix string) []error {
	var errs []error
	if c.Path == "" {
		errs = append(errs, &FieldError{prefix + "path", "is required"})
	}
	if c.Interval < 0 {
		errs = append(errs, &FieldError{prefix + "interval", "must not be negative"})
	}
	return errs
}

// FileSource publishes the replicas listed in a YAML file and reloads it when
// its content changes.
//
// Change detection polls: every Interval the file is read in full and its
// bytes compared with the last read. Polling (rather than inotify) follows a
// Kubernetes ConfigMap's atomic symlink swap, editors that replace the file,
// and network file systems alike, at the cost of up to Interval of delay.
// A failed reload keeps the last good set: a read failure is counted on
// every attempt and logged when it starts; invalid content is counted and
// logged once per distinct content (kvroute_discovery_refresh_errors_total).
type FileSource struct {
	cfg FileConfig
	log *slog.Logger
	m   *metrics
}

var _ Source = (*FileSource)(nil)

// NewFile validates cfg and registers the source's metrics. It starts
// nothing and does not read the file (Run does).
func NewFile(cfg FileConfig) (*FileSource, error) {
	if errs := cfg.check("file."); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	cfg = cfg.WithDefaults()
	m, err := newMetrics(cfg.Registerer, cfg.Name)
	if err != nil {
		return nil, err
	}
	return &FileSource{cfg: cfg, log: loggerOr(cfg.Logger), m: m}, nil
}

// Run loads the file and publishes its replicas, then polls it. If the first
// load fails Run returns that error (matching ErrInvalid when the content
// is bad) without sending: a replica file that is wrong at start is a
// configuration error, not a transient one.
func (s *FileSource) Run(ctx context.Context, updates chan<- Snapshot) error {
	pub := &publisher{source: s.cfg.Name, log: s.log, m: s.m}
	content, rs, err := s.load()
	if err != nil {
		s.m.errors.Inc()
		return err
	}
	if !pub.publish(ctx, updates, rs) {
		return nil
	}
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	seen := content // last content parsed, good or bad
	readFailing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		data, err := os.ReadFile(s.cfg.Path)
		if err != nil {
			s.m.errors.Inc()
			if !readFailing {
				readFailing = true
				s.log.Warn("discovery: cannot read replica file, keeping the last good replica set",
					"source", s.cfg.Name, "path", s.cfg.Path, "error", err)
			}
			continue
		}
		if readFailing {
			readFailing = false
			s.log.Info("discovery: replica file readable again", "source", s.cfg.Name, "path", s.cfg.Path)
		}
		if bytes.Equal(data, seen) {
			continue
		}
		seen = data
		rs, err := ParseReplicas(data)
		if err != nil {
			// Counted and logged once per distinct bad content.
			s.m.errors.Inc()
			s.log.Warn("discovery: replica file reload failed, keeping the last good replica set",
				"source", s.cfg.Name, "path", s.cfg.Path, "error", err)
			continue
		}
		s.log.Info("discovery: replica file reloaded", "source", s.cfg.Name, "path", s.cfg.Path, "replicas", len(rs))
		if !pub.publish(ctx, updates, rs) {
			return nil
		}
	}
}

func (s *FileSource) load() ([]byte, []Replica, error) {
	data, err := os.ReadFile(s.cfg.Path)
	if err != nil {
		return nil, nil, fmt.Errorf("discovery: file: %w", err)
	}
	rs, err := ParseReplicas(data)
	if err != nil {
		return nil, nil, fmt.Errorf("discovery: file %s: %w", s.cfg.Path, err)
	}
	return data, rs, nil
}
