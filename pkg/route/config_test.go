package route

import (
	"strings"
	"testing"
	"time"
)

func TestApproxConfig(t *testing.T) {
	tests := []struct {
		name string
		in   ApproxConfig
		want ApproxConfig
		errs []string
	}{
		{"defaults", ApproxConfig{}, ApproxConfig{TTL: DefaultApproxTTL, MaxEntries: DefaultApproxMaxEntries}, nil},
		{"set", ApproxConfig{TTL: time.Second, MaxEntries: 10}, ApproxConfig{TTL: time.Second, MaxEntries: 10}, nil},
		{"negative", ApproxConfig{TTL: -1, MaxEntries: -1}, ApproxConfig{TTL: -1, MaxEntries: -1},
			[]string{"ttl: -1ns: must be positive", "max_entries: -1: must be positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.in.WithDefaults()
			if got != tt.want {
				t.Fatalf("WithDefaults = %+v, want %+v", got, tt.want)
			}
			err := got.Validate()
			if len(tt.errs) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.errs {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
