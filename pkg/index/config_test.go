package index

import (
	"strings"
	"testing"
)

func TestConfig(t *testing.T) {
	tests := []struct {
		in      Config
		want    int64
		wantErr string
	}{
		{Config{}, DefaultMaxBytes, ""},
		{Config{MaxBytes: 4096}, 4096, ""},
		{Config{MaxBytes: -1}, -1, "max_bytes: -1: must not be negative"},
	}
	for _, tt := range tests {
		c := tt.in.WithDefaults()
		if c.MaxBytes != tt.want {
			t.Errorf("%+v.WithDefaults().MaxBytes = %d, want %d", tt.in, c.MaxBytes, tt.want)
		}
		err := c.Validate()
		if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%+v: Validate = %v, want %q", tt.in, err, tt.wantErr)
		}
	}
}
