package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestAPIKey: with --api-key the /v1 paths answer 401 {"error":
// "Unauthorized"} to a request without the key as a bearer token (any
// case of the scheme), as vLLM's middleware does, and serve one with it;
// /health, /metrics and /tokenize stay open.
func TestAPIKey(t *testing.T) {
	s := startSim(t, "--kv-events-disable", "--api-key", "sk-test", "--enable-scale-out")
	do := func(method, path, auth, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, s.base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	chat := `{"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}`
	for _, c := range []struct {
		method, path, auth, body string
		want                     int
	}{
		{"GET", "/v1/models", "", "", 401},
		{"GET", "/v1/models", "Bearer sk-wrong", "", 401},
		{"GET", "/v1/models", "Basic sk-test", "", 401},
		{"GET", "/v1/models", "Bearer sk-test", "", 200},
		{"GET", "/v1/models", "bearer sk-test", "", 200},
		{"POST", "/v1/chat/completions", "", chat, 401},
		{"POST", "/v1/chat/completions", "Bearer sk-test", chat, 200},
		{"POST", "/v1/chat/completions/render", "", chat, 401},
		{"POST", "/v1/chat/completions/render", "Bearer sk-test", chat, 200},
		{"GET", "/health", "", "", 200},
		{"GET", "/metrics", "", "", 200},
		{"POST", "/tokenize", "", `{"model": "sim-model", "prompt": "hi"}`, 200},
	} {
		code, body := do(c.method, c.path, c.auth, c.body)
		if code != c.want || (code == 401 && body != `{"error":"Unauthorized"}`) {
			t.Errorf("%s %s (%q): %d %s, want %d", c.method, c.path, c.auth, code, body, c.want)
		}
	}
}
