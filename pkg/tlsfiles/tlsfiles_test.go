package tlsfiles

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64 = 1

func newCA(t *testing.T, name string) *ca {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &ca{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf returns a certificate and key (PEM) signed by a, and its serial.
func (a *ca) leaf(t *testing.T, server bool) (certPEM, keyPEM []byte, sn int64) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "leaf"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), serial
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// setup writes a server pair and the client CA into a temp dir.
func setup(t *testing.T, root *ca) (Config, int64) {
	dir := t.TempDir()
	c := Config{CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem"), ClientCAFile: filepath.Join(dir, "ca.pem")}
	cert, key, sn := root.leaf(t, true)
	write(t, c.CertFile, cert)
	write(t, c.KeyFile, key)
	write(t, c.ClientCAFile, root.pem)
	return c.WithDefaults(), sn
}

// serve accepts on ln until it closes, completing each handshake and
// answering one byte; it returns a join.
func serve(t *testing.T, ln net.Listener) func() {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if err := c.(*tls.Conn).Handshake(); err == nil {
					_, _ = c.Write([]byte{1})
				}
			}()
		}
	}()
	return func() { ln.Close(); wg.Wait() }
}

// dial connects with the given client certificate (none when nil) and
// returns the server certificate's serial and any error, including the
// server refusing the client (seen at the first read in TLS 1.3).
func dial(addr string, roots *x509.CertPool, client *tls.Certificate) (int64, error) {
	cfg := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
	if client != nil {
		cfg.Certificates = []tls.Certificate{*client}
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		return 0, err
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
}

func TestMutualTLS(t *testing.T) {
	root := newCA(t, "root")
	cfg, sn := setup(t, root)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(raw, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer serve(t, ln)()
	roots := x509.NewCertPool()
	roots.AddCert(root.cert)

	cp, kp, _ := root.leaf(t, false)
	good, _ := tls.X509KeyPair(cp, kp)
	if got, err := dial(raw.Addr().String(), roots, &good); err != nil || got != sn {
		t.Fatalf("client with a certificate from the CA: serial %d err %v, want %d", got, err, sn)
	}
	if _, err := dial(raw.Addr().String(), roots, nil); err == nil {
		t.Fatal("client without a certificate was accepted")
	} else if !strings.Contains(err.Error(), "certificate required") {
		t.Logf("refusal: %v", err)
	}
	other := newCA(t, "other")
	op, ok, _ := other.leaf(t, false)
	stranger, _ := tls.X509KeyPair(op, ok)
	if _, err := dial(raw.Addr().String(), roots, &stranger); err == nil {
		t.Fatal("client with a certificate from another CA was accepted")
	}
}

func TestServerOnlyTLS(t *testing.T) {
	root := newCA(t, "root")
	cfg, sn := setup(t, root)
	cfg.ClientCAFile = ""
	raw, _ := net.Listen("tcp", "127.0.0.1:0")
	ln, err := Listen(raw, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer serve(t, ln)()
	roots := x509.NewCertPool()
	roots.AddCert(root.cert)
	if got, err := dial(raw.Addr().String(), roots, nil); err != nil || got != sn {
		t.Fatalf("TLS without client certificates: serial %d err %v", got, err)
	}
}

func TestPlaintextWhenDisabled(t *testing.T) {
	raw, _ := net.Listen("tcp", "127.0.0.1:0")
	defer raw.Close()
	ln, err := Listen(raw, Config{}.WithDefaults(), nil)
	if err != nil || ln != raw {
		t.Fatalf("disabled config wrapped the listener: %v %v", ln, err)
	}
}

func TestReloadOnChange(t *testing.T) {
	root := newCA(t, "root")
	cfg, sn1 := setup(t, root)
	cfg.ReloadInterval = time.Minute
	var errs []error
	f, err := New(cfg, func(err error) { errs = append(errs, err) })
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	f.now = func() time.Time { return now }
	raw, _ := net.Listen("tcp", "127.0.0.1:0")
	defer serve(t, tls.NewListener(raw, f.TLSConfig()))()
	roots := x509.NewCertPool()
	roots.AddCert(root.cert)
	cp, kp, _ := root.leaf(t, false)
	client, _ := tls.X509KeyPair(cp, kp)
	addr := raw.Addr().String()

	if got, err := dial(addr, roots, &client); err != nil || got != sn1 {
		t.Fatalf("first cert: %d %v", got, err)
	}
	// New files on disk; within the interval the old pair is still served.
	cert2, key2, sn2 := root.leaf(t, true)
	write(t, cfg.KeyFile, key2)
	write(t, cfg.CertFile, cert2)
	future := time.Now().Add(time.Second) // a distinct mtime even on coarse clocks
	_ = os.Chtimes(cfg.CertFile, future, future)
	_ = os.Chtimes(cfg.KeyFile, future, future)
	if got, err := dial(addr, roots, &client); err != nil || got != sn1 {
		t.Fatalf("within the reload interval: serial %d err %v, want the old %d", got, err, sn1)
	}
	now = now.Add(time.Minute)
	if got, err := dial(addr, roots, &client); err != nil || got != sn2 {
		t.Fatalf("after the interval: serial %d err %v, want the new %d", got, err, sn2)
	}
	if f.Loads() != 2 {
		t.Errorf("loads %d, want 2", f.Loads())
	}

	// A broken file keeps the previous pair and reports the error.
	write(t, cfg.CertFile, []byte("not a certificate"))
	later := future.Add(time.Second)
	_ = os.Chtimes(cfg.CertFile, later, later)
	now = now.Add(time.Minute)
	if got, err := dial(addr, roots, &client); err != nil || got != sn2 {
		t.Fatalf("after a broken reload: serial %d err %v, want the kept %d", got, err, sn2)
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "keeping the previous") {
		t.Errorf("reload errors %v", errs)
	}
}

func TestValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("disabled config: %v", err)
	}
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	write(t, junk, []byte("junk"))
	err := Config{ClientCAFile: junk, ReloadInterval: -1}.Validate()
	for _, want := range []string{"cert_file: required", "key_file: required", "reload_interval: must not be negative", "client_ca_file: " + junk + ": no PEM certificate"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
	err = Config{CertFile: filepath.Join(dir, "missing.pem"), KeyFile: junk}.Validate()
	if err == nil || !strings.HasPrefix(err.Error(), "cert_file: ") {
		t.Errorf("missing cert: %v", err)
	}
	if _, err := New(Config{CertFile: junk, KeyFile: junk}.WithDefaults(), nil); err == nil || errors.Is(err, os.ErrNotExist) {
		t.Errorf("New with junk files: %v", err)
	}
}
