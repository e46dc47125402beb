package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// DefaultReloadInterval bounds how often the files are checked for change.
const DefaultReloadInterval = 10 * time.Second

// Config is one listener's TLS. Empty CertFile means plaintext.
type Config struct {
	// CertFile and KeyFile are the server certificate chain and its key
	// (PEM). Both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile, when set, turns on mutual TLS: clients must present a
	// certificate signed by one of these CAs (PEM bundle).
	ClientCAFile string `yaml:"client_ca_file"`
	// ReloadInterval is how often a handshake may check the files for
	// change. Default DefaultReloadInterval.
	ReloadInterval time.Duration `yaml:"reload_interval"`
}

// Enabled says whether c asks for TLS.
func (c Config) Enabled() bool { return c.CertFile != "" || c.KeyFile != "" || c.ClientCAFile != "" }

// WithDefaults returns c with unset fields defaulted.
func (c Config) WithDefaults() Config {
	if c.ReloadInterval == 0 {
		c.ReloadInterval = DefaultReloadInterval
	}
	return c
}

// Validate reports every problem, each prefixed with its field name. A
// disabled config is valid. Files are loaded once to check them.
func (c Config) Validate() error {
	if !c.Enabled() {
		return nil
	}
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.CertFile == "" {
		bad("cert_file", "required when TLS is configured")
	}
	if c.KeyFile == "" {
		bad("key_file", "required when TLS is configured")
	}
	if c.ReloadInterval < 0 {
		bad("reload_interval", "must not be negative")
	}
	if c.CertFile != "" && c.KeyFile != "" {
		if _, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile); err != nil {
			bad("cert_file", "%v", err)
		}
	}
	if c.ClientCAFile != "" {
		if _, err := loadPool(c.ClientCAFile); err != nil {
			bad("client_ca_file", "%v", err)
		}
	}
	return errors.Join(errs...)
}

func loadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return p, nil
}

// stamp identifies a file's version.
type stamp struct {
	size int64
	mod  time.Time
}

func stat(path string) stamp {
	if path == "" {
		return stamp{}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{size: -1}
	}
	return stamp{fi.Size(), fi.ModTime()}
}

// Files serves c's certificates, reloading them when they change.
type Files struct {
	cfg     Config
	onError func(error)
	now     func() time.Time

	mu      sync.Mutex
	current *tls.Config
	stamps  [3]stamp
	checked time.Time
	loads   int
}

// New loads c's files (c must be enabled and defaulted). onError, if not
// nil, hears about failed reloads.
func New(c Config, onError func(error)) (*Files, error) {
	f := &Files{cfg: c, onError: onError, now: time.Now}
	if err := f.load(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *Files) stampsNow() [3]stamp {
	return [3]stamp{stat(f.cfg.CertFile), stat(f.cfg.KeyFile), stat(f.cfg.ClientCAFile)}
}

// load reads every file and swaps the served config; f.mu held or f not
// yet shared.
func (f *Files) load() error {
	st := f.stampsNow()
	cert, err := tls.LoadX509KeyPair(f.cfg.CertFile, f.cfg.KeyFile)
	if err != nil {
		return err
	}
	tc := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2", "http/1.1"},
	}
	if f.cfg.ClientCAFile != "" {
		pool, err := loadPool(f.cfg.ClientCAFile)
		if err != nil {
			return err
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	f.current, f.stamps, f.loads = tc, st, f.loads+1
	return nil
}

// config returns the config to serve, reloading first when the interval
// passed and a file changed.
func (f *Files) config() *tls.Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now := f.now(); now.Sub(f.checked) >= f.cfg.ReloadInterval {
		f.checked = now
		if f.stampsNow() != f.stamps {
			if err := f.load(); err != nil && f.onError != nil {
				f.onError(fmt.Errorf("tls reload (keeping the previous certificates): %w", err))
			}
		}
	}
	return f.current
}

// Loads counts successful loads (the first included).
func (f *Files) Loads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loads
}

// TLSConfig is the server config: every handshake gets the current files'
// certificates and client CAs.
func (f *Files) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return f.config(), nil
		},
	}
}

// Listen returns ln serving TLS from c when c is enabled, ln itself
// otherwise. c must be defaulted.
func Listen(ln net.Listener, c Config, onError func(error)) (net.Listener, error) {
	if !c.Enabled() {
		return ln, nil
	}
	f, err := New(c, onError)
	if err != nil {
		return nil, err
	}
	return tls.NewListener(ln, f.TLSConfig()), nil
}
