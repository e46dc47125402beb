package enginehttp

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// DefaultReloadInterval is how often, at most, the key file is checked for
// a change.
const DefaultReloadInterval = 10 * time.Second

// Config is the engines' API key: the YAML section engine_auth.
type Config struct {
	// APIKeyFile holds the engines' API key (surrounding white space is
	// ignored). Empty: the engines ask for none, and no client is built.
	APIKeyFile string `yaml:"api_key_file"`
	// ReloadInterval bounds how often the file is checked for a change;
	// 0 means DefaultReloadInterval.
	ReloadInterval time.Duration `yaml:"reload_interval"`
}

// Enabled reports whether a key file is configured.
func (c Config) Enabled() bool { return c.APIKeyFile != "" }

// Validate checks the configuration without reading the file.
func (c Config) Validate() error {
	if c.ReloadInterval < 0 {
		return errors.New("engine_auth.reload_interval: must not be negative")
	}
	if c.ReloadInterval != 0 && !c.Enabled() {
		return errors.New("engine_auth.reload_interval: set without api_key_file")
	}
	return nil
}

// Client returns an HTTP client for the engines whose requests carry the
// key of c.APIKeyFile, read now (an unreadable or empty file is an error).
// onError, when not nil, hears of re-reads that failed (the previous key
// stays in use).
func Client(c Config, onError func(error)) (*http.Client, error) {
	if !c.Enabled() {
		return nil, errors.New("enginehttp: no api_key_file")
	}
	if c.ReloadInterval == 0 {
		c.ReloadInterval = DefaultReloadInterval
	}
	k := &keyFile{path: c.APIKeyFile, every: c.ReloadInterval, onError: onError, now: time.Now}
	if err := k.load(); err != nil {
		return nil, err
	}
	return &http.Client{Transport: &bearer{key: k, next: transport()}}, nil
}

// Plain returns an HTTP client for engines that ask for no key, on the
// same transport as Client's.
func Plain() *http.Client { return &http.Client{Transport: transport()} }

// transport is the pooled keep-alive transport engines are reached with
// (direct: no proxy).
func transport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
	}
}

// bearer adds the key to every request.
type bearer struct {
	key  *keyFile
	next http.RoundTripper
}

// RoundTrip sends a copy of req with the Authorization header set (a
// RoundTripper must not change the request it is given).
func (b *bearer) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.Header.Set("Authorization", "Bearer "+b.key.get())
	return b.next.RoundTrip(r)
}

// keyFile is the key and what the file looked like when it was read.
type keyFile struct {
	path    string
	every   time.Duration
	onError func(error)
	now     func() time.Time

	mu      sync.Mutex
	key     string
	size    int64
	mod     time.Time
	checked time.Time
}

// get returns the key, re-reading the file first if it is due and changed.
func (k *keyFile) get() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if now := k.now(); now.Sub(k.checked) >= k.every {
		k.checked = now
		if fi, err := os.Stat(k.path); err != nil {
			k.report(err)
		} else if fi.Size() != k.size || !fi.ModTime().Equal(k.mod) {
			if err := k.read(); err != nil {
				k.report(err)
			}
		}
	}
	return k.key
}

func (k *keyFile) load() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.checked = k.now()
	return k.read()
}

// read loads the file; k.mu is held. An empty key is an error and changes
// nothing.
func (k *keyFile) read() error {
	fi, err := os.Stat(k.path)
	if err != nil {
		return fmt.Errorf("enginehttp: api_key_file: %w", err)
	}
	b, err := os.ReadFile(k.path)
	if err != nil {
		return fmt.Errorf("enginehttp: api_key_file: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" {
		return fmt.Errorf("enginehttp: api_key_file %s is empty", k.path)
	}
	if strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("enginehttp: api_key_file %s: the key has a control character (one key, one line)", k.path)
	}
	k.key, k.size, k.mod = key, fi.Size(), fi.ModTime()
	return nil
}

func (k *keyFile) report(err error) {
	if k.onError != nil {
		k.onError(err)
	}
}
