package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestTLSConfigErrorsNameTheirField(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	_, err := ParseConfig([]byte("replicas:\n  static:\n  - {address: 10.0.0.1:8000, model: m}\n" +
		"tls:\n  extproc: {client_ca_file: " + missing + "}\n  metrics: {cert_file: " + missing + ", key_file: " + missing + ", reload_interval: -1s}\n"))
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"tls.extproc.cert_file: required", "tls.extproc.key_file: required", "tls.extproc.client_ca_file: ", "tls.metrics.cert_file: ", "tls.metrics.reload_interval: must not be negative"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "tls.admin") {
		t.Errorf("admin has no TLS configured, yet: %v", err)
	}
}
