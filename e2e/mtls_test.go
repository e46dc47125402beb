//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"gopkg.in/yaml.v3"

	"github.com/kvroute/kvroute/pkg/testbed"
)

// mtlsTemplate returns the repository root and envoy/envoy-mtls.yaml.
func mtlsTemplate(t *testing.T) (string, []byte) {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	mtls, err := os.ReadFile(filepath.Join(root, "envoy", "envoy-mtls.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return root, mtls
}

// TestExtProcMutualTLS: Envoy (envoy/envoy-mtls.yaml) reaches kvroute's
// ext_proc listener over mutual TLS with certificates from hack/certs.sh
// and kvroute routes by cache; a client without a certificate, or in
// plaintext, is refused.
func TestExtProcMutualTLS(t *testing.T) {
	root, mtls := mtlsTemplate(t)
	sameExceptTLS(t, envoyTmpl, mtls)

	dir := t.TempDir()
	if out, err := exec.Command("bash", filepath.Join(root, "hack", "certs.sh"), dir).CombinedOutput(); err != nil {
		t.Fatalf("hack/certs.sh: %v\n%s", err, out)
	}
	tmpl := bytes.ReplaceAll(mtls, []byte("/etc/kvroute/tls"), []byte(dir))
	c := newCluster(t, clusterOpts{engines: 2, seed: 300, envoy: tmpl,
		kvExtra: fmt.Sprintf("tls:\n  extproc:\n    cert_file: %s/server.pem\n    key_file: %s/server-key.pem\n    client_ca_file: %s/ca.pem\n", dir, dir, dir),
	})
	// Envoy's gRPC health checks reach kvroute over mutual TLS.
	c.waitExtProcHealthy(true)

	// Routing through the mTLS ext_proc stream: the second request follows
	// the first one's cache (fail-open round robin would not, and serves no
	// cached tokens on the other engine).
	ctx := t.Context()
	msgs := []message{{Role: "user", Content: prompt("mtls", 150)}}
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": msgs, "max_tokens": 2})
	first := c.chat(ctx, msgs, 2, nil)
	if first.err != nil || first.status != 200 {
		t.Fatalf("first request: %d %v %s", first.status, first.err, first.body)
	}
	for i := range 3 {
		c.waitPick(t, body, first.upstream)
		r := c.chat(ctx, msgs, 2, nil)
		if r.err != nil || r.status != 200 || r.upstream != first.upstream || r.cached == 0 {
			t.Fatalf("request %d over mTLS ext_proc: %d %v upstream %s (want %s) cached %d", i, r.status, r.err, r.upstream, first.upstream, r.cached)
		}
	}
	if n := counter(t, c, "cluster.kvroute_extproc.ssl.handshake"); n == 0 {
		t.Errorf("Envoy made no TLS handshake to kvroute")
	}

	// Direct clients of the ext_proc port.
	addr := fmt.Sprintf("127.0.0.1:%d", c.extprocPort)
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	pool.AppendCertsFromPEM(caPEM)
	check := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
		return err
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := check(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{cert}})); err != nil {
		t.Errorf("client with the CA's certificate: %v", err)
	}
	if err := check(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost"})); err == nil {
		t.Error("client without a certificate was served")
	} else {
		t.Logf("no certificate: %v", err)
	}
	if err := check(insecure.NewCredentials()); err == nil {
		t.Error("plaintext client was served")
	}
}

// counter reads one Envoy admin stat by name (0 when absent).
func counter(t *testing.T, c *cluster, name string) int {
	t.Helper()
	code, b, err := testbed.Get(t.Context(), c.envoy.AdminURL("/stats?format=json&filter=^"+name+"$"))
	if err != nil || code != 200 {
		t.Fatalf("envoy stats: %d %v", code, err)
	}
	var out struct {
		Stats []struct {
			Name  string `json:"name"`
			Value int    `json:"value"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("envoy stats: %v: %s", err, b)
	}
	for _, s := range out.Stats {
		if s.Name == name {
			return s.Value
		}
	}
	return 0
}

// sameExceptTLS fails unless the mTLS variant is the plain config plus the
// ext_proc cluster's transport socket.
func sameExceptTLS(t *testing.T, plain, mtls []byte) {
	t.Helper()
	var a, b map[string]any
	if err := yaml.Unmarshal(plain, &a); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(mtls, &b); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, cl := range b["static_resources"].(map[string]any)["clusters"].([]any) {
		m := cl.(map[string]any)
		if m["name"] == testbed.ExtProcCluster && m["transport_socket"] != nil {
			delete(m, "transport_socket")
			found = true
		}
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !found || !bytes.Equal(ja, jb) {
		t.Fatalf("envoy/envoy-mtls.yaml must be envoy/envoy.yaml plus the %s transport socket (found %v)", testbed.ExtProcCluster, found)
	}
}
