package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Resolver is the part of *net.Resolver the DNS source uses (tests inject a
// fake).
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
	LookupSRV(ctx context.Context, service, proto, name string) (cname string, addrs []*net.SRV, err error)
}

var _ Resolver = (*net.Resolver)(nil)

// IP families a source may be restricted to.
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// DNSConfig configures a DNSSource.
type DNSConfig struct {
	// Name is the snapshots' Source; default "dns".
	Name string `yaml:"-"`
	// Host is the name to resolve, e.g. the headless Service
	// "vllm.inference.svc.cluster.local". Required.
	Host string `yaml:"host"`
	// Port is the serving port of every address (A/AAAA mode). Required
	// unless SRV is set.
	Port int `yaml:"port"`
	// SRV looks up SRV records instead: _<SRVService>._<SRVProto>.<Host>
	// (both empty: Host is the full SRV name). Each record's target is
	// resolved to its addresses and its port is the serving port.
	SRV        bool   `yaml:"srv"`
	SRVService string `yaml:"srv_service"`
	SRVProto   string `yaml:"srv_proto"`
	// IPFamily keeps only IPv4 or IPv6 addresses; empty keeps both.
	IPFamily string `yaml:"ip_family"`
	// Interval between resolutions; default DefaultDNSInterval.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one resolution; default Interval.
	Timeout time.Duration `yaml:"timeout"`
	// Defaults give model, engine, event/replay/metrics ports etc. for every
	// replica; Defaults.Model is required.
	Defaults Defaults `yaml:"defaults"`
	// Resolver; nil uses net.DefaultResolver.
	Resolver Resolver `yaml:"-"`
	// Logger; nil discards.
	Logger *slog.Logger `yaml:"-"`
	// Registerer for the source's metrics; nil registers none.
	Registerer prometheus.Registerer `yaml:"-"`
}

// WithDefaults returns c with Name, Interval and Timeout defaulted.
func (c DNSConfig) WithDefaults() DNSConfig {
	if c.Name == "" {
		c.Name = "dns"
	}
	if c.Interval == 0 {
		c.Interval = DefaultDNSInterval
	}
	if c.Timeout == 0 {
		c.Timeout = c.Interval
	}
	return c
}

// Validate reports every problem, each prefixed with its field's YAML path
// ("host: is required").
func (c DNSConfig) Validate() error { return errors.Join(c.check("")...) }

// check validates the YAML fields; prefix is prepended to every path.
func (c DNSConfig) check(prefix string) []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{prefix + field, fmt.Sprintf(format, args...)})
	}
	if c.Host == "" {
		bad("host", "is required")
	}
	if !c.SRV && (c.Port < 1 || c.Port > 65535) {
		bad("port", "%d is outside [1, 65535] (required without srv)", c.Port)
	}
	if c.SRV && (c.SRVService == "") != (c.SRVProto == "") {
		bad("srv_service", "srv_service and srv_proto must be both set or both empty")
	}
	if c.IPFamily != "" && c.IPFamily != IPv4 && c.IPFamily != IPv6 {
		bad("ip_family", "%q is not %q, %q or empty", c.IPFamily, IPv4, IPv6)
	}
	if c.Interval < 0 {
		bad("interval", "must not be negative")
	}
	if c.Timeout < 0 {
		bad("timeout", "must not be negative")
	}
	if c.Defaults.Model == "" {
		bad("defaults.model", "is required")
	}
	if err := validateDefaults(prefix+"defaults", c.Defaults); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// DNSSource resolves a name (A/AAAA or SRV records, typically a headless
// Service) at an interval. DNS carries no readiness, so every replica is
// Ready (a headless Service publishes only ready pods unless
// publishNotReadyAddresses is set). A "no such host" answer is an empty set;
// any other failure keeps the last good set, is logged once per failure
// streak and counted. Replica IDs are the addresses.
type DNSSource struct {
	cfg DNSConfig
	log *slog.Logger
	m   *metrics
}

var _ Source = (*DNSSource)(nil)

// NewDNS validates cfg and registers the source's metrics; it starts nothing.
func NewDNS(cfg DNSConfig) (*DNSSource, error) {
	if errs := cfg.check("dns."); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	cfg = cfg.WithDefaults()
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	m, err := newMetrics(cfg.Registerer, cfg.Name)
	if err != nil {
		return nil, err
	}
	return &DNSSource{cfg: cfg, log: loggerOr(cfg.Logger), m: m}, nil
}

// Run resolves now and then every Interval, publishing on change. It sends
// nothing until the first resolution succeeds.
func (s *DNSSource) Run(ctx context.Context, updates chan<- Snapshot) error {
	pub := &publisher{source: s.cfg.Name, log: s.log, m: s.m}
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	failing := false
	for {
		rs, invalid, errs, err := s.resolve(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			s.m.errors.Inc()
			if !failing {
				failing = true
				s.log.Warn("discovery: DNS resolution failed, keeping the last good replica set",
					"source", s.cfg.Name, "host", s.cfg.Host, "error", err)
			}
		default:
			if failing {
				failing = false
				s.log.Info("discovery: DNS resolution recovered", "source", s.cfg.Name, "host", s.cfg.Host)
			}
			pub.setInvalid(invalid, errs)
			if !pub.publish(ctx, updates, rs) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// resolve returns the current replicas (sorted), the addresses left out as
// invalid with their errors, or err when the lookup failed.
func (s *DNSSource) resolve(ctx context.Context) (rs []Replica, invalid []string, errs []error, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	type target struct {
		host string
		port int
	}
	var targets []target
	if s.cfg.SRV {
		_, srvs, err := s.cfg.Resolver.LookupSRV(ctx, s.cfg.SRVService, s.cfg.SRVProto, s.cfg.Host)
		if isNotFound(err) {
			return nil, nil, nil, nil
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("discovery: dns: %w", err)
		}
		for _, srv := range srvs {
			if srv == nil || srv.Port == 0 {
				continue
			}
			targets = append(targets, target{strings.TrimSuffix(srv.Target, "."), int(srv.Port)})
		}
	} else {
		targets = []target{{s.cfg.Host, s.cfg.Port}}
	}
	seen := make(map[string]bool)
	for _, t := range targets {
		ips, err := s.cfg.Resolver.LookupHost(ctx, t.host)
		if isNotFound(err) {
			continue
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("discovery: dns: %w", err)
		}
		for _, ip := range ips {
			a, perr := netip.ParseAddr(ip)
			if perr != nil || !s.family(a) {
				continue
			}
			ip = a.Unmap().String()
			addr := hostPort(ip, t.port)
			if seen[addr] {
				continue
			}
			seen[addr] = true
			r, rerr := newReplica("", ip, t.port, s.cfg.Defaults, overrides{}, true)
			if rerr != nil {
				invalid = append(invalid, addr)
				errs = append(errs, rerr)
				continue
			}
			rs = append(rs, r)
		}
	}
	sortByID(rs)
	return rs, invalid, errs, nil
}

func (s *DNSSource) family(a netip.Addr) bool {
	switch s.cfg.IPFamily {
	case IPv4:
		return a.Unmap().Is4()
	case IPv6:
		return a.Is6() && !a.Is4In6()
	}
	return true
}

func isNotFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}
