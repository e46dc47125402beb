//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/pkg/testbed"
)

// TestExtProcCertRotation rotates the mutual-TLS certificates of the
// ext_proc connection under open-loop load, both sides, without a restart
// and without a failed request, the way a CA rotation is done: kvroute
// first trusts the old and the new client CA, Envoy's client certificate
// is replaced by one from the new CA (Envoy reloads it through file-based
// SDS, envoy/envoy-mtls.yaml), kvroute then trusts the new CA alone, and
// kvroute's server certificate is replaced (pkg/tlsfiles reloads it).
//
// Envoy's gRPC health checks open a new connection each time, so after
// the rotation each successful check is a new handshake in which Envoy
// presented the new client certificate (kvroute accepts no other by then)
// and accepted kvroute's new server certificate. No check may fail
// during the rotation, and every request of the load is a complete 200.
func TestExtProcCertRotation(t *testing.T) {
	_, mtls := mtlsTemplate(t)
	dir := t.TempDir()
	serverCA := newTestCA(t, "server CA")
	clientCA1 := newTestCA(t, "client CA 1")
	server1 := serverCA.issue(t, "kvroute", true)
	client1 := clientCA1.issue(t, "envoy", false)
	put := func(name string, data []byte) { t.Helper(); putFile(t, dir, name, data) }
	put("ca.pem", serverCA.pem)
	put("client-ca.pem", clientCA1.pem)
	server1.write(t, dir, "server")
	client1.write(t, dir, "client")
	put("envoy-client-sds.yaml", fmt.Appendf(nil, "resources:\n- \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  name: kvroute_extproc_client\n  tls_certificate:\n    certificate_chain: {filename: %s/client.pem}\n    private_key: {filename: %s/client-key.pem}\n", dir, dir))
	put("envoy-ca-sds.yaml", fmt.Appendf(nil, "resources:\n- \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  name: kvroute_extproc_ca\n  validation_context:\n    trusted_ca: {filename: %s/ca.pem}\n", dir))

	c := newCluster(t, clusterOpts{engines: 2, seed: 500,
		envoy:   bytes.ReplaceAll(mtls, []byte("/etc/kvroute/tls"), []byte(dir)),
		kvExtra: fmt.Sprintf("tls:\n  extproc:\n    cert_file: %s/server.pem\n    key_file: %s/server-key.pem\n    client_ca_file: %s/client-ca.pem\n    reload_interval: 200ms\n", dir, dir, dir),
	})
	c.waitExtProcHealthy(true)
	addr := fmt.Sprintf("127.0.0.1:%d", c.extprocPort)

	load := startOpenLoad(c, 50*time.Millisecond, 300)
	stopped := false
	defer func() {
		if !stopped {
			load.Stop(t)
		}
	}()
	waitFor(t, 60*time.Second, "kvroute to route 20 requests over mTLS", func() bool {
		n, err := decisions(c)
		return err == nil && n >= 20
	})
	hcFail0 := counter(t, c, "cluster.kvroute_extproc.health_check.failure")
	if !envoyPresents(t, c, client1.serial) {
		t.Fatalf("Envoy does not present the first client certificate (%x)", client1.serial)
	}

	// 1. kvroute trusts both client CAs.
	clientCA2 := newTestCA(t, "client CA 2")
	client2 := clientCA2.issue(t, "envoy", false)
	put("client-ca.pem", append(append([]byte(nil), clientCA1.pem...), clientCA2.pem...))
	waitFor(t, 30*time.Second, "kvroute to accept a client of the new CA", func() bool {
		return healthOver(addr, serverCA, client2) == nil
	})
	// 2. Envoy's client certificate from the new CA (SDS reload).
	client2.write(t, dir, "client")
	waitFor(t, 30*time.Second, "Envoy to load the new client certificate", func() bool {
		return envoyPresents(t, c, client2.serial)
	})
	// 3. kvroute trusts the new client CA alone.
	put("client-ca.pem", clientCA2.pem)
	waitFor(t, 30*time.Second, "kvroute to refuse a client of the old CA", func() bool {
		return healthOver(addr, serverCA, client1) != nil
	})
	// 4. kvroute's new server certificate.
	server2 := serverCA.issue(t, "kvroute", true)
	server2.write(t, dir, "server")
	waitFor(t, 30*time.Second, "kvroute to present the new server certificate", func() bool {
		return peerSerial(addr, serverCA, client2).Cmp(server2.serial) == 0
	})

	// New handshakes from Envoy after the rotation: every health check
	// connects anew; kvroute accepts only the new client certificate and
	// presents only the new server certificate by now.
	hcOK, hs, dec := counter(t, c, "cluster.kvroute_extproc.health_check.success"), counter(t, c, "cluster.kvroute_extproc.ssl.handshake"), mustDecisions(t, c)
	waitFor(t, 60*time.Second, "3 health checks over new handshakes after the rotation", func() bool {
		return counter(t, c, "cluster.kvroute_extproc.health_check.success") >= hcOK+3
	})
	waitFor(t, 60*time.Second, "kvroute to route 20 more requests", func() bool { return mustDecisions(t, c) >= dec+20 })
	hsAfter := counter(t, c, "cluster.kvroute_extproc.ssl.handshake")
	if hsAfter < hs+3 {
		t.Errorf("Envoy made %d TLS handshakes to kvroute after the rotation, want at least one per health check (3)", hsAfter-hs)
	}
	if n := counter(t, c, "cluster.kvroute_extproc.health_check.failure"); n != hcFail0 {
		t.Errorf("%d health checks failed during the rotation", n-hcFail0)
	}
	outs := load.Stop(t)
	stopped = true
	bad := failures(outs)
	t.Logf("certificate rotation under load: %d requests, %d not a complete 200; Envoy TLS handshakes to kvroute after the rotation %d, health-check failures %d, ext_proc failure_mode_allowed %d",
		len(outs), len(bad), hsAfter-hs, counter(t, c, "cluster.kvroute_extproc.health_check.failure")-hcFail0, counter(t, c, "http.inference.ext_proc.failure_mode_allowed"))
	for i, o := range bad {
		if i == 20 {
			break
		}
		t.Errorf("failed: %v", o)
	}
}

func mustDecisions(t *testing.T, c *cluster) float64 {
	t.Helper()
	n, err := decisions(c)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// envoyPresents reports whether Envoy's loaded certificates (admin /certs)
// include one with this serial number.
func envoyPresents(t *testing.T, c *cluster, serial *big.Int) bool {
	t.Helper()
	code, b, err := testbed.Get(t.Context(), c.envoy.AdminURL("/certs"))
	if err != nil || code != 200 {
		t.Fatalf("envoy /certs: %d %v", code, err)
	}
	return strings.Contains(strings.ToLower(string(b)), fmt.Sprintf("%x", serial))
}

// healthOver runs a gRPC health check on a new mutual-TLS connection with
// the given client certificate.
func healthOver(addr string, ca *testCA, client *testLeaf) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS(ca, client))))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
	return err
}

// peerSerial is the serial of the server certificate on a new handshake
// (zero when the handshake fails).
func peerSerial(addr string, ca *testCA, client *testLeaf) *big.Int {
	cfg := clientTLS(ca, client)
	cfg.NextProtos = []string{"h2"}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return new(big.Int)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber
}

func clientTLS(ca *testCA, client *testLeaf) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return &tls.Config{RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{client.pair}}
}

// putFile writes name in dir by rename, as a rotation does (a reader
// never sees half a file; Envoy's directory watch sees the move).
func putFile(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// testCA is a throwaway ECDSA CA.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

// testLeaf is a certificate issued by a testCA.
type testLeaf struct {
	serial          *big.Int
	certPEM, keyPEM []byte
	pair            tls.Certificate
}

var serials = big.NewInt(time.Now().UnixNano())

func nextSerial() *big.Int { return serials.Add(serials, big.NewInt(1)) }

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: new(big.Int).Set(nextSerial()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a server (SANs localhost, 127.0.0.1) or client certificate.
func (ca *testCA) issue(t *testing.T, cn string, server bool) *testLeaf {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: new(big.Int).Set(nextSerial()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames, tmpl.IPAddresses = []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	l := &testLeaf{
		serial:  tmpl.SerialNumber,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}
	if l.pair, err = tls.X509KeyPair(l.certPEM, l.keyPEM); err != nil {
		t.Fatal(err)
	}
	return l
}

// write puts <name>.pem and <name>-key.pem into dir, key first.
func (l *testLeaf) write(t *testing.T, dir, name string) {
	t.Helper()
	putFile(t, dir, name+"-key.pem", l.keyPEM)
	putFile(t, dir, name+".pem", l.certPEM)
}
