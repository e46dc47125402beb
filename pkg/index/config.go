package index

import "fmt"

// DefaultMaxBytes is Config.MaxBytes after WithDefaults: 1 GiB.
const DefaultMaxBytes = 1 << 30

// Config configures an Index. It is the "index" section of kvroute's
// config file.
type Config struct {
	// MaxBytes bounds Stats.Bytes. Over budget, router-side entries are
	// evicted, least recently stored or matched first (CLOCK, see the
	// package comment): eviction loses affinity, never correctness. New
	// takes 0 as unbounded; WithDefaults sets DefaultMaxBytes.
	MaxBytes int64 `yaml:"max_bytes"`
}

// WithDefaults returns c with MaxBytes set to DefaultMaxBytes when 0.
func (c Config) WithDefaults() Config {
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	return c
}

// Validate reports a bad field with its YAML path ("max_bytes: ...").
func (c Config) Validate() error {
	if c.MaxBytes < 0 {
		return fmt.Errorf("max_bytes: %d: must not be negative", c.MaxBytes)
	}
	return nil
}
