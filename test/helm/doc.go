// Package helm tests the Helm chart in charts/kvroute with Helm's Go SDK (no
// helm binary): lint, schema validation of good and bad values, and the
// rendered objects for the default values, the vLLM fleet example and the
// other modes (Envoy as its own Deployment, DNS discovery, InferencePool,
// fail-closed). Rendered Envoy configs are checked with the real Envoy
// binary (envoy --mode validate, installed by hack/install-deps.sh).
//
// The package holds tests only; nothing imports it. The kvroute config
// loader lives in package main (cmd/kvroute), so the rendered kvroute.yaml
// is checked against the keys of examples/kvroute.yaml and, for the replica
// sources, against the fields of pkg/discovery's source configs.
package helm
