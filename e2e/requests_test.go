//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// prompt returns a deterministic text of about n words, distinct per tag.
func prompt(tag string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s-%d ", tag, i%97)
	}
	return b.String()
}

// TestClientDestinationHeaderIgnored: a client cannot pick its upstream.
// The header is stripped before ext_proc and kvroute sets its own.
func TestClientDestinationHeaderIgnored(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	ctx := t.Context()
	msgs := []message{{Role: "user", Content: prompt("pinned", 300)}}

	// Warm one replica with the prompt, through Envoy.
	first := c.chat(ctx, msgs, 4, nil)
	if first.err != nil || first.status != 200 {
		t.Fatalf("warm-up: %d %v %s", first.status, first.err, first.body)
	}
	holder := first.upstream
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": msgs, "max_tokens": 4})
	waitFor(t, 20*time.Second, "the index to learn the warm-up prompt", func() bool {
		m, err := c.matched(body)
		return err == nil && m[holder] > 0
	})
	var other string
	for _, e := range c.engines {
		if e.addr() != holder {
			other = e.addr()
			break
		}
	}

	tests := []struct {
		name, header, value string
	}{
		{"another replica", "x-gateway-destination-endpoint", other},
		{"an address that is not a replica", "x-gateway-destination-endpoint", "127.0.0.1:1"},
		{"fallback header", "x-gateway-destination-endpoint-fallback", "127.0.0.1:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c.waitPick(t, body, holder)
			r := c.chat(ctx, msgs, 4, map[string]string{tt.header: tt.value})
			if r.err != nil || r.status != 200 {
				t.Fatalf("request with %s: %s: %d %v %s", tt.header, tt.value, r.status, r.err, r.body)
			}
			if r.upstream != holder {
				t.Fatalf("landed on %s, want the cache holder %s (the client asked for %s)", r.upstream, holder, tt.value)
			}
			if r.cached == 0 {
				t.Fatalf("no cached tokens on the holder: %s", r.body)
			}
		})
	}
}

// TestMalformedBody: a bad body gets a 400 with a JSON error from kvroute,
// and the router keeps serving.
func TestMalformedBody(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	ctx := t.Context()
	bad := []struct {
		name, path, body string
	}{
		{"truncated JSON", "/v1/chat/completions", `{"model": "sim-model", "messages": [`},
		{"messages not an array", "/v1/chat/completions", `{"model": "sim-model", "messages": "hi"}`},
		{"prompt of the wrong type", "/v1/completions", `{"model": "sim-model", "prompt": {"a": 1}}`},
		{"not JSON at all", "/v1/completions", `model=sim-model&prompt=hi`},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			r := c.post(ctx, tt.path, []byte(tt.body), nil)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.status != 400 {
				t.Fatalf("status %d, want 400: %s", r.status, r.body)
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Message == "" {
				t.Fatalf("body is not a JSON error (%v): %s", err, r.body)
			}
			if r.upstream != "" {
				t.Fatalf("a malformed request reached upstream %s", r.upstream)
			}
		})
	}
	// Still serving.
	for i := range 4 {
		r := c.chat(ctx, []message{{Role: "user", Content: prompt(fmt.Sprint("after", i), 50)}}, 4, nil)
		if r.err != nil || r.status != 200 {
			t.Fatalf("request after the bad ones: %d %v %s", r.status, r.err, r.body)
		}
	}
	// A large body (Envoy buffers it for kvroute) is routed, not refused by
	// Envoy's buffer limit; the engine itself rejects a prompt this long.
	t.Run("2 MiB body", func(t *testing.T) {
		body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 1,
			"messages": []message{{Role: "user", Content: strings.Repeat("lorem ipsum ", 2<<20/12)}}})
		r := c.post(ctx, "/v1/chat/completions", body, nil)
		if r.err != nil || r.status == 413 || r.upstream == "" {
			t.Fatalf("status %d err %v upstream %q: %.200s", r.status, r.err, r.upstream, r.body)
		}
	})
	if !c.kv.Proc.Running() {
		t.Fatal("kvroute exited")
	}
}

// TestBodyIdentityKeysTheSession: a client without the session header
// names its session in the body (the OpenAI user field, prompt_cache_key,
// a conversation id), and through Envoy and ext_proc the router keys the
// decision by it, in route.SessionKey's order; the header still wins.
func TestBodyIdentityKeysTheSession(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 2, kvExtra: "routing: {decision_history: 16}\n"})
	ctx := t.Context()
	chatBody := func(tag string, extra map[string]any) []byte {
		m := map[string]any{"model": "sim-model", "max_tokens": 4,
			"messages": []message{{Role: "user", Content: prompt(tag, 40)}}}
		for k, v := range extra {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		return b
	}
	tests := []struct {
		name, path string
		body       []byte
		hdr        map[string]string
		want       string
	}{
		{"user field", "/v1/chat/completions", chatBody("id-user", map[string]any{"user": "alice"}), nil, "user:alice"},
		{"prompt_cache_key before user", "/v1/chat/completions",
			chatBody("id-pck", map[string]any{"user": "alice", "prompt_cache_key": "thread-7"}), nil, "pck:thread-7"},
		{"a conversation the body names", "/v1/completions",
			[]byte(`{"model":"sim-model","prompt":"` + prompt("id-sid", 40) + `","max_tokens":4,"user":"bob","metadata":{"session_id":"run-3"}}`), nil, "sid:run-3"},
		{"the header wins", "/v1/chat/completions", chatBody("id-hdr", map[string]any{"user": "alice", "session_id": "s-9"}),
			map[string]string{"x-session-id": "hdr-1"}, "hdr-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := c.post(ctx, tt.path, tt.body, tt.hdr)
			if r.err != nil || r.status != 200 {
				t.Fatalf("%d %v %s", r.status, r.err, r.body)
			}
			var out struct {
				Decisions []struct {
					Decision struct {
						Session string `json:"session"`
						Replica string `json:"replica"`
					} `json:"decision"`
				} `json:"decisions"`
			}
			if err := c.adminJSON("/debug/decisions?limit=1", &out); err != nil {
				t.Fatal(err)
			}
			if len(out.Decisions) != 1 {
				t.Fatalf("%d decisions, want the newest", len(out.Decisions))
			}
			if d := out.Decisions[0].Decision; d.Session != tt.want || d.Replica != r.upstream {
				t.Fatalf("newest decision keyed %q on %s, want %q on %s (the request's upstream)", d.Session, d.Replica, tt.want, r.upstream)
			}
		})
	}
}
