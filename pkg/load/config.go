package load

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of Config (and of ScraperConfig and FidelityConfig, whose zero
// fields take the same values), written once.
const (
	DefaultScrapeInterval = 200 * time.Millisecond
	DefaultScrapeTimeout  = 300 * time.Millisecond
	// DefaultIdleScrapeInterval is the scrape interval of a router that
	// routes nothing (capped by WithDefaults at half of stale_after).
	DefaultIdleScrapeInterval = time.Second
	DefaultFidelityAlpha      = 0.1
	DefaultFidelityFloor      = 0.25
	DefaultFidelityMinSamples = 8
	// DefaultStaleAfter is in view.go.
)

// Config is the "load" section of kvroute's config file: engine scrapes,
// the staleness bound of scraped figures and the cache-fidelity signal.
// Zero fields take the Default* values (WithDefaults).
type Config struct {
	// ScrapeInterval between probes of one engine's /health and /metrics.
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	// IdleScrapeInterval is the interval between probes of one engine
	// while the router routes nothing: no request started since the last
	// probe and none in flight to that engine, and its last probe
	// succeeded. Routing resumes the ScrapeInterval at its next tick. It
	// must be at least scrape_interval (equal: no slowdown) and below
	// stale_after, so that the first request after a quiet spell still
	// sees scraped figures. Default DefaultIdleScrapeInterval, capped at
	// half of stale_after.
	IdleScrapeInterval time.Duration `yaml:"idle_scrape_interval"`
	// ScrapeTimeout bounds each probe request.
	ScrapeTimeout time.Duration `yaml:"scrape_timeout"`
	// StaleAfter: older scraped figures are not used.
	StaleAfter time.Duration `yaml:"stale_after"`
	// FidelityAlpha, FidelityFloor and FidelityMinSamples tune the cache
	// credit derived from served vs predicted cached tokens
	// (FidelityConfig's Alpha, Floor and MinSamples).
	FidelityAlpha      float64 `yaml:"fidelity_alpha"`
	FidelityFloor      float64 `yaml:"fidelity_floor"`
	FidelityMinSamples int     `yaml:"fidelity_min_samples"`
}

// WithDefaults returns c with every zero field set to its default.
// Negative or out-of-range values are left for Validate to report.
func (c Config) WithDefaults() Config {
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = DefaultScrapeInterval
	}
	if c.ScrapeTimeout == 0 {
		c.ScrapeTimeout = DefaultScrapeTimeout
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = DefaultStaleAfter
	}
	if c.IdleScrapeInterval == 0 && c.ScrapeInterval > 0 && c.StaleAfter > 0 {
		c.IdleScrapeInterval = max(min(DefaultIdleScrapeInterval, c.StaleAfter/2), c.ScrapeInterval)
	}
	c.FidelityAlpha, c.FidelityFloor, c.FidelityMinSamples = c.Fidelity().defaulted()
	return c
}

// Validate reports every problem of a defaulted Config, each prefixed with
// its field's YAML path ("scrape_timeout: must be positive").
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct {
		field string
		d     time.Duration
	}{{"scrape_interval", c.ScrapeInterval}, {"scrape_timeout", c.ScrapeTimeout}, {"stale_after", c.StaleAfter}} {
		if f.d <= 0 {
			errs = append(errs, fmt.Errorf("%s: %v: must be positive", f.field, f.d))
		}
	}
	if c.IdleScrapeInterval < 0 {
		errs = append(errs, fmt.Errorf("idle_scrape_interval: %v: must be positive", c.IdleScrapeInterval))
	}
	if c.IdleScrapeInterval > 0 && c.ScrapeInterval > 0 && c.IdleScrapeInterval < c.ScrapeInterval {
		errs = append(errs, fmt.Errorf("idle_scrape_interval: %v: must be at least scrape_interval (%v)", c.IdleScrapeInterval, c.ScrapeInterval))
	}
	if c.IdleScrapeInterval > 0 && c.StaleAfter > 0 && c.IdleScrapeInterval >= c.StaleAfter {
		errs = append(errs, fmt.Errorf("idle_scrape_interval: %v: must be below stale_after (%v)", c.IdleScrapeInterval, c.StaleAfter))
	}
	errs = append(errs, c.Fidelity().validate("fidelity_alpha", "fidelity_floor", "fidelity_min_samples")...)
	return errors.Join(errs...)
}

// Scraper returns the ScraperConfig for c's settings; the caller adds the
// Tracker, Logger and Registerer.
func (c Config) Scraper() ScraperConfig {
	return ScraperConfig{Interval: c.ScrapeInterval, IdleInterval: c.IdleScrapeInterval, Timeout: c.ScrapeTimeout}
}

// Fidelity returns the FidelityConfig for c's settings.
func (c Config) Fidelity() FidelityConfig {
	return FidelityConfig{Alpha: c.FidelityAlpha, Floor: c.FidelityFloor, MinSamples: c.FidelityMinSamples}
}

// defaulted returns the fidelity settings with zero fields defaulted.
func (c FidelityConfig) defaulted() (alpha, floor float64, minSamples int) {
	alpha, floor, minSamples = c.Alpha, c.Floor, c.MinSamples
	if alpha == 0 {
		alpha = DefaultFidelityAlpha
	}
	if floor == 0 {
		floor = DefaultFidelityFloor
	}
	if minSamples == 0 {
		minSamples = DefaultFidelityMinSamples
	}
	return alpha, floor, minSamples
}

// validate reports every bad fidelity setting under the given field names.
func (c FidelityConfig) validate(alpha, floor, minSamples string) []error {
	var errs []error
	if !(c.Alpha > 0 && c.Alpha <= 1) {
		errs = append(errs, fmt.Errorf("%s: %v: must be in (0, 1]", alpha, c.Alpha))
	}
	if !(c.Floor >= 0 && c.Floor <= 1) {
		errs = append(errs, fmt.Errorf("%s: %v: must be in [0, 1]", floor, c.Floor))
	}
	if c.MinSamples < 0 {
		errs = append(errs, fmt.Errorf("%s: %d: must not be negative", minSamples, c.MinSamples))
	}
	return errs
}
