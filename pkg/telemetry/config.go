package telemetry

import (
	"errors"
	"fmt"
)

// Defaults of Config, written once.
const (
	DefaultServiceName = "kvroute"
	DefaultLogLevel    = "info"
	DefaultLogFormat   = "text"
)

// Config is the "telemetry" section of kvroute's config file: the service
// name traces carry, and the log level and format. Tracing itself follows
// the standard OTEL_* environment variables. Zero fields take the Default*
// values (WithDefaults).
type Config struct {
	ServiceName string `yaml:"service_name"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// LogFormat is text or json.
	LogFormat string `yaml:"log_format"`
}

// WithDefaults returns c with every empty field set to its default.
func (c Config) WithDefaults() Config {
	if c.ServiceName == "" {
		c.ServiceName = DefaultServiceName
	}
	if c.LogLevel == "" {
		c.LogLevel = DefaultLogLevel
	}
	if c.LogFormat == "" {
		c.LogFormat = DefaultLogFormat
	}
	return c
}

// Validate reports every problem of a defaulted Config, each prefixed with
// its field's YAML path ("log_level: ...").
func (c Config) Validate() error {
	var errs []error
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log_level: %q: want debug, info, warn or error", c.LogLevel))
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		errs = append(errs, fmt.Errorf("log_format: %q: want text or json", c.LogFormat))
	}
	return errors.Join(errs...)
}
