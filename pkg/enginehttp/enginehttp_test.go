package enginehttp

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// authEcho answers each request with the Authorization header it got.
func authEcho(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(r.Header.Get("Authorization")))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 256)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	if req.Header.Get("Authorization") != "" {
		t.Error("the caller's request was changed")
	}
	return b.String()
}

// TestBearerAndRotation: every request carries the file's key; a changed
// file is read again once the interval passed, and a re-read that fails
// (a half-written, empty file) keeps the previous key and is reported.
func TestBearerAndRotation(t *testing.T) {
	srv := authEcho(t)
	path := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte("  sk-first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reported []error
	c, err := Client(Config{APIKeyFile: path, ReloadInterval: time.Minute}, func(err error) {
		mu.Lock()
		reported = append(reported, err)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	k := c.Transport.(*bearer).key
	clock := time.Unix(1000, 0)
	k.now = func() time.Time { return clock }
	k.checked = clock
	if got := get(t, c, srv.URL); got != "Bearer sk-first" {
		t.Fatalf("Authorization %q", got)
	}
	// Rotated: not read before the interval, read after it.
	if err := os.WriteFile(path, []byte("sk-second-key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := get(t, c, srv.URL); got != "Bearer sk-first" {
		t.Errorf("before the interval: %q", got)
	}
	clock = clock.Add(time.Minute)
	if got := get(t, c, srv.URL); got != "Bearer sk-second-key" {
		t.Errorf("after the interval: %q", got)
	}
	// Emptied mid-write: the previous key stays, the failure is reported.
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Minute)
	if got := get(t, c, srv.URL); got != "Bearer sk-second-key" {
		t.Errorf("after an empty re-read: %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reported) != 1 || !strings.Contains(reported[0].Error(), "empty") {
		t.Errorf("reported %v", reported)
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	twoLines := filepath.Join(dir, "two")
	_ = os.WriteFile(empty, []byte(" \n"), 0o600)
	_ = os.WriteFile(twoLines, []byte("a\nb"), 0o600)
	for _, c := range []Config{{}, {APIKeyFile: filepath.Join(dir, "missing")}, {APIKeyFile: empty}, {APIKeyFile: twoLines}} {
		if _, err := Client(c, nil); err == nil {
			t.Errorf("%+v: a client was built", c)
		}
	}
	if err := (Config{ReloadInterval: -time.Second, APIKeyFile: "k"}).Validate(); err == nil {
		t.Error("a negative interval passed")
	}
	if err := (Config{ReloadInterval: time.Second}).Validate(); err == nil {
		t.Error("an interval without a file passed")
	}
	if err := (Config{}).Validate(); err != nil || (Config{}).Enabled() {
		t.Errorf("the empty config: %v", err)
	}
	var pe *os.PathError
	if _, err := Client(Config{APIKeyFile: filepath.Join(dir, "missing")}, nil); !errors.As(err, &pe) {
		t.Errorf("a missing file's error %v", err)
	}
}
