package telemetry

import (
	"io"
	"strings"
	"testing"
)

func TestConfig(t *testing.T) {
	tests := []struct {
		name string
		in   Config
		want []string // errors, each with its field path; none: valid
	}{
		{"defaults", Config{}, nil},
		{"json debug", Config{LogLevel: "debug", LogFormat: "json"}, nil},
		{"bad level", Config{LogLevel: "loud"}, []string{`log_level: "loud": want debug, info, warn or error`}},
		{"both bad", Config{LogLevel: "INFO", LogFormat: "xml"}, []string{"log_level: ", `log_format: "xml": want text or json`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.in.WithDefaults()
			if c.ServiceName != DefaultServiceName {
				t.Errorf("service name %q", c.ServiceName)
			}
			err := c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				// A valid config builds a logger.
				if _, err := NewLogger(io.Discard, c.LogLevel, c.LogFormat); err != nil {
					t.Fatalf("valid config, NewLogger: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if n := len(strings.Split(err.Error(), "\n")); n != len(tt.want) {
				t.Errorf("%d errors, want %d", n, len(tt.want))
			}
		})
	}
}
