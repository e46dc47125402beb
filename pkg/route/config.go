package route

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of ApproxConfig, written once.
const (
	DefaultApproxTTL        = 2 * time.Minute
	DefaultApproxMaxEntries = 1 << 18
)

// ApproxConfig configures an ApproxIndex. It is the "routing.approximate"
// section of kvroute's config file.
type ApproxConfig struct {
	// TTL is how long a dispatch is remembered after the last request that
	// carried the block went to the replica. Default DefaultApproxTTL.
	TTL time.Duration `yaml:"ttl"`
	// MaxEntries bounds the (block key, replica) entries; past it the
	// least recently dispatched are evicted. Default
	// DefaultApproxMaxEntries.
	MaxEntries int `yaml:"max_entries"`
}

// WithDefaults returns c with every zero field set to its default.
func (c ApproxConfig) WithDefaults() ApproxConfig {
	if c.TTL == 0 {
		c.TTL = DefaultApproxTTL
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = DefaultApproxMaxEntries
	}
	return c
}

// Validate reports every problem of a defaulted ApproxConfig, each prefixed
// with its field's YAML path ("ttl: ...").
func (c ApproxConfig) Validate() error {
	var errs []error
	if c.TTL <= 0 {
		errs = append(errs, fmt.Errorf("ttl: %v: must be positive", c.TTL))
	}
	if c.MaxEntries <= 0 {
		errs = append(errs, fmt.Errorf("max_entries: %d: must be positive", c.MaxEntries))
	}
	return errors.Join(errs...)
}
