// Package e2e holds end-to-end tests (build tag e2e) that start real Envoy,
// kvroute and enginesim processes on loopback and drive them over HTTP.
package e2e
