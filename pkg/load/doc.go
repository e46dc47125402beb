// Package load holds the per-replica load view: in-flight prefill and decode
// blocks and requests from the request lifecycle, scraped engine metrics, and
// health. Readers get immutable snapshots; writers never block them.
package load
