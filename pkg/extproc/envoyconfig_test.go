package extproc

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/kvroute/kvroute/pkg/admin"
)

// TestShippedEnvoyLimitsAgree renders the shipped Envoy configurations and
// checks that the body Envoy buffers for ext_proc is exactly what the
// router accepts by default: more would reach a router that answers 413
// for bodies Envoy meant to route; a gRPC limit below it (the old 4 MiB
// default) made Envoy fail open and route 4–16 MiB prompts blind.
func TestShippedEnvoyLimitsAgree(t *testing.T) {
	files, err := filepath.Glob("../../envoy/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Envoy configs found: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var doc any
			if err := yaml.Unmarshal(data, &doc); err != nil {
				t.Fatalf("%s is not YAML: %v", f, err)
			}
			limits := findKey(doc, "request_body_buffer_limit")
			modes := findKey(doc, "request_body_mode")
			if len(modes) == 0 {
				t.Fatalf("%s has no ext_proc request_body_mode", f)
			}
			if len(limits) == 0 {
				t.Fatalf("%s sets no request_body_buffer_limit (Envoy's default buffers far less than the router accepts)", f)
			}
			for _, l := range limits {
				n, err := strconv.Atoi(l)
				if err != nil || n != DefaultMaxBodyBytes {
					t.Errorf("%s: request_body_buffer_limit %s, want %d (extproc.DefaultMaxBodyBytes)", f, l, DefaultMaxBodyBytes)
				}
				if got := (Config{MaxBodyBytes: n}).MaxRecvMsgBytes(); got <= n {
					t.Errorf("%s: gRPC receive limit %d does not admit a %d-byte body", f, got, n)
				}
			}
		})
	}
	// The chart's Envoy bootstrap is a template; its limit is a literal.
	data, err := os.ReadFile("../../charts/kvroute/files/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`request_body_buffer_limit:\s*(\d+)`).FindAllSubmatch(data, -1)
	if len(m) == 0 {
		t.Fatal("chart envoy.yaml sets no request_body_buffer_limit")
	}
	for _, s := range m {
		if string(s[1]) != strconv.Itoa(DefaultMaxBodyBytes) {
			t.Errorf("chart envoy.yaml: request_body_buffer_limit %s, want %d", s[1], DefaultMaxBodyBytes)
		}
	}
}

// TestExplainTakesTheSameBodies: the admin explain endpoint reads request
// bodies as ext_proc does; its HTTP limit is the same setting's default.
func TestExplainTakesTheSameBodies(t *testing.T) {
	if admin.MaxExplainBody != DefaultMaxBodyBytes {
		t.Errorf("admin.MaxExplainBody %d, extproc.DefaultMaxBodyBytes %d: explain and routing would accept different bodies", admin.MaxExplainBody, DefaultMaxBodyBytes)
	}
}

// findKey returns the scalar values of every mapping key named key.
func findKey(v any, key string) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if k == key {
				out = append(out, scalar(val))
			}
			out = append(out, findKey(val, key)...)
		}
	case []any:
		for _, e := range x {
			out = append(out, findKey(e, key)...)
		}
	}
	return out
}

func scalar(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int:
		return strconv.Itoa(x)
	}
	return ""
}
