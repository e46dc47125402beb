package helm_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
)

const (
	// kvrouteTLSDir and envoyTLSDir are where the chart mounts the
	// extproc server and client certificate Secrets.
	kvrouteTLSDir = "/etc/kvroute-tls/extproc/"
	envoyTLSDir   = "/etc/envoy-tls/extproc-client/"
)

// tlsFile matches a file path in Envoy's client certificate mount;
// envoyFile one in Envoy's ConfigMap mount (the SDS files).
var (
	tlsFile   = regexp.MustCompile(regexp.QuoteMeta(envoyTLSDir) + `[a-z.]+`)
	envoyFile = regexp.MustCompile(`/etc/envoy/[a-z.-]+`)
)

// writeTestCerts writes a CA (ca.crt) and a certificate it signed
// (tls.crt, tls.key) into dir, as a kubernetes.io/tls Secret mounts them.
func writeTestCerts(t *testing.T, dir string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "envoy"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caTmpl, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]*pem.Block{
		"ca.crt":  {Type: "CERTIFICATE", Bytes: caDER},
		"tls.crt": {Type: "CERTIFICATE", Bytes: der},
		"tls.key": {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// secretMount finds the Secret volume mounted at dir in container c.
func secretMount(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, dir string) (secret string, readOnly bool) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if filepath.Clean(m.MountPath) != filepath.Clean(dir) {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName, m.ReadOnly
			}
		}
		t.Errorf("%s: %s is mounted at %s but is not a Secret volume", c.Name, m.Name, dir)
	}
	return "", false
}

// checkTLS: with extproc TLS, kvroute's server Secret and Envoy's client
// Secret are mounted read-only, kvroute's config names files in its mount,
// and Envoy's ext_proc cluster speaks mutual TLS with the client Secret's
// files, checking kvroute's certificate against the CA and the SNI name.
// Without it, none of that is rendered. cert-manager objects exist exactly
// when asked for.
func checkTLS(t *testing.T, o *objects, want expect) {
	router := o.deployment(t, release)
	pod := &router.Spec.Template.Spec
	kv := mustContainer(t, pod, "kvroute")
	envoyPod := pod
	if !want.sidecar {
		envoyPod = &o.deployment(t, release+"-envoy").Spec.Template.Spec
	}
	ec := mustContainer(t, envoyPod, "envoy")
	cfg := checkKVRouteConfig(t, o.configData(t, release, "kvroute.yaml"))
	env := parseEnvoy(t, o.configData(t, release+"-envoy", "envoy.yaml"))
	cluster := env.cluster(t, "kvroute_extproc")

	serverSecret, serverRO := secretMount(t, pod, kv, kvrouteTLSDir)
	clientSecret, clientRO := secretMount(t, envoyPod, ec, envoyTLSDir)
	if !want.tls {
		if serverSecret != "" || clientSecret != "" {
			t.Errorf("TLS off, yet Secrets mounted: kvroute %q, envoy %q", serverSecret, clientSecret)
		}
		if tls, ok := cfg["tls"].(map[string]any); ok && tls["extproc"] != nil {
			t.Errorf("TLS off, yet kvroute config has tls.extproc %v", tls["extproc"])
		}
		if cluster["transport_socket"] != nil {
			t.Errorf("TLS off, yet the ext_proc cluster has a transport socket")
		}
	} else {
		if serverSecret == "" {
			t.Errorf("kvroute: no server certificate Secret mounted at %s", kvrouteTLSDir)
		}
		if !serverRO || !clientRO {
			t.Errorf("TLS Secrets not read-only: kvroute %v, envoy %v", serverRO, clientRO)
		}
		if clientSecret == "" || clientSecret == serverSecret {
			t.Errorf("envoy: client Secret %q (kvroute's is %q)", clientSecret, serverSecret)
		}
		for _, c := range pod.Containers {
			if c.Name != "kvroute" {
				if s, _ := secretMount(t, pod, &c, kvrouteTLSDir); s != "" {
					t.Errorf("%s also mounts kvroute's server key", c.Name)
				}
			}
		}
		ext := dig(t, cfg, "tls", "extproc").(map[string]any)
		for k, f := range map[string]string{"cert_file": "tls.crt", "key_file": "tls.key", "client_ca_file": "ca.crt"} {
			if ext[k] != kvrouteTLSDir+f {
				t.Errorf("tls.extproc.%s = %v, want %s", k, ext[k], kvrouteTLSDir+f)
			}
		}
		ts := dig(t, cluster, "transport_socket").(map[string]any)
		if ts["name"] != "envoy.transport_sockets.tls" ||
			dig(t, ts, "typed_config", "@type") != "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext" {
			t.Errorf("ext_proc transport socket %v", ts)
		}
		sni := dig(t, ts, "typed_config", "sni")
		wantSNI := "localhost"
		if !want.sidecar {
			wantSNI = release + "-extproc." + namespace + ".svc.cluster.local"
		}
		if sni != wantSNI {
			t.Errorf("ext_proc SNI %v, want %s", sni, wantSNI)
		}
		// The client certificate and the CA come through SDS files in
		// Envoy's ConfigMap that name the client Secret's files, and the
		// Secret's directory is watched: a renewed Secret reloads them.
		ctx := dig(t, ts, "typed_config", "common_tls_context")
		watched := strings.TrimSuffix(envoyTLSDir, "/")
		sds := func(sc any, wantName, wantFile string) {
			t.Helper()
			if dig(t, sc, "name") != wantName ||
				dig(t, sc, "sds_config", "path_config_source", "path") != "/etc/envoy/"+wantFile ||
				dig(t, sc, "sds_config", "path_config_source", "watched_directory", "path") != watched {
				t.Errorf("SDS config %v, want %s from /etc/envoy/%s watching %s", sc, wantName, wantFile, watched)
			}
		}
		sds(dig(t, ctx, "tls_certificate_sds_secret_configs", 0), "kvroute_extproc_client", "extproc-client-sds.yaml")
		sds(dig(t, ctx, "combined_validation_context", "validation_context_sds_secret_config"), "kvroute_extproc_ca", "extproc-ca-sds.yaml")
		if dig(t, ctx, "combined_validation_context", "default_validation_context", "match_typed_subject_alt_names", 0, "matcher", "exact") != sni {
			t.Errorf("ext_proc validation context %v", dig(t, ctx, "combined_validation_context"))
		}
		secret := func(file string) any {
			t.Helper()
			var doc map[string]any
			if err := yaml.Unmarshal(o.configData(t, release+"-envoy", file), &doc); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			return dig(t, doc, "resources", 0)
		}
		client, ca := secret("extproc-client-sds.yaml"), secret("extproc-ca-sds.yaml")
		if dig(t, client, "name") != "kvroute_extproc_client" ||
			dig(t, client, "tls_certificate", "certificate_chain", "filename") != envoyTLSDir+"tls.crt" ||
			dig(t, client, "tls_certificate", "private_key", "filename") != envoyTLSDir+"tls.key" {
			t.Errorf("Envoy's client certificate secret %v", client)
		}
		if dig(t, ca, "name") != "kvroute_extproc_ca" || dig(t, ca, "validation_context", "trusted_ca", "filename") != envoyTLSDir+"ca.crt" {
			t.Errorf("Envoy's CA secret %v", ca)
		}
		if n, _ := dig(t, map[string]any(env), "node", "id").(string); n == "" {
			t.Errorf("Envoy has no node id, which SDS requires")
		}
		if !slices.Equal(toStrings(dig(t, ctx, "alpn_protocols")), []string{"h2"}) {
			t.Errorf("ext_proc ALPN %v", dig(t, ctx, "alpn_protocols"))
		}
	}

	certs := map[string]map[string]any{}
	for _, c := range o.other["Certificate"] {
		certs[dig(t, c, "metadata", "name").(string)] = c
	}
	issuers := len(o.other["Issuer"])
	switch want.certManager {
	case "":
		if len(certs) != 0 || issuers != 0 {
			t.Errorf("cert-manager off, yet %d Certificates and %d Issuers", len(certs), issuers)
		}
		return
	case "chart-ca":
		if issuers != 2 || len(certs) != 3 || certs[release+"-ca"] == nil || dig(t, certs[release+"-ca"], "spec", "isCA") != true {
			t.Errorf("chart CA chain: %d Issuers, Certificates %v", issuers, keys(certs))
		}
	case "issuer":
		if issuers != 0 || len(certs) != 2 {
			t.Errorf("existing issuer: %d Issuers, Certificates %v", issuers, keys(certs))
		}
	}
	server, client := certs[release+"-extproc"], certs[release+"-envoy-client"]
	if server == nil || client == nil {
		t.Fatalf("Certificates %v, want %s-extproc and %s-envoy-client", keys(certs), release, release)
	}
	if dig(t, server, "spec", "secretName") != serverSecret || dig(t, client, "spec", "secretName") != clientSecret {
		t.Errorf("Certificates write %v and %v, pods mount %s and %s",
			dig(t, server, "spec", "secretName"), dig(t, client, "spec", "secretName"), serverSecret, clientSecret)
	}
	sni := dig(t, cluster, "transport_socket", "typed_config", "sni")
	if dns := dig(t, server, "spec", "dnsNames"); !slices.Contains(toStrings(dns), sni.(string)) {
		t.Errorf("server Certificate dnsNames %v lack the SNI %v", dns, sni)
	}
	if !slices.Equal(toStrings(dig(t, client, "spec", "usages")), []string{"client auth"}) ||
		!slices.Equal(toStrings(dig(t, server, "spec", "usages")), []string{"server auth"}) {
		t.Errorf("usages: server %v, client %v", dig(t, server, "spec", "usages"), dig(t, client, "spec", "usages"))
	}
	if ref := dig(t, server, "spec", "issuerRef", "name"); ref != dig(t, client, "spec", "issuerRef", "name") {
		t.Errorf("server and client certificates from different issuers: %v, %v", ref, dig(t, client, "spec", "issuerRef", "name"))
	}
}

func toStrings(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}
