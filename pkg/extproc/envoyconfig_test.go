package extproc

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
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
	eachShippedConfig(t, func(t *testing.T, f string, data []byte, doc any) {
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

// TestShippedEnvoyObservesResponsesOffThePath: every shipped Envoy config
// (test/helm checks the chart's rendered one) runs the router filter without response processing
// and a second ext_proc filter in observability mode that always fails
// open, is sent DecisionHeader with the request headers, and streams the
// response; client-sent decision ids are stripped before routing and the
// id is not sent upstream.
func TestShippedEnvoyObservesResponsesOffThePath(t *testing.T) {
	eachShippedConfig(t, func(t *testing.T, f string, data []byte, doc any) {
		var router, observer map[string]any
		for _, fl := range findMaps(doc, "http_filters") {
			cfg, _ := fl["typed_config"].(map[string]any)
			switch fl["name"] {
			case "envoy.filters.http.ext_proc":
				router = cfg
			case "kvroute.ext_proc.observe":
				observer = cfg
			}
		}
		if router == nil || observer == nil {
			t.Fatalf("want the router and the observer ext_proc filters, got router %v observer %v", router != nil, observer != nil)
		}
		rm, _ := router["processing_mode"].(map[string]any)
		if rm["response_header_mode"] != "SKIP" || rm["response_body_mode"] != "NONE" || rm["response_trailer_mode"] != "SKIP" {
			t.Errorf("router filter processes the response: %v", rm)
		}
		if observer["observability_mode"] != true || observer["failure_mode_allow"] != true {
			t.Errorf("observer: observability_mode %v failure_mode_allow %v, want both true", observer["observability_mode"], observer["failure_mode_allow"])
		}
		om, _ := observer["processing_mode"].(map[string]any)
		if om["request_header_mode"] != "SEND" || om["response_header_mode"] != "SEND" || om["response_body_mode"] != "STREAMED" || om["request_body_mode"] != "NONE" {
			t.Errorf("observer processing mode %v", om)
		}
		allowed := findKey(observer, "exact")
		for _, h := range []string{DecisionHeader, ":status", "content-type"} {
			if !slices.Contains(allowed, h) {
				t.Errorf("observer is not sent %s (allowed %v)", h, allowed)
			}
		}
		if !slices.Contains(findKey(doc, "remove"), DecisionHeader) {
			t.Errorf("client-sent %s is not stripped before routing", DecisionHeader)
		}
		if !strings.Contains(string(data), "request_headers_to_remove: ["+DecisionHeader+"]") {
			t.Errorf("%s is sent upstream", DecisionHeader)
		}
	})
}

// findMaps returns the elements of every list under key in v.
func findMaps(v any, key string) []map[string]any {
	var out []map[string]any
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if k == key {
				for _, e := range asList(val) {
					if m, ok := e.(map[string]any); ok {
						out = append(out, m)
					}
				}
			}
			out = append(out, findMaps(val, key)...)
		}
	case []any:
		for _, e := range x {
			out = append(out, findMaps(e, key)...)
		}
	}
	return out
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// eachShippedConfig runs check, as a subtest, on every Envoy configuration
// shipped in envoy/: its path, bytes and YAML.
func eachShippedConfig(t *testing.T, check func(t *testing.T, f string, data []byte, doc any)) {
	t.Helper()
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
			check(t, f, data, doc)
		})
	}
}
